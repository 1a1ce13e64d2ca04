"""Launch anywhere: detection for every launcher, real multi-process jobs, and `compare`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import launch

from .conftest import BIN, CLI, REPO, horovodrun, launcher_env, mpirun, run_cmd, run_ok, torchrun

TINY = ["--workload", "mlp", "--epochs", "1", "--steps-per-epoch", "4", "--warmup-steps", "1", "--quiet"]


def meta_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


# --- detection from the environment alone -------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
          "GROUP_RANK": "1", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"},
         launch.LaunchInfo("torchrun", 3, 1, 4, 2, 1, "h0", 1234)),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
          "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
         launch.LaunchInfo("mpirun", 1, 1, 2, 2, detail="mpi")),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "NCCL_SOCKET_IFNAME": "lo",
          "OMPI_MCA_btl_tcp_if_include": "lo"},
         launch.LaunchInfo("horovodrun", 0, 0, 2, 1, detail="mpi")),
        ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
          "HOROVOD_CROSS_RANK": "0"},
         launch.LaunchInfo("horovodrun", 1, 1, 2, 2, 0, detail="gloo")),
        ({"PMI_RANK": "2", "PMI_SIZE": "4"}, launch.LaunchInfo("mpirun", 2, 0, 4, 1, detail="mpi")),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
          "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_ID": "42",
          "SLURM_JOB_NODELIST": "gpu[07-10]"},
         launch.LaunchInfo("srun", 5, 1, 8, 2, 2, "gpu07", 15042)),
        # an sbatch script itself has SLURM_PROCID but no step: a plain single process
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n1"}, launch.LaunchInfo("python")),
        ({}, launch.LaunchInfo("python")),
    ],
)  # fmt: skip
def test_detect(env: dict[str, str], expected: launch.LaunchInfo) -> None:
    assert launch.detect(env) == expected


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
        ("a[1-2],b5,c[08-09]-ib", ["a1", "a2", "b5", "c08-ib", "c09-ib"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_expand_slurm_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert launch.expand_slurm_nodelist(nodelist) == hosts


# --- real jobs ---------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_both_backends_under_mpirun(tmp_path, backend: str, horovod_available) -> None:
    run_ok([*mpirun(2), "run", "--backend", backend, *TINY, "--out", str(tmp_path), "--run-id", "r"])
    meta = meta_of(tmp_path / "r")
    assert (meta["launcher"], meta["world_size"], meta["status"]) == ("mpirun", 2, "completed")
    if backend == "horovod":
        assert meta["knobs"]["controller"] == "mpi"


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("controller", "expected"), [("--gloo", "gloo"), ("--mpi", "mpi")])
def test_horovodrun_controllers(tmp_path, controller: str, expected: str, horovod_available) -> None:
    run_ok([*horovodrun(2, controller), "run", "--backend", "horovod", *TINY, "--out", str(tmp_path), "--run-id", "r"])
    meta = meta_of(tmp_path / "r")
    assert (meta["launcher"], meta["launcher_detail"], meta["world_size"]) == ("horovodrun", expected, 2)
    assert meta["knobs"]["controller"] == expected and meta["status"] == "completed"


@pytest.mark.timeout(180)
def test_ddp_under_srun_environment(tmp_path) -> None:
    """Two ranks started the way srun starts them: only SLURM_* variables say who is who."""
    port = launch.free_port()
    procs = []
    for rank in range(2):
        env = launcher_env(
            SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS="2", SLURM_STEP_ID="0",
            SLURM_JOB_ID="7", SLURM_NODEID="0", SLURM_TASKS_PER_NODE="2", SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=str(port),
        )  # fmt: skip
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
    assert "backend 'horovod' cannot run under torchrun; launch it with one of: horovodrun, mpirun, python" in (
        proc.stderr
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_single_refuses_more_than_one_process(tmp_path) -> None:
    proc = run_cmd([*torchrun(2), "run", "--backend", "single", *TINY, "--out", str(tmp_path)], timeout=100)
    assert proc.returncode != 0 and "backend 'single' runs one process" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(240)
def test_two_torchrun_agents_form_one_job(tmp_path) -> None:
    """Two torchrun agents on localhost, as on two machines: c10d rendezvous, 2 nodes × 2 ranks."""
    port = launch.free_port()
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


def _shadow_horovod(tmp_path: Path) -> str:
    """A PYTHONPATH under which `import horovod` fails, as on a machine without Horovod."""
    (tmp_path / "shadow" / "horovod").mkdir(parents=True)
    (tmp_path / "shadow" / "horovod" / "__init__.py").write_text("raise ImportError('no horovod here')\n")
    return f"{tmp_path / 'shadow'}:{REPO}"


@pytest.mark.timeout(240)
def test_compare_survives_a_failing_backend(tmp_path) -> None:
    cmd = [
        str(BIN / "distbench"),
        "compare",
        "--repeats",
        "1",
        "--workload",
        "mlp",
        "--steps-per-epoch",
        "4",
        "--warmup-steps",
        "1",
        "--quiet",
        "--out",
        str(tmp_path / "out"),
        "--run-id",
        "cmp",
    ]
    proc = run_cmd(cmd, timeout=200, PYTHONPATH=_shadow_horovod(tmp_path))
    assert proc.returncode != 0, proc.stdout
    comparison = pd.read_csv(tmp_path / "out" / "cmp" / "comparison.csv")
    status = dict(zip(comparison.backend, comparison.status, strict=True))
    assert status == {"ddp": "completed", "horovod": "failed"}
    assert "FAILED" in proc.stdout and "ddp" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path / "out" / "cmp")


@pytest.mark.timeout(300)
def test_compare_both_backends_under_mpirun(tmp_path, horovod_available) -> None:
    cmd = [
        str(BIN / "distbench"),
        "compare",
        "--launcher",
        "mpirun",
        "--repeats",
        "2",
        "--workload",
        "mlp",
        "--steps-per-epoch",
        "6",
        "--warmup-steps",
        "1",
        "--quiet",
        "--out",
        str(tmp_path),
        "--run-id",
        "cmp",
    ]
    proc = run_ok(cmd, timeout=280)
    comparison = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert list(comparison.backend) == ["ddp", "horovod", "ddp", "horovod"]  # interleaved
    assert (comparison.status == "completed").all() and (comparison.samples_per_s > 0).all()
    assert {meta_of(tmp_path / "cmp" / r)["launcher"] for r in comparison.run_id} == {"mpirun"}
    assert comparison.command.str.startswith("mpirun -np 2").all()
    assert meta_of(tmp_path / "cmp" / "ddp-r0")["config"]["steps_per_epoch"] == 6  # options pass through
    assert "samples/s" in proc.stdout and "loss curves: max abs difference" in proc.stdout
    agreement = float(proc.stdout.split("between backends")[1].split()[0])
    assert agreement < 1e-5
