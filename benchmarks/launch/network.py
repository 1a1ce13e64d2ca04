"""What a rank records of where it runs: its host, the cores it may use there, the network interface it was
told to use and, on an emulated host, that host and its link (run.json `hosts` and `network`).

A leaf, torch-free: the harness and the allreduce sweep record it the same way.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from benchmarks.errors import InputError
from benchmarks.launch import emulated, placement

UNLIMITED = "unlimited"

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


def parse_rate(text: str) -> int | None:
    """'1gbit', '100mbit', '2.5gbit', '500kbit' → bits per second; 'unlimited' → None."""
    text = str(text).strip().lower()
    if text == UNLIMITED:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", text)
    if not match or float(match.group(1)) <= 0:
        raise InputError(f"--link takes a rate such as 1gbit, 10gbit, 100mbit or 'unlimited'; got {text!r}")
    return int(float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)])


def parse_latency(text: str) -> float:
    """'5us', '0.5ms', '20ns', '0' → seconds: one hop's latency, for a link one does not have."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ns|us|ms|s)?", str(text).strip().lower())
    if not match or (match.group(2) is None and float(match.group(1)) != 0):
        raise InputError(f"--latency takes a time with its unit such as 5us, 0.5ms or 0; got {text!r}")
    return float(match.group(1)) * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, None: 0.0}[match.group(2)]
