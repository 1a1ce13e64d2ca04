"""Emulated hosts as a process sees them: which host of which emulated cluster it runs on, if any.

`distbench cluster up` (benchmarks/suite/cluster.py) makes each host a network namespace and writes the
cluster's description to `STATE_DIR/<name>.json`; this module only reads it. A rank finds its host by its
own network namespace (the inode of /proc/self/ns/net against /run/netns/*), not by an environment
variable: horovodrun and mpirun carry the first host's environment to every other host, so a variable set
on the first would name the wrong host on the others.

A leaf, torch-free: placement (a host's cores), the harness (run.json) and the orchestration read it.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

STATE_DIR = Path(os.environ.get("DISTBENCH_CLUSTER_DIR", "/run/distbench/clusters"))
"""Where each emulated cluster's description lies while it is up (root's; gone with a reboot, as its namespaces)."""
NETNS_DIR = Path("/run/netns")
PREFIX = "distbench-"
"""Every namespace distbench makes is named `distbench-<cluster>-<host>`; `cluster down` removes by it."""


def state_file(cluster: str) -> Path:
    return STATE_DIR / f"{cluster}.json"


def load(cluster: str) -> dict[str, Any] | None:
    """One cluster's description, None when it is not up (or its file is unreadable)."""
    try:
        return json.loads(state_file(cluster).read_text())
    except (OSError, ValueError):
        return None


def clusters() -> list[dict[str, Any]]:
    """Every cluster whose description is here, by name."""
    found = (load(p.stem) for p in sorted(STATE_DIR.glob("*.json")))
    return [c for c in found if c is not None]


def netns() -> str | None:
    """The name of this process's network namespace under /run/netns, None in the machine's own."""
    try:
        mine = os.stat("/proc/self/ns/net")
        for path in NETNS_DIR.iterdir():
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                return path.name
    except OSError:
        pass
    return None


@functools.cache
def current() -> dict[str, Any] | None:
    """This process's emulated host, for run.json: its cluster, name, address, cores, whether it shares them
    with another host, and the cluster's link; None outside an emulated host."""
    name = netns()
    if name is None or not name.startswith(PREFIX):
        return None
    for cluster in clusters():
        for host in cluster.get("hosts", []):
            if host.get("netns") == name:
                return {
                    "cluster": cluster["name"],
                    "host": host["name"],
                    "address": host["address"],
                    "cpus": host["cpus"],
                    "shared_cpus": host["shared"],
                    "link": cluster["link"],
                    "emulated": True,
                }
    return None
