"""A real one-node Slurm for the tests: Debian's munged, slurmctld and slurmd, started as root with a config
generated in a temporary directory, and stopped (every one of them) at the end.

The daemons run in the foreground as children of the test process, each in its own session, so nothing they
start outlives them unnoticed: `stop()` ends them and `leftovers()` counts what of theirs is still running.
Their ports are free ones picked at start, and their sockets, state and logs stay in the directory, so the
cluster touches nothing of the machine's own Slurm or munge set-up (there may be none).

Across emulated hosts (benchmarks.suite.cluster), each host is a node of its own: one slurmd per host, in the
host's namespace under its name and address, slurmctld on the first host and munged here (its socket is a
path, which every namespace reaches). Slurm's commands then run on the first host (`command`), as a user's
would on a login node; the directory must lie outside /tmp, which the other hosts do not share.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from benchmarks.launch import placement
from benchmarks.suite import cluster as emulation

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
    """One node (this machine, under its own hostname), or one per emulated host of `hosts`, in one partition
    `debug` of all their CPUs."""

    def __init__(self, root: Path, hosts: emulation.Cluster | None = None) -> None:
        self.root = root
        self.hosts = hosts
        if hosts is None:
            self.nodes = [(socket.gethostname(), None, os.cpu_count() or 1)]
        else:
            self.nodes = [(h.name, h.address, len(placement.parse_cpu_list(h.cpus))) for h in hosts.hosts]
        self.node = self.nodes[0][0]
        """The controller's node, where Slurm's commands run."""
        self.conf = root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def on(self, index: int, argv: list[str]) -> list[str]:
        """`argv` run on node `index`: on its emulated host, or here."""
        return argv if self.hosts is None else self.hosts.on(self.hosts.hosts[index], argv)

    def command(self, argv: list[str]) -> list[str]:
        """A Slurm command (srun, salloc, sbatch, squeue, …) run where the controller can be reached."""
        return self.on(0, argv)

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
        name, address, _ = self.nodes[0]
        lines = {
            "ClusterName": "distbench",
            "SlurmctldHost": f"{name}({address})" if address else name,
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={run / 'munge.socket'}",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "SlurmctldPort": str(_free_port()),
            "SlurmdPort": str(_free_port()),
            "StateSaveLocation": str(self.root / "state"),
            "SlurmdSpoolDir": str(self.root / "spool" / "%n"),
            "SlurmctldPidFile": str(run / "slurmctld.pid"),
            "SlurmdPidFile": str(run / "slurmd-%n.pid"),
            "SlurmctldLogFile": str(self.root / "log" / "slurmctld.log"),
            "SlurmdLogFile": str(self.root / "log" / "slurmd-%n.log"),
            # No cgroups here: processes are tracked by their parentage, and tasks bound (--cpu-bind) by
            # sched_setaffinity, as on many small clusters.
            "ProctrackType": "proctrack/linuxproc",
            # Across emulated hosts, none: Slurm would number a host's cores from 0, not as its share of this
            # machine's; its tasks keep the host's cores instead.
            "TaskPlugin": "task/affinity" if self.hosts is None else "task/none",
            "MpiDefault": "none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU",
            "ReturnToService": "2",
            "KillWait": "10",
            "JobCompType": "jobcomp/none",
            "AccountingStorageType": "accounting_storage/none",
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        for node, address, cpus in self.nodes:
            at = f" NodeAddr={address}" if address else ""
            text += f"NodeName={node}{at} CPUs={cpus} State=UNKNOWN\n"
        nodes = ",".join(n for n, _, _ in self.nodes)
        text += f"PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP\n"
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
            "slurmctld": self.on(0, ["slurmctld", "-D", "-i", "-f", str(self.conf)]),
        }
        for i, (node, _, _) in enumerate(self.nodes):
            (self.root / "spool" / node).mkdir(exist_ok=True)
            slurmd = ["slurmd", "-D", "-N", node, "-f", str(self.conf)]
            if self.hosts is not None:  # `ip netns exec` mounts a sysfs of its own, without the cgroup mounts
                # slurmd's cgroup plugin reads (v1: a tmpfs with the `systemd` hierarchy it looks for; no controller,
                # which proctrack/linuxproc and task/affinity do not need). In the host's own mount namespace.
                cgroup = "/sys/fs/cgroup"
                mounts = (
                    f"mount -t tmpfs distbench-cgroup {cgroup} && mkdir {cgroup}/systemd && "
                    f"mount -t cgroup -o none,name=systemd distbench-systemd {cgroup}/systemd"
                )
                slurmd = ["sh", "-c", f'{mounts} && exec "$@"', "sh", *slurmd]
            commands[f"slurmd-{node}"] = self.on(i, slurmd)
        for name, argv in commands.items():
            log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 (the daemon holds it)
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()
            if name == "munged":
                self._wait_for(lambda: (run / "munge.socket").exists(), "munged's socket")
        self._wait_for(lambda: self.states() == ["idle"] * len(self.nodes), "node idle")

    def states(self) -> list[str]:
        """Each node's state, as sinfo says it."""
        argv = self.command(["sinfo", "-h", "-N", "-o", "%T"])
        return subprocess.run(argv, capture_output=True, text=True, env=self.env()).stdout.split()

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
        argv = self.command(["squeue", "-h", "-o", "%i %T"])
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env())
        return done.stdout.split("\n")[:-1] if done.returncode == 0 else []

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.root / "log").glob("*")))

    def stop(self) -> None:
        """Cancel every job, then end slurmd, slurmctld and munged (SIGTERM, SIGKILL after 15 s)."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            subprocess.run(
                self.command(["scancel", "--full", "-u", "root"]), env=self.env(), capture_output=True, timeout=30
            )
            deadline = time.monotonic() + 20  # slurmd's steps end (KillWait) before slurmd itself
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in reversed(self.procs):  # the slurmds, slurmctld, then munged
            proc = self.procs[name]
            if proc.poll() is not None:
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
