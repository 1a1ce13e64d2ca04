"""Ctrl-C and SIGTERM under the real launchers: nothing of the job is left running, what completed is kept,
and an interrupted run is never recorded `completed`.

Each compare runs two short jobs of a tiny workload and is signalled as the second one starts, so one run
completed (the report has something to show) and one is interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import BIN, CLI, REPO, cli_here, horovodrun, launcher_env, mpirun, torchrun

TINY = ["--workload", "linear", "--epochs", "30", "--warmup-steps", "1", "--compute-baseline-steps", "0", "--quiet"]
GONE_WITHIN_S = 15
VARIANTS = {"torchrun": "ddp@torchrun", "horovodrun": "horovod@gloo", "mpirun": "ddp@mpirun"}
INTERRUPTED = "interrupted by SIGINT (Ctrl-C, or a launcher or distbench compare passing it on)"


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid → (process group, session, command line) of every process but this one."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found[int(entry)] = (int(fields[2]), int(fields[3]), cmdline)
    return found


def _job_processes(marker: str, groups: set[int]) -> dict[int, str]:
    """Processes that name `marker` (the run directory) on their command line or share a group or
    session with one that did."""
    return {pid: cmd for pid, (pgid, sid, cmd) in _processes().items() if marker in cmd or {pgid, sid} & groups}


def _groups_of(marker: str) -> set[int]:
    return {g for pgid, sid, cmd in _processes().values() if marker in cmd for g in (pgid, sid)}


def _has_rows(path: Path, rows: int) -> bool:
    """`path` exists and holds at least `rows` lines after its header (0: it exists)."""
    try:
        return len(path.read_text().splitlines()) > rows if rows else path.exists()
    except FileNotFoundError:
        return False


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120, rows: int = 0) -> None:
    deadline = time.monotonic() + timeout
    while not _has_rows(path, rows):
        assert proc.poll() is None, f"exited {proc.returncode} before {path} had {rows} row(s): {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path} never had {rows} row(s)"
        time.sleep(0.1)


def _all_gone(marker: str, groups: set[int]) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := _job_processes(marker, groups)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # clean up before failing, so one failure does not slow the rest
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {GONE_WITHIN_S} s after the signal: {left}"


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _interrupt(
    proc: subprocess.Popen, watched: Path, marker: str, signum: int, group: bool = False, rows: int = 0
) -> str:
    """Signal `proc` once `watched` exists (with `rows` data rows); check the job is gone within the limit;
    return stderr."""
    _wait_for(watched, proc, rows=rows)
    time.sleep(0.5)  # the job's ranks are up and recording
    groups = _groups_of(marker)
    assert groups, "no process of the job was found"
    (os.killpg if group else os.kill)(proc.pid, signum)
    _all_gone(marker, groups)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == f"distbench: interrupted; partial results in {marker}", err
    assert "Traceback" not in err and "leaked semaphore" not in err, err
    return err


def _check_and_report(root: Path) -> None:
    check = cli_here(["check", str(root)])
    assert check.returncode == 0, check.stdout + check.stderr
    report = cli_here(["report", str(root), "--out", str(root / "again"), "--format", "md"])
    assert report.returncode == 0, report.stderr
    assert (root / "again" / "report.md").is_file()


def _interrupted_meta(run_dir: Path) -> dict:
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "failed" and meta["error"].startswith("interrupted"), meta
    return meta


# Ctrl-C to compare under one launcher in `make test`: mpirun, the one no other compare-level interrupt
# test here starts (SIGTERM to the group, the second Ctrl-C and tune run ddp@torchrun, allreduce --compare
# stops a horovodrun job). The other two are `full_matrix`, left to `make test-all`.
COMPARE_LAUNCHERS = [
    pytest.param("torchrun", marks=pytest.mark.full_matrix),
    pytest.param("horovodrun", marks=pytest.mark.full_matrix),
    "mpirun",
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", COMPARE_LAUNCHERS)
def test_sigint_to_compare_stops_the_job_and_keeps_what_completed(tmp_path, launcher: str, horovod_available) -> None:
    root = tmp_path / "cmp"
    proc = _start(
        [
            str(BIN / "distbench"),
            "compare",
            "--backends",
            VARIANTS[launcher],
            "--repeats",
            "2",
            *TINY,
            "--out",
            str(tmp_path),
            "--run-id",
            "cmp",
        ]
    )
    slug = VARIANTS[launcher].replace("@", "-")
    # Signalled once the second run has finished an epoch (loss.csv has a row) and has 29 to go: its
    # run.json alone appeared, under load, so late that the run could complete before its ranks stopped.
    err = _interrupt(proc, root / f"{slug}-r1" / "loss.csv", str(root), signal.SIGINT, rows=1)
    comparison = pd.read_csv(root / "comparison.csv")
    assert list(comparison.status) == ["completed", "interrupted"], (comparison, err)
    _interrupted_meta(root / f"{slug}-r1")
    assert (root / "report" / "report.html").is_file()  # the report of what completed
    _check_and_report(root)


@pytest.mark.timeout(150)
def test_sigterm_to_the_process_group_of_compare(tmp_path) -> None:
    """What a terminal or a supervisor sends to the whole group: the same clean stop."""
    root = tmp_path / "cmp"
    proc = _start(
        [
            str(BIN / "distbench"),
            "compare",
            "--backends",
            "single,ddp",
            "--repeats",
            "1",
            *TINY,
            "--out",
            str(tmp_path),
            "--run-id",
            "cmp",
        ]
    )
    _interrupt(proc, root / "ddp-r0" / "run.json", str(root), signal.SIGTERM, group=True)
    comparison = pd.read_csv(root / "comparison.csv")
    assert list(comparison.status) == ["completed", "interrupted"], comparison
    assert "SIGTERM" in _interrupted_meta(root / "ddp-r0")["error"]


@pytest.mark.timeout(120)
def test_a_second_ctrl_c_ends_compare_at_once(tmp_path) -> None:
    root = tmp_path / "cmp"
    proc = _start(
        [
            str(BIN / "distbench"),
            "compare",
            "--backends",
            "ddp",
            "--repeats",
            "1",
            *TINY,
            "--out",
            str(tmp_path),
            "--run-id",
            "cmp",
        ]
    )
    _wait_for(root / "ddp-r0" / "run.json", proc)
    groups = _groups_of(str(root))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - start < 3, err
    assert "distbench: interrupted again" in err.strip().splitlines()[-1] and "Traceback" not in err, err
    _all_gone(str(root), groups)


@pytest.mark.timeout(200)
def test_sigint_to_tune_writes_tune_csv_with_the_interrupted_row(tmp_path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text("[ddp]\nbucket_cap_mb = [1, 25]\n")
    root = tmp_path / "tune"
    # Sweep runs are one epoch: a larger training set makes one long enough to be caught mid-run.
    proc = _start(
        [
            str(BIN / "distbench"),
            "tune",
            "--backends",
            "ddp",
            "--grid",
            str(grid),
            "--tune-steps",
            "1000",
            "--repeats",
            "1",
            *TINY,
            "--train-size",
            "80000",
            "--out",
            str(tmp_path),
            "--run-id",
            "tune",
        ]
    )
    _interrupt(proc, root / "sweep" / "ddp-p1-r0" / "run.json", str(root), signal.SIGINT)
    tune = pd.read_csv(root / "tune.csv")
    assert list(tune.status) == ["completed", "interrupted"], tune
    _interrupted_meta(root / "sweep" / "ddp-p1-r0")
    assert not (root / "final").exists()
    check = cli_here(["check", str(root)])
    assert check.returncode == 0, check.stdout


@pytest.mark.timeout(200)
def test_sigint_to_allreduce_compare_writes_the_interrupted_row(tmp_path, horovod_available) -> None:
    root = tmp_path / "ar"
    proc = _start(
        [
            str(BIN / "distbench"),
            "allreduce",
            "--compare",
            "--impls",
            "torch,horovod-gloo",
            "--sizes",
            "4,16M",
            "--iters",
            "100",
            "--warmup",
            "1",
            "--quiet",
            "--out",
            str(tmp_path),
            "--run-id",
            "ar",
        ]
    )
    _interrupt(proc, root / "horovod-gloo" / "run.json", str(root), signal.SIGINT)
    combined = pd.read_csv(root / "allreduce-comparison.csv")
    assert set(combined.status) == {"completed", "interrupted"}, combined
    assert set(combined[combined.status == "interrupted"].run_id) == {"horovod-gloo"}
    _interrupted_meta(root / "horovod-gloo")
    _check_and_report(root)


RUN_UNDER = {
    "torchrun": (lambda: torchrun(2), "ddp"),
    "horovodrun": (lambda: horovodrun(2, "--gloo"), "horovod"),
    "mpirun": (lambda: mpirun(2), "ddp"),
    "mpirun-horovod": (lambda: mpirun(2), "horovod"),
}
SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
# `make test` sends each signal under one launcher, a different one each: SIGINT to torchrun (the one that
# passes SIGINT on to its ranks), SIGTERM to mpirun with Horovod (ranks that initialised MPI), SIGKILL to
# horovodrun (its per-rank middleman stops the ranks); plain mpirun's stop is run by
# test_sigint_to_compare_stops_the_job_and_keeps_what_completed[mpirun]. The other pairs are `full_matrix`.
DEFAULT_LAUNCHER_OF_SIGNAL = {"sigint": "torchrun", "sigterm": "mpirun-horovod", "sigkill": "horovodrun"}
LAUNCHER_SIGNALS = [
    pytest.param(
        launcher,
        SIGNALS[name],
        id=f"{launcher}-{name}",
        marks=() if DEFAULT_LAUNCHER_OF_SIGNAL[name] == launcher else pytest.mark.full_matrix,
    )
    for launcher in RUN_UNDER
    # mpirun's own stop (SIGTERM, then SIGKILL as soon as one rank exits) follows SIGINT and SIGTERM alike
    for name in (SIGNALS if launcher.startswith("mpirun") else ("sigint", "sigkill"))
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("launcher", "signum"), LAUNCHER_SIGNALS)
def test_run_interrupted_under_a_launcher_is_failed_never_completed(
    tmp_path, launcher: str, signum: int, horovod_available
) -> None:
    """The signal to the launcher's pid alone, as a supervisor sends it. SIGKILL leaves the ranks no
    launcher to stop them: they must notice and stop, not train on and record `completed`. mpirun SIGKILLs
    the job as soon as one rank exits after its SIGTERM, so rank 0's record must come before any rank
    leaves."""
    prefix, backend = RUN_UNDER[launcher]
    run_dir = tmp_path / "r"
    proc = _start(
        [*prefix(), "run", "--backend", backend, *TINY, "--epochs", "200", "--out", str(tmp_path), "--run-id", "r"]
    )
    _wait_for(run_dir / "timing.csv", proc)
    time.sleep(1)
    groups = _groups_of(str(tmp_path))
    os.kill(proc.pid, signum)
    _all_gone(str(tmp_path), groups)
    proc.communicate(timeout=30)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "failed", meta
    said = {signal.SIGKILL: ("launcher", "another rank")}.get(signum, ("SIGINT", "SIGTERM"))
    assert meta["error"].startswith(("interrupted", "terminated", "the launcher", "another rank")), meta["error"]
    assert any(word in meta["error"] for word in said), meta["error"]


@pytest.mark.timeout(120)
def test_sigint_to_a_plain_run_records_it_failed_in_one_line(tmp_path) -> None:
    """No launcher: the signal watcher records it while the main thread trains on (perhaps mid-write of a
    row); run.json is written all the same, and said once."""
    for attempt in range(3):  # each catches the main thread at another point of its step
        run_dir = tmp_path / f"r{attempt}"
        proc = _start(
            [
                *CLI,
                "run",
                "--backend",
                "single",
                *TINY,
                "--epochs",
                "300",
                "--out",
                str(tmp_path),
                "--run-id",
                run_dir.name,
            ]
        )
        _wait_for(run_dir / "timing.csv", proc)
        time.sleep(0.5 + attempt * 0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err)
        assert [line for line in err.splitlines() if line.startswith("distbench:")] == [
            f"distbench: error: run failed on rank 0: {INTERRUPTED}; details in {run_dir / 'run.json'}"
        ], err
        meta = json.loads((run_dir / "run.json").read_text())
        assert (meta["status"], meta.get("error")) == ("failed", INTERRUPTED), (meta, err)
