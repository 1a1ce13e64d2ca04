"""A rank other than 0, stopped by a signal, leaves only once rank 0 has recorded the run (or cannot).

Open MPI's mpirun SIGKILLs every rank as soon as one of them exits after its SIGTERM, so a rank that left
first took rank 0 down before its record (run.json stayed `running`); see docs/reliability.md."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.run import guard


def _write(path: Path, status: str, pid: int) -> None:
    path.write_text(json.dumps({"status": status, "host": socket.gethostname(), "pid": pid}))


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def _timed(run_json: Path, timeout: float) -> float:
    start = time.monotonic()
    guard.wait_for_record(run_json, timeout)
    return time.monotonic() - start


def test_waits_while_rank_0_is_alive_and_has_not_recorded(tmp_path) -> None:
    run_json = tmp_path / "run.json"
    _write(run_json, "running", os.getpid())
    threading.Timer(0.3, _write, (run_json, "failed", os.getpid())).start()
    assert 0.25 < _timed(run_json, 5) < 2


def test_returns_at_once_when_there_is_nothing_to_wait_for(tmp_path) -> None:
    run_json = tmp_path / "run.json"
    assert _timed(run_json, 5) < 0.5  # another host's directory: rank 0's run.json is not here
    _write(run_json, "failed", os.getpid())
    assert _timed(run_json, 5) < 0.5
    _write(run_json, "running", _dead_pid())  # rank 0 is gone: nobody will record
    assert _timed(run_json, 5) < 0.5


def test_gives_up_after_the_timeout(tmp_path) -> None:
    run_json = tmp_path / "run.json"
    _write(run_json, "running", os.getpid())
    assert 0.3 <= _timed(run_json, 0.3) < 1.5


def test_waits_longer_once_rank_0_has_begun_its_record(tmp_path) -> None:
    run_json = tmp_path / "run.json"
    _write(run_json, "running", os.getpid())
    guard.mark_recording(tmp_path)  # rank 0 is writing: its fsync may hold it past the base wait
    threading.Timer(0.6, _write, (run_json, "failed", os.getpid())).start()
    start = time.monotonic()
    guard.wait_for_record(run_json, 0.2, 5)
    assert 0.5 < time.monotonic() - start < 3
