"""Launch anywhere: detection for every launcher and real multi-process jobs (`compare`: test_compare.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.launch import rendezvous
from tests.helpers import BIN, CLI, REPO, horovodrun, launcher_env, mpirun, run_cmd, run_ok, torchrun

TINY = ["--workload", "mlp", "--epochs", "1", "--steps-per-epoch", "4", "--warmup-steps", "1", "--quiet"]


def meta_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


# --- real jobs ---------------------------------------------------------------------------------------
# compare's own jobs (ddp@torchrun, ddp@mpirun, horovod@gloo, horovod@mpi) are launched, and their launcher
# and controller read back, in test_placement.py::test_compare_runs_every_launcher_unbound; here the launches
# compare does not make.
@pytest.mark.timeout(240)
def test_horovod_under_plain_mpirun(tmp_path, horovod_available) -> None:
    run_ok([*mpirun(2), "run", "--backend", "horovod", *TINY, "--out", str(tmp_path), "--run-id", "r"])
    meta = meta_of(tmp_path / "r")
    assert (meta["launcher"], meta["world_size"], meta["status"]) == ("mpirun", 2, "completed")
    assert meta["knobs"]["controller"] == "mpi"


@pytest.mark.timeout(180)
def test_ddp_under_horovodrun_mpi(tmp_path) -> None:
    """horovodrun --mpi starts the ranks through mpirun: DDP forms its group over MPI's rendezvous."""
    run_ok([*horovodrun(2, "--mpi"), "run", "--backend", "ddp", *TINY, "--out", str(tmp_path), "--run-id", "r"], 150)
    meta = meta_of(tmp_path / "r")
    assert (meta["launcher"], meta["launcher_detail"], meta["world_size"]) == ("horovodrun", "mpi", 2)
    assert meta["status"] == "completed" and meta["knobs"]["dist_backend"] == "gloo"


@pytest.mark.timeout(180)
def test_ddp_under_srun_environment(tmp_path) -> None:
    """Two ranks started the way srun starts them: only SLURM_* variables say who is who."""
    port = rendezvous.free_port()
    procs = []
    for rank in range(2):
        env = launcher_env(
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS="2",
            SLURM_STEP_ID="0",
            SLURM_JOB_ID="7",
            SLURM_NODEID="0",
            SLURM_TASKS_PER_NODE="2",
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=str(port),
        )
        cmd = [*CLI, "run", "--backend", "ddp", *TINY, "--out", str(tmp_path), "--run-id", "srun"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [p.communicate(timeout=150) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    meta = meta_of(tmp_path / "srun")
    assert (meta["launcher"], meta["world_size"], meta["status"]) == ("srun", 2, "completed")


@pytest.mark.timeout(120)
def test_wrong_launcher_stops_before_any_work(tmp_path) -> None:
    cmd = [*torchrun(1), "run", "--backend", "horovod", *TINY, "--out", str(tmp_path)]
    proc = run_cmd(cmd, timeout=100)
    assert proc.returncode != 0
    hint = "launch it with one of: horovodrun, mpirun, srun --mpi=pmix, python"
    assert f"backend 'horovod' cannot run under torchrun; {hint}" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_single_refuses_more_than_one_process(tmp_path) -> None:
    proc = run_cmd([*torchrun(2), "run", "--backend", "single", *TINY, "--out", str(tmp_path)], timeout=100)
    assert proc.returncode != 0 and "backend 'single' runs one process" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(240)
def test_two_torchrun_agents_form_one_job(tmp_path) -> None:
    """Two torchrun agents on localhost, as on two machines: c10d rendezvous, 2 nodes × 2 ranks."""
    port = rendezvous.free_port()
    agents = []
    for node in range(2):
        cmd = [
            str(BIN / "torchrun"),
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{port}",
            "--rdzv-id=distbench-test",
            "-m",
            "benchmarks.cli",
            "run",
            "--backend",
            "ddp",
            *TINY,
            "--out",
            str(tmp_path),
            "--run-id",
            "2n",
        ]
        agents.append(
            subprocess.Popen(cmd, cwd=REPO, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    outputs = [a.communicate(timeout=200) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], outputs
    meta = meta_of(tmp_path / "2n")
    assert meta["world_size"] == 4 and meta["local_world_size"] == 2
    assert sorted(h["node_rank"] for h in meta["hosts"]) == [0, 0, 1, 1]
    timing = pd.read_csv(tmp_path / "2n" / "timing.csv")
    assert sorted(timing["rank"].unique()) == [0, 1, 2, 3]
