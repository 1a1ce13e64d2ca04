"""`distbench cluster`: emulated hosts on one machine, so that a compare crosses a network that costs what a
real one does instead of loopback.

    distbench cluster up --hosts 2 --link 1gbit      # hosts h0 and h1, each link capped at 1 Gbit/s
    distbench cluster exec h0 -- hostname            # a command on one host (prints h0)
    distbench cluster status                         # what is up
    distbench cluster down                           # remove it (and whatever a killed run left)

Each host is a network namespace `distbench-<cluster>-h<i>` with an `eth0` whose other end is a port of a
bridge in a namespace of its own (the switch, `distbench-<cluster>-sw`); both ends of every link are capped
with `tc … tbf` at the link's rate, so each direction is. Addresses are link-local (169.254.100.0/24) and exist
only inside these namespaces. A command on a host runs in its namespace with the host's name (a UTS
namespace of its own and /etc/netns/<ns>/hosts naming every host), confined to the host's share of the
cores (`taskset`); every host but the first has a private /tmp, as hosts of a cluster share no disk.

`ssh` in the cluster's bin/ directory stands in for ssh between the hosts (horovodrun and mpirun reach
the other hosts through it): it takes ssh's options and `HOST COMMAND…` and runs COMMAND on HOST.

One owner: this module makes and removes every namespace, veth and file of a cluster; the rank side only
reads the description (benchmarks.launch.emulated).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import errors, files
from benchmarks.errors import InputError
from benchmarks.launch import emulated, placement
from benchmarks.launch.network import UNLIMITED, parse_rate
from benchmarks.suite import jobs

SUBNET = "169.254.100"
"""Link-local (RFC 3927): never routed, and only ever inside namespaces distbench made."""
IFACE = "eth0"
DEFAULT_NAME = "dbc"
ETC_NETNS = Path("/etc/netns")
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


@dataclass
class Host:
    name: str
    netns: str
    address: str
    cpus: str
    """The host's cores, in the kernel's list format ('0', '0-1')."""
    shared: bool
    """Another host uses these cores too (more hosts than cores): its runs are oversubscribed."""


@dataclass
class Cluster:
    name: str
    link: str
    """The link's rate as given ('1gbit', 'unlimited'), capped on both ends of every host's link."""
    rate_bps: int | None
    hosts: list[Host]
    switch: str
    created: str
    keep: list[str] = field(default_factory=list)
    """Directories under /tmp that every host sees (the Python environment and the checkout running distbench,
    as software is installed on every host of a cluster): the private /tmp of the other hosts leaves them be."""

    @property
    def bin_dir(self) -> Path:
        """Holds the `ssh` stand-in: first on PATH, horovodrun and mpirun reach the other hosts through it."""
        return emulated.STATE_DIR / self.name / "bin"

    @property
    def agent(self) -> Path:
        return self.bin_dir / "ssh"

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if name in (host.name, host.address):
                return host
        raise KeyError(name)

    def on(self, host: Host, argv: Sequence[str]) -> list[str]:
        """`argv` run on `host`: its namespace, its name, its cores, and (but on the first host) its own /tmp."""
        private = "" if host is self.hosts[0] else self._private_tmp()
        script = f'hostname "$0" && {private}PATH={shlex.quote(str(self.bin_dir))}:"$PATH" exec "$@"'
        return [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--uts",
            "taskset",
            "-c",
            host.cpus,
            "sh",
            "-c",
            script,
            host.name,
            *argv,
        ]

    def _private_tmp(self) -> str:
        """The shell that gives a host a /tmp of its own: `keep` is moved aside (a bind mount in the state
        directory, this command's mount namespace only), /tmp becomes an empty tmpfs, and `keep` comes back."""
        hold = emulated.STATE_DIR / self.name / "hold"
        aside = "".join(f"mount --bind {shlex.quote(k)} {hold}/{i} && " for i, k in enumerate(self.keep))
        back = "".join(
            f"mkdir -p {shlex.quote(k)} && mount --move {hold}/{i} {shlex.quote(k)} && "
            for i, k in enumerate(self.keep)
        )
        return f"{aside}mount -t tmpfs -o mode=1777 distbench-tmp /tmp && {back}"

    def describe(self) -> str:
        hosts = ", ".join(f"{h.name} {h.address} cores {h.cpus}{' (shared)' if h.shared else ''}" for h in self.hosts)
        return f"cluster {self.name}: {len(self.hosts)} emulated hosts, link {self.link} each way; {hosts}"


def missing_rights() -> str | None:
    """What stops this process from making namespaces, in words; None when nothing does."""
    try:
        caps = int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        caps = 0
    lacking = [
        n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN)) if not caps >> bit & 1
    ]
    if lacking:
        return f"emulated hosts need root (or {' and '.join(lacking)}); run as root, or use --hosts with real ones"
    tools = [t for t in ("ip", "tc", "unshare", "taskset") if shutil.which(t) is None]
    if tools:
        return f"emulated hosts need {', '.join(tools)} (Debian: apt-get install iproute2 util-linux)"
    return None


def split_cores(cpus: list[int], n: int) -> list[tuple[str, bool]]:
    """Each host's cores: equal contiguous shares; with more hosts than cores, one core each, round-robin, shared."""
    per = len(cpus) // n
    if per == 0:
        return [(str(cpus[i % len(cpus)]), True) for i in range(n)]
    return [(placement.cpu_list(cpus[i * per : (i + 1) * per]), False) for i in range(n)]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _tc(netns: str, dev: str, rate_bps: int) -> None:
    # A burst of 1 ms at the rate (at least 16 KB: the kernel needs one jumbo GSO segment's worth).
    burst = max(16 * 1024, rate_bps // 8 // 1000)
    done = subprocess.run(
        [
            "tc",
            "-n",
            netns,
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            f"{rate_bps}bit",
            "burst",
            str(burst),
            "latency",
            "50ms",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"tc on {netns} {dev}: {done.stderr.strip()}")


def up(hosts: int, link: str = UNLIMITED, name: str | None = None) -> Cluster:
    """Make a cluster of `hosts` emulated hosts whose links run at `link`; InputError (one line) on bad input or
    missing rights. Whatever was made is removed again if any step fails."""
    rate = parse_rate(link)
    if hosts < 1 or hosts > 200:
        raise InputError(f"emulated hosts: 1 to 200, not {hosts}")
    name = name or DEFAULT_NAME
    if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", name):
        raise InputError(f"cluster name {name!r}: 1-8 lower-case letters and digits, starting with a letter")
    if problem := missing_rights():
        raise InputError(problem)
    if emulated.load(name) is not None:
        raise InputError(f"cluster {name} is up already; 'distbench cluster down {name}' first, or name another")
    made = Cluster(name, link, rate, [], f"{emulated.PREFIX}{name}-sw", _now(), kept_in_tmp())
    for i, (cpus, shared) in enumerate(split_cores(placement.available(), hosts)):
        made.hosts.append(Host(f"h{i}", f"{emulated.PREFIX}{name}-h{i}", f"{SUBNET}.{i + 1}", cpus, shared))
    try:
        _build(made)
    except BaseException as exc:
        down(name, quiet=True)
        if isinstance(exc, RuntimeError):  # a step of ip or tc: the kernel's words, in one line
            raise EmulationFailed(f"emulated hosts could not be made: {exc}") from exc
        raise
    return made


class EmulationFailed(InputError):
    """The kernel refused a step of `up` (what was made is gone again): one line, as bad input is."""


def kept_in_tmp() -> list[str]:
    """What of this Python environment, this checkout and the working directory lies under /tmp (a clone made
    there, say), outermost first: every host must see the software that runs the ranks."""
    import benchmarks

    tmp = Path("/tmp").resolve()
    found = [Path(p).resolve() for p in (sys.prefix, Path(benchmarks.__file__).parents[1], os.getcwd())]
    inside = sorted({p for p in found if p != tmp and p.is_relative_to(tmp)}, key=lambda p: len(p.parts))
    return [str(p) for i, p in enumerate(inside) if not any(p.is_relative_to(q) for q in inside[:i])]


def _build(c: Cluster) -> None:
    emulated.STATE_DIR.mkdir(parents=True, exist_ok=True)
    files.write_text(emulated.state_file(c.name), json.dumps({**asdict(c)}, indent=2) + "\n")  # `down` finds it
    # The v4-mapped names too: torch's TCPStore listens on a dual-stack socket and names each client by them.
    hosts_file = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
        f"{h.address} {h.name}\n::ffff:{h.address} {h.name}\n" for h in c.hosts
    )
    _ip("netns", "add", c.switch)
    _ip("-n", c.switch, "link", "add", "br0", "type", "bridge")
    _ip("-n", c.switch, "link", "set", "br0", "up")
    for i, h in enumerate(c.hosts):
        _ip("netns", "add", h.netns)
        (ETC_NETNS / h.netns).mkdir(parents=True, exist_ok=True)
        files.write_text(ETC_NETNS / h.netns / "hosts", hosts_file)
        port = f"p{i}"
        _ip("-n", c.switch, "link", "add", port, "type", "veth", "peer", "name", IFACE, "netns", h.netns)
        _ip("-n", c.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", IFACE)
        _ip("-n", h.netns, "link", "set", IFACE, "up")
        _ip("-n", h.netns, "link", "set", "lo", "up")
        if c.rate_bps is not None:
            _tc(h.netns, IFACE, c.rate_bps)
            _tc(c.switch, port, c.rate_bps)
    c.bin_dir.mkdir(parents=True, exist_ok=True)
    for i in range(len(c.keep)):
        (emulated.STATE_DIR / c.name / "hold" / str(i)).mkdir(parents=True, exist_ok=True)
    agent = (
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m benchmarks.suite.ssh_standin {shlex.quote(c.name)} "$@"\n'
    )
    files.write_text(c.agent, agent)
    c.agent.chmod(0o755)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load(name: str) -> Cluster | None:
    found = emulated.load(name)
    if found is None:
        return None
    return Cluster(**{**found, "hosts": [Host(**h) for h in found["hosts"]]})


def status() -> list[Cluster]:
    return [c for c in (load(d["name"]) for d in emulated.clusters()) if c is not None]


def leftovers() -> list[str]:
    """Namespaces of distbench's that no cluster description names (a killed run's)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    known = {ns for c in status() for ns in (c.switch, *(h.netns for h in c.hosts))}
    names = [line.split()[0] for line in listed if line.strip()]
    return [n for n in names if n.startswith(emulated.PREFIX) and n not in known]


def down(name: str | None = None, quiet: bool = False) -> list[str]:
    """Remove cluster `name` (every cluster and every leftover namespace of distbench's when None): the
    processes in its namespaces first, then the namespaces (their veths go with them), their /etc/netns
    entries and the description. Returns the namespaces removed; InputError for a `name` that is not up
    (unless `quiet`)."""
    clusters = [c for c in status() if name in (None, c.name)]
    namespaces = [ns for c in clusters for ns in (*(h.netns for h in c.hosts), c.switch)]
    if name is None:
        namespaces += leftovers()
    else:
        namespaces += [n for n in leftovers() if n.startswith(f"{emulated.PREFIX}{name}-")]
    for ns in namespaces:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), 9)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
    for c in clusters:
        shutil.rmtree(emulated.STATE_DIR / c.name, ignore_errors=True)
        emulated.state_file(c.name).unlink(missing_ok=True)
    if name is not None and not clusters and not namespaces and not quiet:
        raise InputError(f"no cluster {name} is up; 'distbench cluster status' lists what is")
    return namespaces


@contextlib.contextmanager
def temporary(hosts: int, link: str) -> Iterator[Cluster]:
    """A cluster for one command (`compare --emulate-hosts`): up on entry, down on exit, however it exits."""
    made = up(hosts, link, f"c{secrets.token_hex(3)}")
    remove = functools.partial(down, made.name, quiet=True)
    jobs.ABORT_HOOKS.append(remove)  # a second Ctrl-C ends the process at once: the cluster goes first
    old = signal.signal(signal.SIGTERM, _terminated)  # before compare's own handler, SIGTERM would skip `finally`
    try:
        yield made
    finally:
        signal.signal(signal.SIGTERM, old)
        jobs.ABORT_HOOKS.remove(remove)
        remove()


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # main says `distbench: interrupted`, exit 130, once `temporary` has cleaned up


def link_state(c: Cluster, host: Host) -> str:
    """'up' or 'down': the host's end of its link, as the kernel has it ('unknown' where `ip` cannot say)."""
    done = subprocess.run(["ip", "-n", host.netns, "-j", "link", "show", IFACE], capture_output=True, text=True)
    try:
        flags = json.loads(done.stdout)[0]["flags"]
    except (ValueError, IndexError, KeyError):
        return "unknown" if done.returncode else "down"
    return "up" if "UP" in flags and "LOWER_UP" in flags else "down"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    make = sub.add_parser("up", help="make emulated hosts h0, h1, … on this machine (root)")
    make.add_argument("--hosts", type=int, default=2, help="how many hosts (default: 2)")
    make.add_argument(
        "--link",
        default=UNLIMITED,
        help="each host's link rate: 1gbit, 10gbit, 100mbit, … or unlimited (default: unlimited)",
    )
    make.add_argument("--name", default=DEFAULT_NAME, help=f"the cluster's name (default: {DEFAULT_NAME})")
    sub.add_parser("status", help="the clusters that are up, their hosts, cores and links")
    remove = sub.add_parser(
        "down", help="remove a cluster (all of distbench's, and what a killed run left, by default)"
    )
    remove.add_argument("name", nargs="?", default=None, help="the cluster to remove (default: every one)")
    run = sub.add_parser("exec", help="run a command on one host: distbench cluster exec h0 -- hostname")
    run.add_argument("host", help="the host (h0, h1, …)")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="the command and its arguments (after --)")
    run.add_argument("--name", default=None, help="the cluster (default: the only one up)")


def command(args: argparse.Namespace) -> int:
    """`distbench cluster up|status|down|exec`: 2 with one line on bad input or missing rights."""
    try:
        if args.action == "up":
            made = up(args.hosts, args.link, args.name)
            print(made.describe())
            print(f"run on a host: distbench cluster exec h0 -- COMMAND; remove: distbench cluster down {made.name}")
        elif args.action == "status":
            found = status()
            for c in found:
                links = ", ".join(f"{h.name} {link_state(c, h)}" for h in c.hosts)
                print(f"{c.describe()}; links: {links}; since {c.created}")
            stray = leftovers() if shutil.which("ip") else []
            if stray:
                print(f"left by a killed run: {' '.join(stray)} (distbench cluster down removes them)")
            if not found and not stray:
                print("no emulated cluster is up")
        elif args.action == "down":
            if problem := missing_rights():
                raise InputError(problem)
            removed = down(args.name)
            print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
        else:
            # REMAINDER takes all after the host: exec's own --name may stand before the `--`.
            cut = args.argv.index("--") if "--" in args.argv else -1
            head, cmd = args.argv[: max(cut, 0)], args.argv[cut + 1 :]
            name = head[head.index("--name") + 1] if "--name" in head[:-1] else args.name
            return exec_on(name, args.host, cmd)
    except InputError as exc:
        errors.error(str(exc))
        return errors.EXIT_BAD_INPUT
    except RuntimeError as exc:  # a step of `up` failed (and what it made is gone again)
        errors.error(f"cluster up failed: {exc}")
        return 1
    return 0


def exec_on(name: str | None, host_name: str, argv: list[str]) -> int:
    found = status() if name is None else [c for c in [load(name)] if c is not None]
    if not found:
        raise InputError(f"no cluster {name or ''} is up; 'distbench cluster up' makes one".replace("  ", " "))
    if len(found) > 1:
        raise InputError(f"clusters {', '.join(c.name for c in found)} are up; say which with --name")
    try:
        host = found[0].host(host_name)
    except KeyError:
        raise InputError(
            f"{host_name} is not a host of cluster {found[0].name}: {', '.join(h.name for h in found[0].hosts)}"
        ) from None  # noqa: E501
    if not argv:
        raise InputError("give the command to run after --: distbench cluster exec h0 -- hostname")
    os.execvp("ip", found[0].on(host, argv))
