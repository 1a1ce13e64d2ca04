"""What a rank records of where it runs: its host, the cores it may use there, the network interface it was
told to use and, on an emulated host, that host and its link (run.json `hosts` and `network`).

A leaf, torch-free: the harness and the allreduce sweep record it the same way.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from benchmarks.launch import emulated, placement

IFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include")
"""Where each framework is told its network interface (compare sets them, horovodrun's --network-interface and
mpirun's --mca btl_tcp_if_include too): the first one set is the interface a rank records."""


def this_host(node_rank: int | None) -> dict[str, Any]:
    """This rank's entry in run.json `hosts`: its host, the cores it may use there, the interface it was told
    to use (None: the frameworks' own choice) and, on an emulated host, that host and its link."""
    iface = next((os.environ[v] for v in IFACE_VARIABLES if os.environ.get(v)), None)
    return {
        "host": socket.gethostname(),
        "node_rank": node_rank,
        "cpus": placement.cpu_list(placement.available()),
        "iface": iface,
        "emulated": emulated.current(),
    }


def record(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    """run.json `network`: how many hosts the ranks ran on, the interface, and the link (emulated: its rate;
    otherwise unknown to distbench, None)."""
    first = hosts[0] if hosts else {}
    link = (first.get("emulated") or {}).get("link")
    return {
        "hosts": len({h.get("host") for h in hosts}),
        "iface": first.get("iface"),
        "link": link,
        "emulated": bool(first.get("emulated")),
    }
