"""Under a real Slurm (tests/slurm_cluster.py: munged, slurmctld and slurmd on this machine, one node): every
backend and the allreduce bench under `srun`, bad input said once, and compare inside an allocation — each
job a step — decided, stopped by Ctrl-C or by `scancel` of its step, and run from the docs' sbatch script.

After the module, nothing of the cluster runs: the session fixture stops the daemons and counts what is left.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.helpers import BIN, CLI, REPO, launcher_env, no_rank_traceback, one_in_make_test, our_lines
from tests.slurm_cluster import SlurmCluster

RUN = ["--workload", "mlp", "--epochs", "1", "--steps-per-epoch", "6", "--warmup-steps", "1", "--quiet"]
COMPARE_FAST = ["--workload", "mlp", "--steps-per-epoch", "6", "--warmup-steps", "1", "--repeats", "2", "--quiet"]
LONG = ["--workload", "linear", "--epochs", "60", "--warmup-steps", "1", "--compute-baseline-steps", "0", "--quiet"]
MPI = {"ddp": [], "fsdp": [], "horovod": ["--mpi=pmix"], "deepspeed": []}
EVERY_SRUN = "ddp@srun,fsdp@srun,horovod@srun"


def _run(slurm: SlurmCluster, cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=slurm.env(launcher_env()))


def _meta(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _ranks_of(marker: str) -> list[str]:
    return [
        " ".join(p.info["cmdline"] or [])
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or [])
    ]


# A plain run under srun: `make test` runs horovod (MPI through pmix) and deepspeed (srun nowhere else); ddp and
# fsdp run under srun in `make test` as the sbatch compare's steps, and as plain runs here in `make test-all`.
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "backend", [pytest.param(b, marks=pytest.mark.full_matrix) for b in ("ddp", "fsdp")] + ["horovod", "deepspeed"]
)
def test_every_backend_runs_under_srun(tmp_path, slurm, backend: str, horovod_available) -> None:
    srun = ["srun", "-n", "2", *MPI[backend]]
    stage = ["--zero-stage", "2"] if backend == "deepspeed" else []  # ZeRO's optimizer warns (untested SGD)
    argv = [*srun, *CLI, "run", "--backend", backend, *RUN, *stage, "--out", str(tmp_path), "--run-id", "r"]
    proc = _run(slurm, argv, 100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = _meta(tmp_path / "r")
    assert (meta["launcher"], meta["world_size"], meta["status"]) == ("srun", 2, "completed")
    assert meta["launcher_detail"] == ("pmix" if backend == "horovod" else "")
    # srun's own placement, recorded: task/affinity binds each task to a core unless told otherwise.
    assert meta["placement"]["srun_cpu_bind"].startswith("quiet,mask_cpu:"), meta["placement"]
    assert [r["cpu_count"] for r in meta["placement"]["per_rank"]] == [1, 1]
    if backend == "horovod":
        assert meta["knobs"]["controller"] == "mpi"
    if backend == "deepspeed":
        assert meta["knobs"]["zero_stage"] == 2 and meta["knobs"]["config"]["zero_optimization"]["stage"] == 2
        # stdout is the run directory alone (DeepSpeed's own "… built successfully", once a rank, is left out, and
        # its logger's warnings go to stderr); its op is said once, by rank 0, on stderr
        assert proc.stdout.strip() == str(tmp_path / "r"), proc.stdout
        assert proc.stderr.count("deepspeed: its shared-memory op ") == 1, proc.stderr
    assert len(pd.read_csv(tmp_path / "r" / "timing.csv")) > 0


@pytest.mark.timeout(120)
# Horovod's, the one through srun's MPI plugin, in make test; torch's and mpi4py's under srun in make test-all.
@pytest.mark.parametrize("impl", one_in_make_test(["torch", "horovod", "mpi4py"], "horovod"))
def test_allreduce_bench_runs_under_srun(tmp_path, slurm, impl: str, horovod_available) -> None:
    srun = ["srun", "-n", "2", *([] if impl == "torch" else ["--mpi=pmix"])]
    cmd = [*srun, *CLI, "allreduce", "--impl", impl, "--sizes", "1k,64k", "--iters", "3", "--warmup", "1"]
    proc = _run(slurm, [*cmd, "--out", str(tmp_path)], 100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [csv] = tmp_path.rglob("allreduce.csv")
    table = pd.read_csv(csv)
    assert set(table.launcher) == {"srun"} and set(table.world_size) == {2} and len(table) == 2
    assert (table.busbw_gbps > 0).all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("backend", "srun", "bad", "message"),
    [
        ("horovod", ["--mpi=none"], [], "srun --mpi=pmix"),
        pytest.param("ddp", [], ["--lr", "0"], "--lr must be a positive number", marks=pytest.mark.full_matrix),
    ],
    ids=["horovod-without-mpi", "ddp-bad-option"],
)
def test_bad_input_under_srun_is_said_once(tmp_path, slurm, backend, srun, bad, message, horovod_available) -> None:
    cmd = ["srun", "-n", "2", *srun, *CLI, "run", "--backend", backend, *RUN, *bad, "--out", str(tmp_path)]
    proc = _run(slurm, cmd, 100)
    output = proc.stdout + proc.stderr
    lines = our_lines(output)
    assert len(lines) == 1 and message in lines[0], output
    assert proc.returncode == 2, output  # srun passes on the ranks' exit code
    no_rank_traceback(output)
    assert not any(tmp_path.iterdir())


def _each_job_a_step(root: Path, said: str) -> None:
    """The compare of EVERY_SRUN in `root` ran each job as a step of its allocation, interleaved, decided."""
    comparison = pd.read_csv(root / "comparison.csv")
    assert list(comparison.variant) == EVERY_SRUN.split(",") * 2  # interleaved
    assert (comparison.status == "completed").all()
    assert comparison.command.str.startswith("srun --exact --ntasks=2").all()
    assert {_meta(root / r)["launcher"] for r in comparison.run_id} == {"srun"}
    assert re.search(r"^Decision \(", said, re.MULTILINE), said[-5000:]


# Compare inside an allocation runs in `make test` as the docs' sbatch script (below); inside `salloc`, the
# same compare in another kind of allocation, it is `full_matrix`.
@pytest.mark.full_matrix
@pytest.mark.timeout(300)
def test_compare_inside_an_allocation_runs_each_job_as_a_step(tmp_path, slurm, horovod_available) -> None:
    compare = [*CLI, "compare", "--backends", EVERY_SRUN, *COMPARE_FAST]
    proc = _run(slurm, ["salloc", "-n", "2", *compare, "--out", str(tmp_path), "--run-id", "c"], 280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    _each_job_a_step(tmp_path / "c", proc.stdout)
    assert not slurm.jobs()


def _compare_in_allocation(slurm: SlurmCluster, out: Path) -> tuple[subprocess.Popen[str], psutil.Process]:
    """A compare of two long ddp@srun jobs inside `salloc`, and the compare process itself (salloc's child),
    once its first run directory exists."""
    cmd = ["salloc", "-n", "2", *CLI, "compare", "--backends", "ddp@srun", "--repeats", "2", *LONG]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out), "--run-id", "c"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=slurm.env(launcher_env()),
    )
    deadline = time.monotonic() + 90
    while not (out / "c" / "ddp-srun-r0" / "run.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first step never started"
        time.sleep(0.2)
    time.sleep(2)  # its ranks are training
    compare = next(c for c in psutil.Process(proc.pid).children() if "compare" in " ".join(c.cmdline()))
    return proc, compare


@pytest.mark.full_matrix  # Ctrl-C to compare runs under mpirun in `make test` (test_interrupts.py)
@pytest.mark.timeout(150)
def test_ctrl_c_inside_an_allocation_stops_every_rank(tmp_path, slurm) -> None:
    proc, compare = _compare_in_allocation(slurm, tmp_path)
    compare.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    meta = _meta(tmp_path / "c" / "ddp-srun-r0")
    assert meta["status"] == "failed" and meta["interrupted"] is True, meta
    assert not (tmp_path / "c" / "ddp-srun-r1").exists()  # no job started after the interrupt
    assert not _ranks_of(str(tmp_path)), "ranks left running"
    assert not slurm.jobs()


@pytest.mark.timeout(150)
def test_scancel_of_a_step_stops_its_ranks_and_records_the_run_interrupted(tmp_path, slurm) -> None:
    proc, _ = _compare_in_allocation(slurm, tmp_path)
    [job] = [line.split()[0] for line in slurm.jobs()]
    subprocess.run(["scancel", f"{job}.0"], check=True, env=slurm.env(), timeout=30)
    out, err = proc.communicate(timeout=120)
    meta = _meta(tmp_path / "c" / "ddp-srun-r0")
    assert meta["status"] == "failed" and meta["interrupted"] is True, meta
    assert meta["error"].startswith("interrupted: Slurm cancelled step "), meta["error"]
    assert _meta(tmp_path / "c" / "ddp-srun-r1")["status"] == "completed"  # the compare went on
    assert not _ranks_of(str(tmp_path)), "ranks left running"


@pytest.mark.timeout(300)
def test_the_docs_sbatch_script_runs_a_compare(tmp_path, slurm, horovod_available) -> None:
    docs = (REPO / "docs" / "commands.md").read_text()
    [script] = re.findall(r"```bash\n(#!/bin/bash\n#SBATCH --job-name=distbench-compare\n.*?)```", docs, re.DOTALL)
    # The script activates the checkout's .venv, as a user's would; the tests may run from another environment.
    script = script.replace("source .venv/bin/activate", f"source {BIN / 'activate'}")
    path = tmp_path / "compare.sbatch"
    path.write_text(script)
    log = tmp_path / "slurm-%j.out"
    # The script's own options first, then what the test adds: every backend (a later --backends wins).
    added = ["--backends", EVERY_SRUN, *COMPARE_FAST, "--out", str(tmp_path / "runs"), "--run-id", "c"]
    cmd = ["sbatch", "--parsable", f"--output={log}", str(path), *added]
    proc = _run(slurm, cmd, 60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    deadline = time.monotonic() + 240  # sbatch --wait polls at growing intervals: looking here is quicker
    while any(line.split()[0] == job for line in slurm.jobs()):
        assert time.monotonic() < deadline, f"job {job} still queued or running"
        time.sleep(0.5)
    _each_job_a_step(tmp_path / "runs" / "c", (tmp_path / f"slurm-{job}.out").read_text())
