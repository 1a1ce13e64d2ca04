"""Reliability: every fault mode ends the job within the timeout, results stay whole, bad input exits 2.

Bad input that needs no launcher is tested in-process in tests/unit/test_cli.py."""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import check
from benchmarks.run import faults
from tests.helpers import (
    BIN,
    CLI,
    REPO,
    cli_here,
    horovodrun,
    launcher_env,
    mpirun,
    one_in_make_test,
    run_cmd,
    run_ok,
    torchrun,
)

TIMEOUT = 10
MARGIN = 45  # start-up of two ranks (torch, Horovod) and the launcher's own shutdown on 2 busy cores
FAULTY = [
    "--workload",
    "mlp",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "8",
    "--warmup-steps",
    "1",
    "--quiet",
    "--flush-every",
    "2",
    "--timeout",
    str(TIMEOUT),
]
LAUNCHERS = {
    "torchrun-ddp": (lambda: torchrun(2), "ddp"),
    "horovodrun-horovod": (lambda: horovodrun(2, "--gloo"), "horovod"),
    "mpirun-ddp": (lambda: mpirun(2), "ddp"),
}
# `make test` runs each fault mode under the one launcher named here (a covering design: every mode once,
# every launcher under two or three); the other pairs are marked `full_matrix`, left to `make test-all`.
# Where a test below already puts a mode under a launcher, the mode's pair here is another: torchrun meets
# `exception` in test_a_fault_on_a_rank_names_that_rank_and_its_error, torchrun `sigkill` in
# test_a_killed_rank_is_not_blamed_on_rank_0. A new mode in faults.MODES fails collection until it has one.
DEFAULT_LAUNCHER_OF_MODE = {
    "exception": "mpirun-ddp",
    "exit0": "torchrun-ddp",
    "exit1": "horovodrun-horovod",
    "abort": "torchrun-ddp",
    "sigkill": "horovodrun-horovod",
    "sigterm": "mpirun-ddp",
    "hang": "horovodrun-horovod",  # Horovod's stall check and the ranks' watchdog, both on --timeout
}
FAULT_MATRIX = [
    pytest.param(
        launcher,
        mode,
        id=f"{launcher}-{mode}",
        marks=() if DEFAULT_LAUNCHER_OF_MODE[mode] == launcher else pytest.mark.full_matrix,
    )
    for launcher in LAUNCHERS
    for mode in faults.MODES
]


@pytest.mark.timeout(TIMEOUT + MARGIN + 30)
@pytest.mark.parametrize(("launcher", "mode"), FAULT_MATRIX)
def test_fault_ends_the_job_and_leaves_whole_failed_results(tmp_path, launcher: str, mode: str) -> None:
    prefix, backend = LAUNCHERS[launcher]
    cmd = [
        *prefix(),
        "run",
        "--backend",
        backend,
        *FAULTY,
        "--out",
        str(tmp_path),
        "--run-id",
        "r",
        "--inject-fault",
        f"{mode}@4:1",
    ]
    start = time.monotonic()
    proc = run_cmd(cmd, timeout=TIMEOUT + MARGIN + 20)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert elapsed < TIMEOUT + MARGIN, f"took {elapsed:.0f}s"
    run_dir = tmp_path / "r"
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "failed", (meta, proc.stderr[-3000:])
    assert meta["error"]
    timing, loss = pd.read_csv(run_dir / "timing.csv"), pd.read_csv(run_dir / "loss.csv")
    assert timing["step"].max() <= 4 and len(loss) <= 4  # what was flushed before the fault, no more
    assert check.check_run(run_dir) == []


@pytest.mark.timeout(120)
def test_a_fault_on_a_rank_names_that_rank_and_its_error(tmp_path) -> None:
    cmd = [
        *torchrun(2),
        "run",
        "--backend",
        "ddp",
        *FAULTY,
        "--out",
        str(tmp_path),
        "--run-id",
        "r",
        "--inject-fault",
        "exception@3:1",
    ]
    run_cmd(cmd, timeout=100)
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["failed_rank"] == 1 and "injected exception at step 3 on rank 1" in meta["error"]


@pytest.mark.timeout(120)
# torchrun in make test; mpirun, whose kill is the same sigkill@4:1, in make test-all.
@pytest.mark.parametrize("launcher", one_in_make_test(["torchrun-ddp", "mpirun-ddp"], "torchrun-ddp"))
def test_a_killed_rank_is_not_blamed_on_rank_0(tmp_path, launcher: str) -> None:
    prefix, backend = LAUNCHERS[launcher]
    cmd = [
        *prefix(),
        "run",
        "--backend",
        backend,
        *FAULTY,
        "--out",
        str(tmp_path),
        "--run-id",
        "r",
        "--inject-fault",
        "sigkill@4:1",
    ]
    proc = run_cmd(cmd, timeout=100)
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["status"] == "failed" and meta["failed_rank"] is None, (meta, proc.stderr[-3000:])
    assert meta["error"].startswith("another rank died or stopped answering"), meta["error"]
    assert "run failed on rank 0" not in proc.stderr


@pytest.mark.timeout(200)
def test_compare_marks_a_run_whose_rank_0_was_killed(tmp_path) -> None:
    """SIGKILL on rank 0 leaves nobody to write run.json: compare records the failure."""
    cmd = [
        str(BIN / "distbench"),
        "compare",
        "--backends",
        "ddp",
        "--repeats",
        "1",
        *FAULTY,
        "--inject-fault",
        "sigkill@3:0",
        "--out",
        str(tmp_path),
        "--run-id",
        "cmp",
    ]
    proc = run_cmd(cmd, timeout=180)
    assert proc.returncode == 1
    meta = json.loads((tmp_path / "cmp" / "ddp-r0" / "run.json").read_text())
    assert meta["status"] == "failed" and "before the run completed" in meta["error"]
    assert pd.read_csv(tmp_path / "cmp" / "comparison.csv")["status"].tolist() == ["failed"]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good")
    run_ok(
        [
            *CLI,
            "run",
            "--backend",
            "single",
            "--workload",
            "linear",
            "--epochs",
            "1",
            "--steps-per-epoch",
            "8",
            "--warmup-steps",
            "2",
            "--quiet",
            "--out",
            str(out),
            "--run-id",
            "good",
        ]
    )
    assert check.check_run(out / "good") == []
    return out / "good"


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / run.name))


def test_check_catches_a_truncated_last_line(good_run, tmp_path) -> None:
    run = _copy(good_run, tmp_path)
    data = (run / "timing.csv").read_bytes()
    (run / "timing.csv").write_bytes(data[:-15])
    problems = [str(p) for p in check.check_run(run)]
    lines = data.count(b"\n")
    assert any(f"timing.csv:{lines}: truncated last line" in p for p in problems), problems


def test_check_catches_a_duplicated_row(good_run, tmp_path) -> None:
    run = _copy(good_run, tmp_path)
    lines = (run / "timing.csv").read_text().splitlines(keepends=True)
    (run / "timing.csv").write_text("".join([*lines[:4], lines[3], *lines[4:]]))
    problems = [str(p) for p in check.check_run(run)]
    assert any("timing.csv:5: duplicate (rank, epoch, step)" in p for p in problems), problems


def test_check_catches_a_wrong_schema_version(good_run, tmp_path) -> None:
    run = _copy(good_run, tmp_path)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "schema_version": 7}))
    assert any("schema_version 7 is not known" in str(p) for p in check.check_run(run))


def test_check_catches_unrecomputable_throughput(good_run, tmp_path) -> None:
    run = _copy(good_run, tmp_path)
    summary = pd.read_csv(run / "summary.csv")
    summary.loc[0, "samples_per_s"] *= 2
    summary.to_csv(run / "summary.csv", index=False)
    assert any("samples_per_s" in str(p) for p in check.check_run(run))


def test_check_command_exit_codes(good_run, tmp_path) -> None:
    assert cli_here(["check", str(good_run)]).returncode == 0
    run = _copy(good_run, tmp_path)
    (run / "loss.csv").write_text((run / "loss.csv").read_text() + "garbage,row\n")
    proc = cli_here(["check", str(run)])
    assert proc.returncode == 1 and "loss.csv:" in proc.stdout


def test_report_leaves_out_invalid_runs_unless_asked(good_run, tmp_path) -> None:
    from benchmarks.analysis import load

    run = _copy(good_run, tmp_path)
    (run / "timing.csv").write_bytes((run / "timing.csv").read_bytes()[:-5])
    with pytest.raises(FileNotFoundError, match="check problem"):
        load.load_runs(run)
    assert len(load.load_runs(run, include_failed=True).runs) == 1


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))


@pytest.mark.timeout(120)
def test_full_disk_gives_a_clear_error_and_whole_rows(tmp_path) -> None:
    """A file-size limit stands in for a full disk: writes fail part-way through the run."""
    cmd = [
        *CLI,
        "run",
        "--backend",
        "single",
        "--workload",
        "mlp",
        "--epochs",
        "1",
        "--flush-every",
        "5",
        "--quiet",
        "--out",
        str(tmp_path),
        "--run-id",
        "full",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=launcher_env(), cwd=REPO, timeout=100, preexec_fn=_limit_file_size
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("distbench: error: cannot write")
    assert "File too large" in proc.stderr
    assert json.loads((tmp_path / "full" / "run.json").read_text())["status"] == "failed"
    assert check.check_run(tmp_path / "full") == []


@pytest.mark.timeout(60)
def test_missing_horovod_exits_2_with_the_fix(tmp_path) -> None:
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("raise ImportError('not here')\n")
    proc = run_cmd(
        [*CLI, "run", "--backend", "horovod", "--quiet", "--out", str(tmp_path / "out")],
        timeout=50,
        PYTHONPATH=f"{tmp_path}:{REPO}",
    )
    assert proc.returncode == 2 and "make setup" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nproc", ["0", "two"])
def test_compare_refuses_a_bad_nproc(tmp_path, nproc: str) -> None:
    proc = run_cmd([str(BIN / "distbench"), "compare", "--nproc", nproc, "--out", str(tmp_path / "out")], timeout=50)
    assert proc.returncode == 2 and "--nproc" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_concurrent_runs_into_one_out_never_mix(tmp_path) -> None:
    cmd = [
        *CLI,
        "run",
        "--backend",
        "single",
        "--workload",
        "linear",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "20",
        "--quiet",
        "--flush-every",
        "3",
        "--out",
        str(tmp_path),
    ]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=launcher_env(), stdout=subprocess.PIPE) for _ in range(2)]
    dirs = [Path(p.communicate(timeout=100)[0].decode().strip().splitlines()[-1]) for p in procs]
    assert dirs[0] != dirs[1]
    for run_dir in dirs:
        assert set(pd.read_csv(run_dir / "timing.csv")["run_id"]) == {run_dir.name}
        assert check.check_run(run_dir) == []


@pytest.mark.timeout(120)
def test_existing_run_directory_needs_overwrite(tmp_path) -> None:
    cmd = [
        *CLI,
        "run",
        "--backend",
        "single",
        "--workload",
        "linear",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "3",
        "--warmup-steps",
        "1",
        "--quiet",
        "--out",
        str(tmp_path),
        "--run-id",
        "same",
    ]
    run_ok(cmd)
    before = (tmp_path / "same" / "run.json").read_text()
    proc = run_cmd(cmd, timeout=60)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    assert (tmp_path / "same" / "run.json").read_text() == before
    run_ok([*cmd, "--overwrite"])
    assert (tmp_path / "same" / "run.json").read_text() != before
