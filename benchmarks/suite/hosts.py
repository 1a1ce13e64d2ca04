"""Where the ranks of a job run, and the one place that turns a variant into its launcher's command lines.

- this machine (no host option): every launcher's single-node form, as before;
- a host list (`--hosts h0:2,h1:2`, or `--hostfile` in horovodrun/mpirun's `host slots=N` form): the other
  hosts are reached over ssh, as horovodrun and mpirun reach them;
- emulated hosts (`--emulate-hosts N --link RATE`, or `--cluster NAME` for one `distbench cluster up` made):
  network namespaces on this machine (benchmarks.suite.cluster), whose `ssh` stand-in reaches them.

Across hosts, `--nproc` is the world size, spread over the hosts in the order given as evenly as their slots
allow (`Hosts.counts`); rank 0 runs on the first host, which writes every result file (the others need no
shared disk). The launchers' forms: torchrun on every host (`--nnodes N --node-rank i --nproc-per-node K_i`,
its static rendezvous on the first host: c10d would order the nodes by name, and rank 0 could land
elsewhere), `mpirun -H`, `horovodrun -H` (--gloo or --mpi) and, for a one-process variant, python on the
first host. The network interface (`--iface`; default: the one of the route to the first other host) is
handed to each framework its own way. The options that name the hosts are parsed in
benchmarks.suite.host_options.

Imported by the parser of every `distbench` process: no torch, no analysis stack.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import backends
from benchmarks import environment, launch
from benchmarks.errors import InputError
from benchmarks.launch import placement
from benchmarks.launch.variants import Variant
from benchmarks.suite import cluster as emulation
from benchmarks.suite import slurm

SSH = ("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no")
REACH_TIMEOUT_S = 20.0
"""How long a host may take to answer `ssh HOST true` before it is called unreachable (nothing is started)."""
IFACE_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE")
"""torch.distributed's Gloo, NCCL and Horovod's Gloo controller take the interface from these; mpirun from
its --mca btl_tcp_if_include / oob_tcp_if_include and horovodrun from --network-interface."""


@dataclass(frozen=True)
class Slot:
    name: str
    slots: int | None = None
    """Ranks the host may take (None: as many as asked, e.g. an emulated host)."""


@dataclass
class Hosts:
    """Where a compare's ranks run. No slots: this machine alone."""

    slots: list[Slot] = field(default_factory=list)
    iface: str | None = None
    cluster: emulation.Cluster | None = None
    """The emulated hosts the slots name, when they are emulated (commands then run in their namespaces)."""
    ssh: tuple[str, ...] = SSH

    @property
    def many(self) -> bool:
        return bool(self.slots)

    def counts(self, nproc: int) -> list[int]:
        """Ranks per host, in the order given, for a world of `nproc`: as even as the slots allow, the first
        hosts taking one more where they do not divide (2 and 1 for a hostfile `h0 slots=2` / `h1 slots=1`, as
        horovodrun and mpirun fill it; 1 and 1 for `--nproc 2`, so a world across hosts crosses them). Ranks
        are numbered host after host: rank 0 on the first. A host may get none (`--nproc 1`)."""
        if not self.slots:
            return [nproc]
        caps = [s.slots if s.slots is not None else nproc for s in self.slots]
        counts = [0] * len(caps)
        left = min(nproc, sum(caps))
        while left:
            for i, cap in enumerate(caps):
                if left and counts[i] < cap:
                    counts[i] += 1
                    left -= 1
        return counts

    def placed(self, nproc: int) -> list[tuple[Slot, int]]:
        """The hosts that get ranks, each with its count, in order."""
        return [(s, k) for s, k in zip(self.slots, self.counts(nproc), strict=True) if k]

    def check_sizes(self, sizes: list[int]) -> None:
        """Every world size fits the hosts' slots (InputError otherwise)."""
        if not self.slots or any(s.slots is None for s in self.slots):
            return
        room = sum(s.slots or 0 for s in self.slots)
        for size in sizes:
            if size > room:
                slots = ", ".join(f"{s.name} {s.slots}" for s in self.slots)
                raise InputError(
                    f"--nproc {size} is more ranks than the hosts' {room} slots ({slots}); give at most {room}"
                )

    def cores(self, slot: Slot) -> int:
        """A host's cores: an emulated host's own; a remote host is taken to be like this one."""
        if self.cluster is not None:
            return len(placement.parse_cpu_list(self.cluster.host(slot.name).cpus))
        return max(1, int(placement.host_cpus()))

    def threads(self, nproc: int) -> int:
        """Threads per rank, the same for every rank: the fewest any host allows (its cores ÷ its ranks)."""
        if not self.slots:
            return launch.default_threads(nproc)
        if self.cluster is None:
            return min(launch.default_threads(k) for _, k in self.placed(nproc))
        return max(1, min(self.cores(s) // k for s, k in self.placed(nproc)))

    def oversubscription(self, nproc: int) -> str | None:
        """Before anything runs: the warning a run would give, when `nproc` ranks get more ranks than cores on a
        host, or emulated hosts share cores (None for remote hosts, whose cores are theirs to say)."""
        if self.cluster is not None:
            placed = self.placed(nproc)
            hosts = [self.cluster.host(s.name) for s, _ in placed]
            if all(k <= self.cores(s) for s, k in placed) and not any(h.shared for h in hosts):
                return None
            shared = " sharing cores" if any(h.shared for h in hosts) else ""
            cores = len({c for h in hosts for c in placement.parse_cpu_list(h.cpus)})
            return (
                f"{nproc} ranks on {len(hosts)} emulated hosts{shared}, {cores} cores in all: this measures "
                "time-slicing, not scaling, and never decides"
            )
        if self.slots:
            return None
        cores = placement.host_cpus()
        if nproc <= cores:
            return None
        return f"{nproc} ranks on {cores:g} cores: this measures time-slicing, not scaling, and never decides"

    def env(self) -> dict[str, str]:
        """What every job's processes get on top of this process's environment."""
        return dict.fromkeys(IFACE_ENV, self.iface) if self.iface else {}

    def host_list(self, nproc: int) -> str:
        """mpirun's and horovodrun's -H: each host with its ranks, which they fill in order."""
        return ",".join(f"{s.name}:{k}" for s, k in self.placed(nproc))

    def on(self, index: int, argv: list[str], env: dict[str, str]) -> list[str]:
        """`argv` run on host `index`: in its namespace (emulated), here (this machine), or over ssh, which
        passes no environment: `env` goes on the command line, and the working directory with it."""
        if self.cluster is not None:
            return self.cluster.on(self.cluster.host(self.slots[index].name), argv)
        if not self.slots or is_local(self.slots[index].name):
            return argv
        assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**forwarded(), **env}.items())
        remote = f"cd {shlex.quote(os.getcwd())} && env {assigned} {shlex.join(argv)}"
        # -tt: a remote command whose ssh is stopped gets SIGHUP, so a stopped job leaves no rank behind there.
        return [*self.ssh, "-tt", self.slots[index].name, remote]

    def commands(self, variant: Variant, nproc: int, args: list[str], env: dict[str, str]) -> list[list[str]]:
        """The command lines (one per process to start here) that run `nproc` ranks of `distbench <args>`."""
        if variant.launcher == launch.SRUN:  # a step of this allocation, wherever its nodes are
            return [[*slurm.step(variant, nproc, int(env.get("OMP_NUM_THREADS", "1"))), *args]]
        if not self.slots:
            return [[*launcher_command(variant, nproc), *args]]
        module = [sys.executable, "-m", "benchmarks.cli", *args]
        if variant.launcher == launch.PYTHON:
            return [self.on(0, module, env)]
        if variant.launcher == launch.TORCHRUN:  # each node its own --nproc-per-node: ranks follow node order
            port = str(random.randint(20000, 29999))
            placed = self.placed(nproc)
            torchrun = [str(Path(sys.executable).parent / "torchrun"), f"--nnodes={len(placed)}"]
            first = ["--master-addr", self.slots[0].name, "--master-port", port]
            return [
                self.on(
                    self.slots.index(s),
                    [*torchrun, f"--nproc-per-node={k}", f"--node-rank={i}", *first, "-m", "benchmarks.cli", *args],
                    env,
                )
                for i, (s, k) in enumerate(placed)
            ]
        if variant.launcher == launch.HOROVODRUN:
            nic = ["--network-interface", self.iface] if self.iface else []
            run = [str(Path(sys.executable).parent / "horovodrun"), "-np", str(nproc), "-H", self.host_list(nproc)]
            run += horovodrun_cache()
            return [self.on(0, [*run, f"--{variant.controller}", *nic, *module], env)]
        if variant.launcher == launch.MPIRUN:
            return [self.on(0, self.mpirun(nproc, env, module), env)]
        raise ValueError(f"no launch command for {variant.name}")

    def mpirun(self, nproc: int, env: dict[str, str], module: list[str]) -> list[str]:
        argv = [*mpirun_base(nproc), "-H", self.host_list(nproc)]
        if self.cluster is not None:
            argv += ["--mca", "plm_rsh_agent", str(self.cluster.agent)]
        if self.iface:
            argv += ["--mca", "btl_tcp_if_include", self.iface, "--mca", "oob_tcp_if_include", self.iface]
        for name in sorted({*forwarded(), *env}):  # mpirun passes no variable to another host unless told
            argv += ["-x", name]
        return [*argv, *module]

    def launch_words(self, variant: Variant, nproc: int) -> str:
        """How a job across the hosts starts, for its progress line: `torchrun on h0:1,h1:1`."""
        where = self.slots[0].name if variant.launcher == launch.PYTHON else self.host_list(nproc)
        return f"{variant.launch_words()} on {where}"

    def words(self) -> str:
        """The start-up line's phrase for where the ranks run."""
        if not self.slots:
            return "this machine"
        where = self.cluster.describe() if self.cluster is not None else ", ".join(s.name for s in self.slots)
        return f"hosts {where}; interface {self.iface or 'the frameworks’ own choice'}"

    def check(self) -> None:
        """Before any job: every host resolves to an address of its own and answers, each in bounded time.
        InputError (one line naming the host) otherwise; nothing is started."""
        if not self.slots:
            return
        seen: dict[str, str] = {}
        remote = self.cluster is not None or any(not is_local(s.name) for s in self.slots)
        for s in self.slots:
            address = self.address(s.name)
            if remote and ipaddress.ip_address(address).is_loopback:
                raise InputError(
                    f"host {s.name} resolves to {address}, which the other hosts cannot reach (rank 0's rendezvous "
                    f"is on the first host); name it by a name they resolve, e.g. {socket.gethostname()}"
                )
            if address in seen:
                raise InputError(
                    f"hosts {seen[address]} and {s.name} both resolve to {address}: ranks meant for one would "
                    "meet on the other; name each host once, by a name that resolves to that host"
                )
            seen[address] = s.name
        for s in self.slots:
            if problem := self.unreachable(s.name):
                raise InputError(f"host {s.name} is unreachable: {problem}; nothing was started")

    def address(self, name: str) -> str:
        if self.cluster is not None:
            try:
                return self.cluster.host(name).address
            except KeyError:
                names = ", ".join(h.name for h in self.cluster.hosts)
                raise InputError(f"host {name} is not one of cluster {self.cluster.name}'s ({names})") from None
        try:
            return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
        except (OSError, IndexError) as exc:
            raise InputError(f"host {name} does not resolve ({exc}); fix its name or /etc/hosts") from None

    def unreachable(self, name: str) -> str | None:
        """Why host `name` cannot be reached, in words; None when it answers."""
        if self.cluster is not None:
            host = self.cluster.host(name)
            state = emulation.link_state(self.cluster, host)
            return None if state == "up" else f"its link ({host.netns}) is {state}"
        if is_local(name):
            return None
        try:
            done = subprocess.run(
                [*self.ssh, "-o", f"ConnectTimeout={int(REACH_TIMEOUT_S)}", name, "true"],
                capture_output=True,
                text=True,
                timeout=REACH_TIMEOUT_S + 5,
            )
        except subprocess.TimeoutExpired:
            return f"ssh {name} true did not answer in {REACH_TIMEOUT_S:.0f} s"
        except FileNotFoundError:
            return "ssh is not installed here"
        said = done.stderr.strip().splitlines()
        return None if done.returncode == 0 else f"ssh exited {done.returncode}: {said[-1] if said else 'no reason'}"

    def diagnose(self) -> str | None:
        """After a failed job: the hosts that no longer answer, in one phrase (None when all do)."""
        lost = [f"{s.name} ({why})" for s in self.slots if (why := self.unreachable(s.name))]
        return f"host unreachable: {', '.join(lost)}" if lost else None


def check_hostname(chosen: list[Variant], hosts: Hosts, asked: bool = True) -> list[Variant]:
    """On this machine alone, every launcher but Horovod's Gloo controller rendezvouses without the hostname
    resolving (torchrun at --local-addr, mpirun's ranks at 127.0.0.1); Horovod 0.28.1 resolves it for each
    process set's Gloo device whatever HOROVOD_GLOO_IFACE says, and crashes (SIGSEGV) when it does not
    resolve. A Gloo variant the user `asked` for is refused before anything starts (InputError); the default
    set leaves it out, in one line, so that a container without a network still compares the rest. Across
    hosts every name is resolved by `Hosts.check`. Returns the variants to run."""
    gloo = [v for v in chosen if v.launcher == launch.HOROVODRUN and v.controller == "gloo"]
    if hosts.many or not gloo:
        return chosen
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
        return chosen
    except OSError:
        pass
    fix = f"add '127.0.1.1 {name}' to /etc/hosts (docker run: --hostname localhost, or --add-host {name}:127.0.1.1)"
    if asked:
        raise InputError(
            f"this machine's hostname {name} does not resolve, and {gloo[0].name} needs it to (Horovod's Gloo "
            f"controller looks it up); {fix}, or compare horovod@mpi instead"
        )
    print(
        f"distbench: warning: this machine's hostname {name} does not resolve, which Horovod's Gloo controller "
        f"needs: {', '.join(v.name for v in gloo)} left out of the default variants; to compare it, {fix}",
        file=sys.stderr,
    )
    return [v for v in chosen if v not in gloo]


def forwarded() -> dict[str, str]:
    """The variables of this environment that can change a measurement (benchmarks.environment's rule, secrets
    left out): handed to the ranks on other hosts too, which ssh and mpirun would not do, so that every rank
    runs under the same settings as the first host's."""
    recorded = environment.recorded_variables(os.environ)
    found = {k: os.environ[k] for k, v in recorded.items() if v != environment.REDACTED and k in os.environ}
    # What makes a rank elsewhere a rank of this compare too: the backends declared by a module of one's own
    # and DeepSpeed's accelerator.
    return found | {k: os.environ[k] for k in (backends.PLUGINS_ENV, "DS_ACCELERATOR") if k in os.environ}


def launcher_command(variant: Variant, nproc: int) -> list[str]:
    """argv prefix that starts `nproc` ranks of `python -m benchmarks.cli` on this machine under the variant's
    launcher."""
    bin_dir = Path(sys.executable).parent
    module = [sys.executable, "-m", "benchmarks.cli"]
    if variant.launcher == launch.PYTHON:
        return module
    if variant.launcher == launch.TORCHRUN:
        # --local-addr: the ranks reach the agent's store at 127.0.0.1, not at this machine's hostname, which
        # need not resolve on one host (a container, a pod): torchrun would retry it for minutes.
        return [
            str(bin_dir / "torchrun"),
            "--standalone",
            "--local-addr=127.0.0.1",
            f"--nproc-per-node={nproc}",
            "-m",
            "benchmarks.cli",
        ]
    if variant.launcher == launch.HOROVODRUN:  # --mpi: horovodrun adds --allow-run-as-root and -H localhost:N
        return [str(bin_dir / "horovodrun"), "-np", str(nproc), f"--{variant.controller}", *horovodrun_cache(), *module]
    if variant.launcher == launch.MPIRUN:
        return [*mpirun_base(nproc), *module]
    raise ValueError(f"no launch command for {variant.name}")


def horovodrun_cache() -> list[str]:
    """horovodrun keeps the results of its start-up checks in ~/.horovod and dies when it cannot make that
    folder (a container's user with no home, a read-only root): `--disable-cache` then, which costs only the
    checks being made again."""
    try:
        (Path(os.path.expanduser("~")) / ".horovod").mkdir(exist_ok=True)
    except OSError:
        return ["--disable-cache"]
    return []


def mpirun_base(nproc: int) -> list[str]:
    """distbench's mpirun, on one host or many: unbound, as under the other launchers (each rank applies --bind
    itself), ranks beyond the cores allowed, and root allowed where it runs as root."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", "-np", str(nproc), "--oversubscribe", *placement.MPIRUN_ARGS, *root]


def is_local(name: str) -> bool:
    """Whether `name` is this machine: its hostname, localhost, or a name of one of its addresses."""
    if name in ("localhost", socket.gethostname()):
        return True
    try:
        address = socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        return False
    return ipaddress.ip_address(address).is_loopback or address in local_addresses()


def local_addresses() -> set[str]:
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}


def route_iface(name: str) -> str | None:
    """The interface of this machine's route to host `name` (`ip route get`), None where unknown."""
    try:
        address = socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
        out = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True, timeout=5).stdout
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bdev (\S+)", out)
    return match.group(1) if match else None
