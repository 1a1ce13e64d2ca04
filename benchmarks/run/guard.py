"""Nothing lost on failure: a failed or killed run is recorded as `failed`, never left `running`.

- SIGTERM (what torchrun, horovodrun and mpirun send to the survivors when a rank dies) and SIGINT
  (Ctrl-C, passed on by torchrun and by distbench compare) are noticed by a watcher thread even while
  the main thread is blocked inside a collective; it records the failure and exits 128 + the signal.
- A rank whose launcher is gone (killed, so it could not stop its ranks) stops too, rather than train
  on unasked and record a completed run nobody is waiting for.
- A watchdog ends a rank that makes no progress for --timeout seconds, whatever it is waiting on.
- A rank other than 0 that fails with an exception leaves a note beside the run (when it can see the
  run directory), so rank 0 can name the root cause and the failing rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAILURE_NOTE = "failure-rank{rank}.json"
_wakeup_sockets: list[socket.socket] = []  # kept alive for the process: the signal machinery writes to one


STOP_SIGNALS = {
    signal.SIGTERM: "terminated by SIGTERM (a launcher stopping the job)",
    signal.SIGINT: "interrupted by SIGINT (Ctrl-C, or a launcher or distbench compare passing it on)",
}
"""The signals that stop a run, and how run.json says it."""


class LauncherGone(RuntimeError):
    """The launcher that started this rank (pid `parent`) is gone."""

    def __init__(self, parent: int | None) -> None:
        super().__init__(f"the launcher (pid {parent}) is gone, so the job was stopped")


def install_signal_watcher(on_signal: Callable[[str], None]) -> None:
    """Call `on_signal(why)` from a thread when SIGTERM or SIGINT arrives, then exit 128 + the signal.

    The thread alone acts: a rank blocked inside a collective runs no Python signal handler, and one
    that raised in the main thread would land anywhere — inside Horovod (which rewraps it), or between a
    lock's acquire and its `with` block, leaving the lock held while the failure waits for it past the
    5 s horovodrun's middleman gives before SIGKILL."""
    read_end, write_end = socket.socketpair()
    read_end.setblocking(True)
    write_end.setblocking(False)
    _wakeup_sockets.extend((read_end, write_end))

    def handler(signum: int, frame: Any) -> None:
        """Nothing: a Python handler must be set for the signal to reach the wakeup fd."""

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            data = read_end.recv(64)
            for signum, why in STOP_SIGNALS.items():
                if signum in data:
                    on_signal(why)
                    os._exit(128 + signum)

    threading.Thread(target=watch, name="distbench-signals", daemon=True).start()


RANK0_RECORD_WAIT_S = 2.0
"""How long a rank other than 0, stopped by a signal, waits for rank 0's record before it exits. Rank 0
writes in milliseconds, and the wait matters only under mpirun, which SIGKILLs everyone 1 s after its
SIGTERM anyway; a rank signalled alone (the job is not stopping) delays the job's end by this much."""
RANK0_WRITING_WAIT_S = 15.0
"""How long it waits once rank 0 has begun its record (RECORDING is there): the record ends in an fsync,
which on a busy disk has taken over 2 s (`make stress` lost one record of 510 so, under mpirun, while an
image build was writing)."""
RECORDING = ".recording"
"""Rank 0's mark in the run directory that it is recording a failure (made before anything that can wait)."""


def mark_recording(run_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (run_dir / RECORDING).touch()


def wait_for_record(
    run_json: Path, timeout: float = RANK0_RECORD_WAIT_S, writing: float = RANK0_WRITING_WAIT_S
) -> None:
    """Return once `run_json` no longer says `running`, its writer (rank 0, on this host) is gone, it cannot
    be read (another host's directory), or `timeout` has passed — `writing` once rank 0 has begun its record.

    A rank other than 0 calls this before it exits on a stop signal. Open MPI's mpirun (4.1) stops a job
    with SIGCONT, SIGTERM and SIGKILL, each after a `sleep(odls_base_sigkill_timeout)` of 1 s; the first
    rank to exit interrupts that sleep with a SIGCHLD, and `sleep` then returns the whole seconds left,
    0, so the SIGKILL follows at once. A rank 1 that exits first on the SIGTERM would take rank 0 down
    before its record is written, leaving run.json `running`."""
    start = time.monotonic()
    while time.monotonic() < start + (writing if (run_json.parent / RECORDING).exists() else timeout):
        try:
            meta = json.loads(run_json.read_text())
        except (OSError, ValueError):
            return
        if meta.get("status") != "running":
            return
        pid = meta.get("pid")
        if meta.get("host") == socket.gethostname() and pid and not pid_alive(int(pid)):
            return
        time.sleep(0.01)


def write_failure_note(run_dir: Path, rank: int, error: str) -> None:
    """Best effort: the run directory may live on a file system this rank cannot see."""
    try:
        if run_dir.is_dir():
            note = {"rank": rank, "host": socket.gethostname(), "error": error}
            (run_dir / FAILURE_NOTE.format(rank=rank)).write_text(json.dumps(note) + "\n")
    except OSError:
        pass


def read_failure_notes(run_dir: Path) -> list[dict[str, Any]]:
    notes = []
    for path in sorted(run_dir.glob(FAILURE_NOTE.format(rank="*"))):
        try:
            notes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return notes


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


ORPHAN_POLL_S = 0.1
"""How often the watchdog looks (a getppid and a clock read). Under mpirun a rank that has initialised MPI
(horovod@mpirun) is ended by Open MPI itself about 1 s after mpirun dies; the record must come first."""


class Watchdog:
    """Ends the process when the main thread makes no progress for `timeout` seconds, or when the launcher
    that started it (`parent`, a pid) is gone.

    Collective timeouts do not cover every stall (Horovod with the Gloo controller waits forever for a
    rank that hangs in Python), so the harness calls `beat()` after each step, gather and validation
    batch; a rank that stops beating records why and exits 1, and the launcher stops the rest.
    """

    def __init__(
        self, timeout: float, on_expire: Callable[[str], None], grace: float = 5.0, parent: int | None = None
    ) -> None:
        self.timeout, self.grace, self.on_expire, self.parent = timeout, grace, on_expire, parent
        self.last = time.monotonic()
        self.stopped = threading.Event()
        threading.Thread(target=self._watch, name="distbench-watchdog", daemon=True).start()

    def beat(self) -> None:
        self.last = time.monotonic()

    def stop(self) -> None:
        self.stopped.set()

    def orphaned(self) -> bool:
        """The launcher is gone: this process was handed to init (or a subreaper)."""
        return self.parent is not None and os.getppid() != self.parent

    def _watch(self) -> None:
        while not self.stopped.wait(min(ORPHAN_POLL_S, self.timeout / 4 + 0.01)):
            idle = time.monotonic() - self.last
            if self.orphaned():
                self.on_expire(str(LauncherGone(self.parent)))
                os._exit(1)
            if idle > self.timeout + self.grace:
                self.on_expire(f"no progress for {idle:.0f}s (--timeout {self.timeout:g}): a rank is hung or dead")
                os._exit(1)
