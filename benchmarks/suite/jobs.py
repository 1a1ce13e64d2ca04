"""The jobs that compare, tune and allreduce --compare start, and how a signal stops them.

Each job (a launcher command) starts in a session of its own, so a terminal's Ctrl-C reaches only this
process, which decides what stops. On SIGINT or SIGTERM the running job's whole process tree gets the
same signal, then SIGKILL after `GRACE_S`; no new job starts, and the command writes what completed.
A second signal during that clean-up kills the tree and exits at once.

The tree is followed process by process (psutil) rather than by one process group: torchrun and
horovodrun put each rank in a session of its own and mpirun each rank in a group of its own, so the job's
group alone holds only the launcher, and a launcher killed first leaves its ranks training on under init.

Imported by the parser of every `distbench` process: no torch, no analysis stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psutil

from benchmarks.errors import EXIT_INTERRUPTED

GRACE_S = 5.0
"""How long a job's processes get to record the interrupt and exit before SIGKILL (the launchers pass a
signal on and wait for their ranks; a rank records its run as failed first)."""
LEFTOVER_S = 2.0
"""How long processes of a job that ended by itself may outlive its launcher before they are killed."""
KILL_WAIT_S = 5.0
PEER_S = 30.0
"""How long the other processes of a job of several (torchrun on each host) may outlive one that failed."""
POLL_S = 0.25
SAID_BYTES = 16384
NOISE = re.compile(rb"plm:rsh: Warning: setpgid\(")
"""Lines of a job's stderr left out: Open MPI's rsh launcher warns that it could not set the process group of
an agent it had just started (its child had already exec'd the agent: a race the warning reports, harmless,
the rank starts as ever); on emulated hosts every mpirun job gave it. Said once, with `NOISE_WORDS`."""
NOISE_WORDS = (
    "distbench: note: Open MPI's 'plm:rsh: Warning: setpgid(…) failed in parent' lines are left out: its "
    "launcher lost a harmless race with the agent it had just started on another host; nothing failed"
)
STARTUP_POLLS = 40
"""Polls (10 s) during which the tree is looked at every time; then every 2 s, which costs the measured
runs next to nothing (a look lists every process, a few ms)."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ABORT_HOOKS: list[Callable[[], object]] = []
"""Run before a second signal ends the process at once (os._exit skips `finally`): e.g. removing the emulated
hosts a compare made."""


def _started(pid: int) -> float | None:
    """The start time of a live process; None once it is gone (or a zombie)."""
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


class Tree:
    """One job's processes: its launcher and everything it started, remembered while they are attached,
    so that ranks whose launcher died first are still found (a pid is trusted only with its start time)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.known: dict[int, tuple[float, int]] = {}  # pid → (start time, process group)
        self.refresh()

    def refresh(self) -> None:
        children: dict[int, list[int]] = {}
        started: dict[int, float] = {}
        for proc in psutil.process_iter(["ppid", "create_time", "status"]):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.info["create_time"] is not None:
                started[proc.pid] = proc.info["create_time"]
                children.setdefault(proc.info["ppid"], []).append(proc.pid)
        todo = [self.proc.pid, *self.known]
        while todo:
            pid = todo.pop()
            start = started.get(pid)
            if start is None or self.known.get(pid, (start,))[0] != start:
                continue  # gone, or the pid now belongs to another process
            if pid not in self.known:
                try:
                    self.known[pid] = (start, os.getpgid(pid))
                except OSError:
                    continue  # gone since the listing
            todo += [c for c in children.get(pid, []) if c not in self.known]

    def alive(self) -> list[int]:
        return [pid for pid, (start, _) in self.known.items() if _started(pid) == start]

    def signal(self, signum: int) -> None:
        """`signum` to every live process of the job and to the groups they lead (a rank's loader workers)."""
        live = self.alive()
        groups = {self.known[pid][1] for pid in live if self.known[pid][1] in live}
        for pgid in groups:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signum)
        for pid in live:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    def kill(self) -> None:
        self.refresh()
        self.signal(signal.SIGKILL)


class Forest:
    """The trees of a job of several processes (torchrun on each host), handled as one."""

    def __init__(self, trees: list[Tree]) -> None:
        self.trees = trees

    def refresh(self) -> None:
        for tree in self.trees:
            tree.refresh()

    def alive(self) -> list[int]:
        return [pid for tree in self.trees for pid in tree.alive()]

    def signal(self, signum: int) -> None:
        for tree in self.trees:
            tree.signal(signum)

    def kill(self) -> None:
        for tree in self.trees:
            tree.kill()


class Supervisor:
    """SIGINT and SIGTERM handling for a command that runs jobs, one at a time (a context manager)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.signum: int | None = None
        """The first stop signal received, None while none has been."""
        self.tree: Tree | Forest | None = None
        self.said = b""
        """The last `SAID_BYTES` of what the last job wrote to stderr (every process of it), for its launcher's
        own words on why it ended (e.g. Slurm's step cancelled)."""
        self._old: dict[int, object] = {}
        self._old_wakeup = -1

    def __enter__(self) -> Supervisor:
        self._old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        # A run made in this process earlier (a test, a notebook) leaves a signal watcher thread reading the
        # wakeup fd, which would end the process on our signal: it must not see the signals meant for here.
        self._old_wakeup = signal.set_wakeup_fd(-1)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._old.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if self._old_wakeup != -1:
            signal.set_wakeup_fd(self._old_wakeup, warn_on_full_buffer=False)

    @property
    def interrupted(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum  # the job loop passes it on: this handler may run in the middle of it
            return
        if self.tree is not None:
            self.tree.kill()
        print(
            f"distbench: interrupted again; stopped at once, results in {self.root} may be incomplete",
            file=sys.stderr,
            flush=True,
        )
        for hook in ABORT_HOOKS:
            with contextlib.suppress(Exception):
                hook()
        os._exit(EXIT_INTERRUPTED)

    def run(self, cmd: list[str], env: dict[str, str], log: Path) -> int:
        """Run one job to its end and return its exit code; once interrupted, stop its whole tree.

        The job's stderr is passed through until the interrupt; what it says after that (launchers'
        tracebacks, ranks' failure lines) goes to the file `log` instead of the terminal.
        """
        return self.run_all([cmd], env, log)

    def run_all(self, cmds: list[list[str]], env: dict[str, str], log: Path) -> int:
        """`run` for a job of several processes started together (torchrun on each host): its exit code is the
        first non-zero one; once one process has failed, the rest get `PEER_S` to end before they are stopped
        (a peer waiting on a rendezvous that will never complete would wait out its own timeout)."""
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for cmd in cmds:  # no stdin: an ssh among them would otherwise read the terminal
                procs.append(
                    subprocess.Popen(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        env=env,
                        start_new_session=True,
                    )
                )
        except OSError:
            for proc in procs:  # what started of the job is not left unsupervised
                Tree(proc).kill()
                proc.wait()
            raise
        trees = [Tree(proc) for proc in procs]
        self.said = b""
        self.tree = trees[0] if len(trees) == 1 else Forest(trees)
        tree = self.tree
        copiers = [threading.Thread(target=self._copy, args=(p.stderr, log), daemon=True) for p in procs]
        for copier in copiers:
            copier.start()
        deadline: float | None = None
        peers_until: float | None = None
        first_failure: int | None = None  # the first process to fail says why: the others are stopped after it
        polls = 0
        while True:
            if self.signum is not None and deadline is None:
                tree.refresh()  # before any process dies and leaves its children under init
                tree.signal(self.signum)
                deadline = time.monotonic() + GRACE_S
            with contextlib.suppress(subprocess.TimeoutExpired):
                next(p for p in procs if p.returncode is None).wait(timeout=POLL_S)
            polls += 1
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if peers_until is None and any(codes):
                peers_until = time.monotonic() + PEER_S
                first_failure = next(c for c in codes if c)
            if deadline is None and peers_until is not None and time.monotonic() > peers_until:
                tree.refresh()
                tree.signal(signal.SIGTERM)
                deadline = time.monotonic() + GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                tree.kill()
            elif polls < STARTUP_POLLS or polls % 8 == 0:  # processes appear at start-up: look often then
                tree.refresh()
        self._reap(tree, deadline)
        self.tree = None
        for copier in copiers:
            copier.join(timeout=GRACE_S)
        codes = [p.returncode for p in procs]
        return first_failure or next((c for c in codes if c), 0)

    def _reap(self, tree: Tree | Forest, deadline: float | None) -> None:
        """Processes of the job that outlive its launcher: given until the deadline (or `LEFTOVER_S`), then killed."""
        until = deadline if deadline is not None else time.monotonic() + LEFTOVER_S
        while tree.alive() and time.monotonic() < until:
            time.sleep(POLL_S)
        if tree.alive():
            tree.kill()
        gone_by = time.monotonic() + KILL_WAIT_S  # SIGKILL is not instant: return once they are gone
        while tree.alive() and time.monotonic() < gone_by:
            time.sleep(0.05)

    def _copy(self, stream: IO[bytes], path: Path) -> None:
        log: IO[bytes] | None = None
        held = b""  # a line's start, until its end comes: a noise line is left out whole
        try:
            while True:
                chunk = os.read(stream.fileno(), 65536)
                lines, held = _without_noise(held + chunk) if chunk else (b"", held)
                if not chunk or len(held) > SAID_BYTES:  # the stream's end, or a "line" that never ends
                    lines, held = lines + held, b""
                if lines:
                    log = self._pass_on(lines, log, path)
                if not chunk:
                    break
        except (OSError, ValueError):
            pass  # the terminal or the log went away: the job's output is not worth failing over
        finally:
            stream.close()
            if log is not None:
                log.close()

    def _pass_on(self, lines: bytes, log: IO[bytes] | None, path: Path) -> IO[bytes] | None:
        """To the terminal until the interrupt, to the file `path` after it; returns the file once opened."""
        self.said = (self.said + lines)[-SAID_BYTES:]
        if self.signum is None:
            sys.stderr.buffer.write(lines)
            sys.stderr.flush()
            return log
        if log is None:
            log = open(path, "ab")  # noqa: SIM115 (closed by _copy)
        log.write(lines)
        return log

    def closing_line(self) -> str:
        """The last line an interrupted command prints."""
        return f"distbench: interrupted; partial results in {self.root}"


_noise_said = threading.Event()


def _without_noise(data: bytes) -> tuple[bytes, bytes]:
    """`data`'s complete lines less the `NOISE` ones, and the start of a line still to come (held back until its
    end, or the stream's). The first noise line of this process is replaced by `NOISE_WORDS`, the rest dropped."""
    end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # a bar redrawn with \r (a rank on a pty) ends there
    complete, held = data[:end], data[end:]
    if not NOISE.search(complete):
        return complete, held
    kept = []
    for line in complete.splitlines(keepends=True):  # \r, \n and \r\n each end a line, kept as they came
        if not NOISE.search(line):
            kept.append(line)
        elif not _noise_said.is_set():
            _noise_said.set()
            kept.append(NOISE_WORDS.encode() + b"\n")
    return b"".join(kept), held


def record_interrupted(run_dir: Path, signame: str = "", command: str = "", why: str | None = None) -> bool:
    """Mark a run that an interrupt stopped as failed, `interrupted`, whatever its ranks managed to record
    (`running`, or a peer's lost connection); False for a run that completed meanwhile, which stays so.
    `why` replaces the error's words for a stop that came from elsewhere (Slurm cancelling a step)."""
    from benchmarks.run import recorder

    path = run_dir / recorder.RUN_JSON
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return True  # stopped before rank 0 wrote anything
    if meta.get("status") == "completed":
        return False
    said = meta.get("error")
    seen = {"rank_error": said} if said and not str(said).startswith("interrupted") else {}
    recorder.write_json_atomic(
        path,
        {
            **meta,
            **seen,
            "status": "failed",
            "interrupted": True,
            "error": f"interrupted: {why or f'{signame} to {command} stopped the job'}",
        },
    )
    return True


SAYS_WHY = re.compile(r"error|exception|not found|no such|denied|unable|cannot|failed", re.IGNORECASE)


def last_said(said: bytes) -> str | None:
    """The last line of a job's stderr that names a failure (a traceback's exception, a launcher's error;
    advice printed after it is passed over), else its last line with words; None when it said nothing."""
    lines = [line.strip() for line in said.decode(errors="replace").splitlines()]
    worded = [line for line in lines if any(c.isalpha() for c in line)]
    return next((line for line in reversed(worded) if SAYS_WHY.search(line)), worded[-1] if worded else None)


def record_launcher_died(run_dir: Path, meta: dict[str, Any], code: int, said: bytes) -> str:
    """A run whose launcher exited `code` before any rank wrote run.json: its run directory, recorded failed
    with the launcher's last line as the error (the table and comparison.csv show it). Returns the error."""
    from benchmarks.run import recorder

    line = last_said(said)
    error = f"the launcher exited {code} before any rank started" + (f": {line}" if line else " (it said nothing)")
    recorder.Recorder(run_dir, meta).finish("failed", error=error, launcher_failed=True)
    return error
