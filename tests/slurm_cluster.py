"""A real one-node Slurm for the tests: Debian's munged, slurmctld and slurmd, started as root with a config
generated in a temporary directory, and stopped (every one of them) at the end.

The daemons run in the foreground as children of the test process, each in its own session, so nothing they
start outlives them unnoticed: `stop()` ends them and `leftovers()` counts what of theirs is still running.
Their ports are free ones picked at start, and their sockets, state and logs stay in the directory, so the
cluster touches nothing of the machine's own Slurm or munge set-up (there may be none).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
READY_S = 60.0
"""How long the node may take to be idle once the daemons started."""


def missing() -> str | None:
    """Why a Slurm cannot be started here, in words (None when it can)."""
    absent = [d for d in (*DAEMONS, "srun", "sbatch", "salloc") if shutil.which(d) is None]
    if absent:
        return f"{', '.join(absent)} not installed (make setup installs slurm-wlm and munge as root)"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One node (this machine, under its own hostname) in one partition `debug` of all its CPUs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname()
        self.cpus = os.cpu_count() or 1
        self.conf = root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose srun, sbatch, salloc and scancel talk to this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        run = self.root / "run"
        for sub in ("run", "state", "spool", "log"):
            (self.root / sub).mkdir(mode=0o755, exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        lines = {
            "ClusterName": "distbench",
            "SlurmctldHost": self.node,
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={run / 'munge.socket'}",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "SlurmctldPort": str(_free_port()),
            "SlurmdPort": str(_free_port()),
            "StateSaveLocation": str(self.root / "state"),
            "SlurmdSpoolDir": str(self.root / "spool"),
            "SlurmctldPidFile": str(run / "slurmctld.pid"),
            "SlurmdPidFile": str(run / "slurmd.pid"),
            "SlurmctldLogFile": str(self.root / "log" / "slurmctld.log"),
            "SlurmdLogFile": str(self.root / "log" / "slurmd.log"),
            # No cgroups here: processes are tracked by their parentage, and tasks bound (--cpu-bind) by
            # sched_setaffinity, as on many small clusters.
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/affinity",
            "MpiDefault": "none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU",
            "ReturnToService": "2",
            "KillWait": "10",
            "JobCompType": "jobcomp/none",
            "AccountingStorageType": "accounting_storage/none",
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        text += f"NodeName={self.node} CPUs={self.cpus} State=UNKNOWN\n"
        text += f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)

    def start(self) -> None:
        """Start the three daemons and wait until the node is idle (RuntimeError with their logs otherwise)."""
        self._write_config()
        run = self.root / "run"
        commands = {
            "munged": [
                "munged",
                "--foreground",
                "--force",
                f"--socket={run / 'munge.socket'}",
                f"--key-file={self.root / 'munge.key'}",
                f"--pid-file={run / 'munged.pid'}",
                f"--seed-file={self.root / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            ],
            "slurmctld": ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            "slurmd": ["slurmd", "-D", "-f", str(self.conf)],
        }
        for name, argv in commands.items():
            log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 (the daemon holds it)
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()
            if name == "munged":
                self._wait_for(lambda: (run / "munge.socket").exists(), "munged's socket")
        self._wait_for(lambda: self.state() == "idle", f"node {self.node} idle")

    def state(self) -> str:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T", "-n", self.node], capture_output=True, text=True, env=self.env()
        )
        return done.stdout.strip()

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_S
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"test Slurm: no {what} ({', '.join(dead) or 'timed out'}):\n{self.logs()}")
            time.sleep(0.2)

    def jobs(self) -> list[str]:
        """The jobs the controller still knows of, as `id state` lines."""
        done = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, env=self.env())
        return done.stdout.split("\n")[:-1] if done.returncode == 0 else []

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.root / "log").glob("*")))

    def stop(self) -> None:
        """Cancel every job, then end slurmd, slurmctld and munged (SIGTERM, SIGKILL after 15 s)."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env(), capture_output=True, timeout=30)
            deadline = time.monotonic() + 20  # slurmd's steps end (KillWait) before slurmd itself
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def leftovers(self) -> list[str]:
        """What of this cluster still runs: its daemons, any slurmstepd, and every process started with its
        SLURM_CONF (a job's ranks), as `pid command line`."""
        import psutil

        mark = f"SLURM_CONF={self.conf}"
        found = []
        for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
            with contextlib.suppress(psutil.Error, OSError):
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue  # ended; its parent has yet to reap it
                line = " ".join(proc.info["cmdline"] or [proc.info["name"] or ""])
                if proc.pid == os.getpid():
                    continue
                if str(self.root) in line or (proc.info["name"] or "").startswith("slurmstepd"):
                    found.append(f"{proc.pid} {line}")
                elif mark in Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace").split("\0"):
                    found.append(f"{proc.pid} {line}")
        return found
