"""The options that say where a compare's ranks run (`--hosts`, `--hostfile`, `--iface`, `--emulate-hosts`,
`--link`, `--cluster`): declared, parsed and checked into a `hosts.Hosts` (benchmarks.suite.hosts, which runs
them). Bad input is an InputError, one line, before anything starts or is made.

Imported by the parser of every `distbench` process: no torch, no analysis stack.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from pathlib import Path

from benchmarks.errors import InputError
from benchmarks.suite import cluster as emulation
from benchmarks.suite.hosts import Hosts, Slot, is_local, route_iface


def parse_hosts(text: str) -> list[Slot]:
    """`h0:2,h1:2` (`:N` optional) → slots, each host once."""
    slots = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, _, count = item.partition(":")
        if not name or (count and not count.isdigit()) or count == "0":
            raise InputError(f"--hosts takes HOST[:SLOTS],… e.g. h0:2,h1:2; got {item!r}")
        slots.append(Slot(name, int(count) if count else None))
    if not slots:
        raise InputError("--hosts is empty; give HOST[:SLOTS],… e.g. h0:2,h1:2")
    names = [s.name for s in slots]
    if len(set(names)) != len(names):
        raise InputError(f"--hosts {text} names a host twice; name each once")
    return slots


def parse_hostfile(path: str) -> list[Slot]:
    """horovodrun's and mpirun's hostfile: a line per host, `HOST slots=N` (or `HOST:N`, or `HOST`); # comments."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise InputError(f"--hostfile {path}: {exc.strerror}; give a readable file of 'HOST slots=N' lines") from None
    items = []
    for number, line in enumerate(lines, 1):
        words = line.split("#")[0].split()
        if not words:
            continue
        match = re.fullmatch(r"slots=(\d+)", words[1]) if len(words) == 2 else None
        if len(words) > 2 or (len(words) == 2 and not match):
            raise InputError(f"--hostfile {path} line {number}: {line.strip()!r} is not 'HOST slots=N'")
        items.append(f"{words[0]}:{match.group(1)}" if match else words[0])
    if not items:
        raise InputError(f"--hostfile {path} names no host; give a line 'HOST slots=N' per host")
    return parse_hosts(",".join(items))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--hosts, --hostfile, --iface, --emulate-hosts, --link, --cluster."""
    parser.add_argument(
        "--hosts",
        default=None,
        help="run across these hosts, HOST[:SLOTS],… (e.g. h0:2,h1:1), reached over ssh (or with --cluster, its "
        "emulated hosts); --nproc is then the world size, up to the slots' sum, spread as evenly as the slots "
        "allow, rank 0 on the first (default: this machine alone)",
    )
    parser.add_argument(
        "--hostfile",
        default=None,
        help="the hosts as a file of 'HOST slots=N' lines (horovodrun's and mpirun's form), as --hosts",
    )
    parser.add_argument(
        "--iface",
        default=None,
        help="the network interface between the hosts, handed to Gloo, NCCL, Horovod and Open MPI (default: the "
        "interface of the route to the first other host; eth0 on emulated hosts)",
    )
    parser.add_argument(
        "--emulate-hosts",
        type=int,
        default=None,
        help="run across N emulated hosts on this machine (network namespaces, each with its share of the cores), "
        "made for this command and removed after it; needs root (default: none)",
    )
    parser.add_argument(
        "--link",
        default=None,
        help="with --emulate-hosts: each host's link rate, e.g. 1gbit, 10gbit, 100mbit or unlimited "
        "(default: unlimited)",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        help="run across the emulated hosts of a cluster that 'distbench cluster up' made (default: none)",
    )


KINDS = ("hosts", "hostfile", "emulate_hosts", "cluster")
"""The options that say where the ranks run: which hosts (--hosts or --hostfile), what they are (emulated by
--emulate-hosts or --cluster, else real): one of each pair at most."""


def given(args: argparse.Namespace) -> list[str]:
    """The options of `KINDS` given, as flags."""
    return [f"--{n.replace('_', '-')}" for n in KINDS if getattr(args, n, None) is not None]


def from_args(args: argparse.Namespace, made: emulation.Cluster | None = None) -> Hosts:
    """The hosts the options name (this machine when none); `made` is the cluster --emulate-hosts brought up.
    InputError on bad input."""
    kinds = given(args)
    for pair in (("--hosts", "--hostfile"), ("--emulate-hosts", "--cluster")):
        if all(flag in kinds for flag in pair):
            raise InputError(f"{' and '.join(pair)} each say where the ranks run; give one")
    if args.link is not None and args.emulate_hosts is None:
        raise InputError("--link is the emulated hosts' link rate; give it with --emulate-hosts N")
    found = made
    if args.cluster is not None:
        if problem := emulation.missing_rights():
            raise InputError(problem)
        found = emulation.load(args.cluster)
        if found is None:
            raise InputError(f"no cluster {args.cluster} is up; 'distbench cluster up --name {args.cluster}' makes one")
    listed = None
    if args.hosts is not None or args.hostfile is not None:
        listed = parse_hosts(args.hosts) if args.hosts is not None else parse_hostfile(args.hostfile)
    if found is not None:
        return Hosts(emulated_slots(found, listed), args.iface or emulation.IFACE, found)
    if listed is None:
        if args.iface is not None:
            raise InputError(
                "--iface is the interface between hosts; give it with --hosts, --hostfile or --emulate-hosts"
            )
        return Hosts()
    # This machine's route names an interface of this machine: a default only when it is one of the hosts.
    others = [s.name for s in listed if not is_local(s.name)]
    here = len(others) < len(listed)
    iface = args.iface or (route_iface(others[0]) if others and here else None)
    return Hosts(listed, iface)


def emulated_slots(found: emulation.Cluster, listed: list[Slot] | None) -> list[Slot]:
    """An emulated cluster's hosts, all of them with no slot limit, or those a host list or hostfile names
    with their slots. The first must be the cluster's first: the one host whose /tmp is this machine's, where
    rank 0 writes the results."""
    if listed is None:
        return [Slot(h.name) for h in found.hosts]
    names = ", ".join(h.name for h in found.hosts)
    for s in listed:
        if not any(s.name == h.name for h in found.hosts):
            raise InputError(f"host {s.name} is not one of cluster {found.name}'s ({names}); name those")
    if listed[0].name != found.hosts[0].name:
        raise InputError(
            f"the first host must be cluster {found.name}'s first, {found.hosts[0].name} (rank 0 writes the results "
            f"there); list {found.hosts[0].name} first"
        )
    return listed


def check_emulation(args: argparse.Namespace) -> None:
    """--emulate-hosts' and --link's values, before anything is made."""
    if args.emulate_hosts is not None:
        if args.emulate_hosts < 1:
            raise InputError(f"--emulate-hosts takes a positive number of hosts, got {args.emulate_hosts}")
        emulation.parse_rate(args.link or emulation.UNLIMITED)
        if problem := emulation.missing_rights():
            raise InputError(problem)


def emulated(args: argparse.Namespace) -> contextlib.AbstractContextManager[emulation.Cluster | None]:
    """The cluster `--emulate-hosts N` asks for, up for the command and down after it (else nothing). Its
    options and the rights are checked first (InputError), before anything is made."""
    check_emulation(args)
    if args.emulate_hosts is None:
        return contextlib.nullcontext()
    return emulation.temporary(args.emulate_hosts, args.link or emulation.UNLIMITED)


def refuse_outside_compare(args: argparse.Namespace) -> None:
    """`distbench allreduce` under a launcher runs where that launcher put it: host options are --compare's."""
    if given(args) or getattr(args, "iface", None) or getattr(args, "link", None):
        raise InputError("--hosts, --hostfile, --emulate-hosts, --cluster, --iface and --link are for --compare")
