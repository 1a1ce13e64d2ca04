"""`distbench compare` end to end: real launchers, real CSVs, as a user types it."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import catalog
from tests.helpers import BARS, BIN, REPO, cli_here, our_lines, run_cmd, run_ok

COMPARE = [str(BIN / "distbench"), "compare", "--quiet"]


def meta_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def last_val(run_dir: Path) -> pd.Series:
    loss = pd.read_csv(run_dir / "loss.csv")
    return loss[loss.split == "val"].iloc[-1]


def _shadow_horovod(tmp_path: Path) -> str:
    """A PYTHONPATH under which `import horovod` fails, as on a machine without Horovod."""
    (tmp_path / "shadow" / "horovod").mkdir(parents=True)
    (tmp_path / "shadow" / "horovod" / "__init__.py").write_text("raise ImportError('no horovod here')\n")
    return f"{tmp_path / 'shadow'}:{REPO}"


# compare's workload presets end to end: the default (the transformer's) in `make test` below, cnn's here
# `full_matrix` (every workload's defaults are checked to learn in tests/unit/test_compare_workload_defaults.py).
@pytest.mark.full_matrix
@pytest.mark.timeout(200)
def test_compare_with_a_workload_uses_its_defaults_and_it_learns(tmp_path) -> None:
    """compare --workload cnn once ran the transformer's sizes and lr and ended below chance."""
    cmd = [*COMPARE, "--workload", "cnn", "--backends", "ddp", "--repeats", "1", "--epochs", "1"]
    proc = run_ok([*cmd, "--out", str(tmp_path), "--run-id", "cmp"], timeout=180)
    # The options in effect are printed before anything starts, and they are cnn's.
    head = proc.stderr.split("[compare 1/1]")[0]
    cnn = catalog.REGISTRY["cnn"].defaults
    assert "cnn (the workload's defaults" in head and f"--lr {cnn['lr']}," in head
    config = meta_of(tmp_path / "cmp" / "ddp-r0")["config"]
    assert (config["lr"], config["batch_size"], config["train_size"]) == (cnn["lr"], cnn["batch_size"], 2048)
    assert config["steps_per_epoch"] is None  # one pass, not the preset's cap
    column, bar = BARS["cnn"]
    assert last_val(tmp_path / "cmp" / "ddp-r0")[column] > bar


@pytest.mark.timeout(200)
def test_the_default_preset_learns_and_reports_its_measured_share(tmp_path) -> None:
    proc = run_ok([*COMPARE, "--backends", "ddp", "--repeats", "1", "--out", str(tmp_path), "--run-id", "c"], 180)
    assert "transformer (compare's default" in proc.stderr
    run_dir = tmp_path / "c" / "ddp-r0"
    meta = meta_of(run_dir)
    sized = json.loads((tmp_path / "c" / "sizing.json").read_text())  # the preset's length, sized to the default window
    assert meta["config"]["steps_per_epoch"] == sized["steps_per_epoch"] and meta["timed_wall_s"] > 0
    assert sized["timed_steps"] >= 20 and "sized to the workload" in proc.stderr
    column, bar = BARS["transformer"]
    assert last_val(run_dir)[column] > bar
    comparison = pd.read_csv(tmp_path / "c" / "comparison.csv")
    assert comparison.timed_wall_s.iloc[0] == pytest.approx(meta["timed_wall_s"])
    assert comparison.job_wall_s.iloc[0] > comparison.timed_wall_s.iloc[0]
    # "time: T s of W s wall inside timed windows (P%)", then the parts outside the windows, then the directory.
    time_line = next(line for line in proc.stdout.splitlines() if line.startswith("time: "))
    assert "outside the timed window, per job:" in proc.stdout
    timed, wall = (float(x) for x in time_line.split("time: ")[1].split(" s wall")[0].split(" s of "))
    assert timed == pytest.approx(meta["timed_wall_s"], abs=0.05) and wall > comparison.job_wall_s.iloc[0]


@pytest.mark.timeout(240)
def test_compare_survives_a_failing_backend(tmp_path) -> None:
    cmd = [
        *COMPARE,
        "--backends",
        "ddp,horovod",
        "--repeats",
        "1",
        "--workload",
        "mlp",
        "--steps-per-epoch",
        "4",
        "--warmup-steps",
        "1",
    ]
    proc = run_cmd([*cmd, "--out", str(tmp_path / "out"), "--run-id", "cmp"], 200, PYTHONPATH=_shadow_horovod(tmp_path))
    assert proc.returncode != 0, proc.stdout
    comparison = pd.read_csv(tmp_path / "out" / "cmp" / "comparison.csv")
    status = dict(zip(comparison.backend, comparison.status, strict=True))
    assert status == {"ddp": "completed", "horovod": "failed"}
    assert "FAILED" in proc.stdout and "ddp" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path / "out" / "cmp")


@pytest.mark.timeout(240)
def test_a_launcher_that_dies_before_its_ranks_is_a_failure_with_its_reason(tmp_path) -> None:
    """With no home to write (a container's user) and a broken mpirun first on PATH: horovodrun --gloo runs all the same
    (compare passes --disable-cache, as it cannot make ~/.horovod), horovodrun --mpi dies before any rank
    starts — run.json and the table carry its last error line, and compare says first that the variant
    failed, with no decision between the variants left."""
    cmd = [*COMPARE, "--backends", "ddp,horovod@gloo,horovod@mpi", "--repeats", "1", "--workload", "mlp"]
    cmd += ["--steps-per-epoch", "4", "--out", str(tmp_path), "--run-id", "cmp"]
    broken = tmp_path / "broken-mpi"  # an mpirun that fails even `mpirun --version`, as a broken MPI would
    broken.mkdir()
    (broken / "mpirun").write_text("#!/bin/sh\nexit 1\n")
    (broken / "mpirun").chmod(0o755)
    path = f"{broken}:{BIN}:{os.environ.get('PATH', '')}"
    proc = run_cmd(cmd, 200, HOME="/proc/1", PATH=path)  # no one can write in /proc/1
    assert proc.returncode == 1, proc.stdout + proc.stderr
    died = "the launcher exited 1 before any rank started: Exception: horovod does not find an installed MPI."
    meta = meta_of(tmp_path / "cmp" / "horovod-mpi-r0")
    assert (meta["status"], meta["error"], meta["launcher_failed"]) == ("failed", died, True)
    assert meta_of(tmp_path / "cmp" / "ddp-r0")["status"] == "completed"
    assert meta_of(tmp_path / "cmp" / "horovod-gloo-r0")["status"] == "completed"
    commands = dict(
        zip(*pd.read_csv(tmp_path / "cmp" / "comparison.csv")[["variant", "command"]].T.values, strict=True)
    )
    assert "--disable-cache" in commands["horovod@gloo"] and "--disable-cache" not in commands["ddp@torchrun"]
    first = proc.stdout.splitlines()[0]
    assert first == f"No decision: horovod@mpi failed in all 1 of its runs ({died}). " + (
        "Fix that and run the compare again; comparison.csv says how each run ended."
    ), proc.stdout
    assert "Decision" not in proc.stdout, proc.stdout
    assert f"horovod-mpi-r0/run.json: {died}" in proc.stdout  # the table's reason
    assert cli_here(["check", str(tmp_path / "cmp")]).returncode == 0


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root for a hostname of its own (unshare)"
)
@pytest.mark.timeout(240)
def test_on_one_host_no_launcher_needs_the_hostname_to_resolve(tmp_path) -> None:
    """A container's or a pod's hostname may not resolve: torchrun and mpirun jobs complete all the same, and
    horovod@gloo, which would crash in Horovod's own lookup, is refused in one line before anything starts."""
    unresolved = ["unshare", "--uts", "sh", "-c", 'hostname distbench-nowhere && exec "$@"', "sh"]
    cmd = [*COMPARE, "--backends", "ddp@torchrun,ddp@mpirun", "--repeats", "1", "--workload", "mlp"]
    proc = run_cmd([*unresolved, *cmd, "--steps-per-epoch", "4", "--out", str(tmp_path), "--run-id", "c"], 200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert set(pd.read_csv(tmp_path / "c" / "comparison.csv").status) == {"completed"}
    refused = run_cmd([*unresolved, *COMPARE, "--backends", "horovod@gloo", "--out", str(tmp_path / "r")], 60)
    lines = our_lines(refused.stderr)
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "hostname distbench-nowhere does not resolve" in lines[0] and "/etc/hosts" in lines[0]
    assert not (tmp_path / "r").exists()


# compare × launcher: `make test` compares under every launcher in test_placement.py (ddp@mpirun among
# them) and stops an mpirun compare in test_interrupts.py; `--launcher mpirun` for both backends, one more
# pair, is `full_matrix`.
@pytest.mark.full_matrix
@pytest.mark.timeout(300)
def test_compare_both_backends_under_mpirun(tmp_path, horovod_available) -> None:
    cmd = [
        *COMPARE,
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
        "--out",
        str(tmp_path),
        "--run-id",
        "cmp",
    ]
    proc = run_ok(cmd, timeout=280)
    comparison = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert list(comparison.backend) == ["ddp", "horovod", "ddp", "horovod"]  # interleaved
    assert list(comparison.variant) == ["ddp@mpirun", "horovod@mpirun"] * 2  # --launcher: bare names under mpirun
    assert (comparison.status == "completed").all() and (comparison.samples_per_s > 0).all()
    assert {meta_of(tmp_path / "cmp" / r)["launcher"] for r in comparison.run_id} == {"mpirun"}
    assert comparison.command.str.startswith("mpirun -np 2").all()
    assert meta_of(tmp_path / "cmp" / "ddp-r0")["config"]["steps_per_epoch"] == 6  # options pass through
    # Horovod cannot broadcast buffers, so compare turns DDP's broadcast off and says so.
    assert meta_of(tmp_path / "cmp" / "ddp-r0")["knobs"]["broadcast_buffers"] is False
    assert "buffers: DDP's broadcast before each forward is off, as horovod@mpirun cannot" in proc.stderr
    assert "samples/s" in proc.stdout
    agreement = re.search(r"difference between variants \(ddp@mpirun, horovod@mpirun\): train (\S+),", proc.stdout)
    assert agreement is not None and float(agreement.group(1)) < 1e-5, proc.stdout


@pytest.mark.timeout(200)
def test_single_in_a_compare_trains_on_the_same_global_batch(tmp_path) -> None:
    """`single` runs one rank of the whole global batch, so its loss curve is the distributed one."""
    cmd = [
        *COMPARE,
        "--backends",
        "ddp,single",
        "--repeats",
        "1",
        "--workload",
        "mlp",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "8",
        "--warmup-steps",
        "1",
        "--out",
        str(tmp_path),
        "--run-id",
        "cmp",
    ]
    proc = run_ok(cmd, timeout=180)
    ddp, single = meta_of(tmp_path / "cmp" / "ddp-r0"), meta_of(tmp_path / "cmp" / "single-r0")
    assert (single["world_size"], single["config"]["batch_size"]) == (1, 2 * ddp["config"]["batch_size"])
    assert single["global_batch"] == ddp["global_batch"]
    curves = [
        pd.read_csv(tmp_path / "cmp" / f"{b}-r0" / "loss.csv").query("split == 'train'")["loss"]
        for b in ("ddp", "single")
    ]
    assert len(curves[0]) == len(curves[1]) == 8
    assert abs(curves[0].to_numpy() - curves[1].to_numpy()).max() < 1e-5
    # ... because they saw the same inputs, which compare says (run.json's fingerprints, benchmarks.run.fingerprint).
    assert "inputs: the same data and initial weights in all 2 runs (run.json fingerprints)" in proc.stdout
    assert single["fingerprint"]["train"] == ddp["fingerprint"]["train"]
    assert single["fingerprint"]["initial_weights"] == ddp["fingerprint"]["initial_weights"]
    assert ddp["fingerprint"]["initial_weights_agree"] is True
    assert cli_here(["check", str(tmp_path / "cmp")]).returncode == 0
