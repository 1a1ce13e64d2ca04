"""The job supervisor of compare, tune and allreduce --compare, on stand-in jobs: a signal stops the whole
tree (a process that left the job's session and ignores SIGINT included), the job's stderr after the
signal goes to a log, and an interrupted run is recorded as such."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from benchmarks.suite import jobs

# A job whose child leaves its session (as torchrun's and horovodrun's ranks do) and ignores SIGINT.
ESCAPING = textwrap.dedent("""
    import signal, subprocess, sys, time
    deaf = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", deaf], start_new_session=True)
    open(sys.argv[1], "w").write(str(child.pid))
    print("started", file=sys.stderr, flush=True)
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print("Traceback (a launcher's, after the signal)", file=sys.stderr, flush=True)
        if sys.argv[2] == "exit":
            sys.exit(1)
        time.sleep(60)
""")


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal_soon(pid_file: Path, signum: int = signal.SIGINT) -> None:
    def fire() -> None:
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(os.getpid(), signum)

    threading.Thread(target=fire, daemon=True).start()


@pytest.mark.processes
@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher_exits", [True, False], ids=["launcher-exits", "launcher-hangs"])
def test_a_signal_stops_the_whole_tree(tmp_path, monkeypatch, capfd, launcher_exits: bool) -> None:
    monkeypatch.setattr(jobs, "GRACE_S", 1.0)
    pid_file = tmp_path / "child.pid"
    cmd = [sys.executable, "-c", ESCAPING, str(pid_file), "exit" if launcher_exits else "hang"]
    with jobs.Supervisor(tmp_path) as supervisor:
        _signal_soon(pid_file)
        start = time.monotonic()
        code = supervisor.run(cmd, dict(os.environ), tmp_path / "job.log")
    assert supervisor.interrupted and supervisor.signal_name == "SIGINT"
    assert time.monotonic() - start < 15
    assert code != 0
    assert not _alive(int(pid_file.read_text())), "the child in its own session outlived the job"
    err = capfd.readouterr().err
    assert "started" in err and "Traceback" not in err, err  # after the signal, the job's words go to the log
    assert "Traceback" in (tmp_path / "job.log").read_text()
    assert supervisor.closing_line() == f"distbench: interrupted; partial results in {tmp_path}"


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_processes_a_finished_job_left_behind_are_killed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(jobs, "LEFTOVER_S", 0.5)
    pid_file = tmp_path / "child.pid"
    leaves = (
        "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)'], start_new_session=True); open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(1)"
    )
    with jobs.Supervisor(tmp_path) as supervisor:
        assert supervisor.run([sys.executable, "-c", leaves, str(pid_file)], dict(os.environ), tmp_path / "l") == 0
    assert not supervisor.interrupted
    assert not _alive(int(pid_file.read_text()))


def test_the_handlers_are_put_back(tmp_path) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with jobs.Supervisor(tmp_path):
        assert signal.getsignal(signal.SIGINT) != before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_an_interrupted_run_is_recorded_failed_and_a_completed_one_kept(tmp_path) -> None:
    for name, status, error in (
        ("running", "running", None),
        ("lost", "failed", "another rank died"),
        ("done", "completed", None),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"status": status, "error": error}))
    assert jobs.record_interrupted(tmp_path / "running", "SIGINT", "distbench compare")
    assert jobs.record_interrupted(tmp_path / "lost", "SIGINT", "distbench compare")
    assert not jobs.record_interrupted(tmp_path / "done", "SIGINT", "distbench compare")
    assert jobs.record_interrupted(tmp_path / "never-started", "SIGINT", "distbench compare")
    running = json.loads((tmp_path / "running" / "run.json").read_text())
    assert running["status"] == "failed" and running["interrupted"] is True
    assert running["error"] == "interrupted: SIGINT to distbench compare stopped the job"
    assert json.loads((tmp_path / "lost" / "run.json").read_text())["rank_error"] == "another rank died"
    assert json.loads((tmp_path / "done" / "run.json").read_text())["status"] == "completed"


def test_a_run_that_completed_as_the_signal_came_counts_as_completed(tmp_path) -> None:
    """The launcher may die of the signal after its ranks finished: the run is whole, the exit code is ours."""
    from benchmarks.cli import build_parser
    from benchmarks.suite import compare, comparison, variants
    from tests.helpers import make_run

    make_run(tmp_path, "ddp-r0", "ddp", [[0.1, 0.1, 0.1]], wall=1.0)
    cfg, _ = compare.effective_config(build_parser().parse_args(["compare", "--workload", "linear"]))
    jobs_ = variants.jobs_for(cfg, variants.parse("ddp"), [1], None, {}, None)
    caught = comparison.Attempt("ddp@torchrun", "ddp", 1, 32, 0, "ddp-r0", ["torchrun"], returncode=-2, signalled=True)
    failed = comparison.Attempt("ddp@torchrun", "ddp", 1, 32, 0, "ddp-r0", ["torchrun"], returncode=-2)
    frame, _ = comparison.comparison_frame(tmp_path, [caught, failed], jobs_, comparison.WEAK)
    assert list(frame.status) == ["completed", "failed"]
