"""CPU placement: which cores each rank may run on, made the same under every launcher, and recorded.

Launchers place ranks differently: a plain `mpirun -np 2` binds each rank to one core, while torchrun and
horovodrun (whose `--mpi` passes `-bind-to none` to mpirun) leave every rank free on all cores. A compare
that crossed them would measure the launchers' placement, not the frameworks (docs/fairness.md).

`--bind` chooses one policy for every rank, applied by the rank itself so that it holds under any launcher:

- `none`: every thread of the rank may run on every core the job may use (the cgroup's cpuset);
- `cores`: the job's cores are split into equal contiguous shares by local rank, each rank pinned to its own.

Without `--bind` (a `run` started by hand) the rank keeps what its launcher gave it. Either way each rank's
affinity is recorded in run.json `placement`. Torch-free: imported by every `distbench` process's parser.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.launch import emulated

NONE, CORES = "none", "cores"
POLICIES = (NONE, CORES)
AS_LAUNCHED = "as launched"
"""run.json `placement.policy` of a run given no --bind: the launcher's own placement, whatever it was."""
MPIRUN_ARGS = ("--bind-to", "none")
"""What distbench's own mpirun command lines add: the rank applies --bind itself, so mpirun must not bind
first (Open MPI binds each rank to a core by default when ranks ≤ cores)."""
CPUSET_FILES = ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus")
QUOTA_V2 = "/sys/fs/cgroup/cpu.max"
"""cgroup v2: `QUOTA PERIOD` in one file (`max` for none)."""
QUOTA_V1 = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")
"""cgroup v1: the two numbers in a file each (-1 for none)."""


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' (the kernel's list format) → [0, 1, 2, 3, 8, 10, 11]."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part.strip():
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return sorted(cpus)


def cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of parse_cpu_list: [0, 1, 2, 3, 8] → '0-3,8'."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in ranges)


def available() -> list[int]:
    """The cores the job may use on this host: the cgroup's cpuset where readable, else every online core; on an
    emulated host (benchmarks.launch.emulated), only that host's share of them."""
    cpus = list(range(os.cpu_count() or 1))
    for name in CPUSET_FILES:
        try:
            found = parse_cpu_list(Path(name).read_text())
        except (OSError, ValueError):
            continue
        if found:
            cpus = found
            break
    host = emulated.current()
    if host is not None:
        cpus = [c for c in cpus if c in set(parse_cpu_list(host["cpus"]))] or cpus
    return cpus


def cpu_quota() -> float | None:
    """The cgroup's CPU quota in cores (cpu.max, or cfs_quota_us ÷ cfs_period_us in cgroup v1); None if unlimited."""
    try:
        words = Path(QUOTA_V2).read_text().split()
    except OSError:
        try:
            words = [Path(name).read_text() for name in QUOTA_V1]
        except OSError:
            return None
    try:
        quota, period = float(words[0]), float(words[1])
    except (ValueError, IndexError):
        return None  # "max": no quota
    return quota / period if quota > 0 and period > 0 else None


def _within_quota(cpus: float) -> float:
    quota = cpu_quota()
    return min(cpus, quota) if quota is not None else cpus


def host_cpus() -> float:
    """How many CPUs the ranks on this host may keep busy together: its cores, capped by the cgroup's quota."""
    return _within_quota(len(available()))


def usable_cpus() -> float:
    """How many CPUs this process can keep busy: the cores it may run on (its affinity, within the host's
    share), capped by the cgroup's quota."""
    return _within_quota(len(set(affinity()) & set(available())) or len(affinity()))


def default_threads(local_world_size: int) -> int:
    """Torch threads per rank when --threads is not given, under every launcher alike (torchrun's
    OMP_NUM_THREADS=1 and mpirun's nothing would otherwise differ): a rank bound to its own cores (mpirun's
    default, --bind cores) takes them all; an unbound one shares the host's CPUs with its local ranks. Both
    counts come from the CPUs the process may use, never the machine's count."""
    return max(1, int(min(usable_cpus(), host_cpus() / max(1, local_world_size))))


def oversubscribed(local_world_size: int) -> bool:
    """More ranks on this host than the CPUs they may use, or a host whose cores another emulated host uses
    too: such a run measures time-slicing, not scaling."""
    host = emulated.current()
    return local_world_size > host_cpus() or bool(host and host["shared_cpus"])


def share(cpus: list[int], local_rank: int, local_world_size: int) -> list[int]:
    """`--bind cores`: this local rank's contiguous share of `cpus` (one core, round-robin, when ranks > cores)."""
    per = len(cpus) // max(1, local_world_size)
    if per == 0:
        return [cpus[local_rank % len(cpus)]]
    return cpus[local_rank * per : (local_rank + 1) * per]


def affinity() -> list[int]:
    """This thread's cores (every core where the system has no affinity call: not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return list(range(os.cpu_count() or 1))
    return sorted(os.sched_getaffinity(0))


def apply(policy: str | None, local_rank: int, local_world_size: int) -> None:
    """Set this process's placement by `policy` (None: leave it as launched).

    Every thread already running is set too (a workload's check may have started the OpenMP pool); threads
    started later inherit the main thread's affinity. The kernel keeps a mask inside the cgroup's cpuset.
    """
    if policy is None or not hasattr(os, "sched_setaffinity"):
        return
    cpus = available()
    target = cpus if policy == NONE else share(cpus, local_rank, local_world_size)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), target)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile, or one not ours
            continue


def numa_nodes(cpus: Iterable[int]) -> list[int]:
    """The NUMA nodes the cores belong to (empty where the system does not say)."""
    wanted, nodes = set(cpus), []
    for node in sorted(Path("/sys/devices/system/node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            if wanted & set(parse_cpu_list((node / "cpulist").read_text())):
                nodes.append(int(node.name[4:]))
        except (OSError, ValueError):
            continue
    return nodes


def gpu_of(index: int) -> dict[str, Any]:
    """A CUDA device's name, PCI bus id and the NUMA node it hangs off (None where unknown)."""
    import torch  # only on GPU

    props = torch.cuda.get_device_properties(index)
    found: dict[str, Any] = {"gpu": props.name, "gpu_pci_bus_id": None, "gpu_numa_node": None}
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        found["gpu_pci_bus_id"] = bus
        try:
            node = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text())
            found["gpu_numa_node"] = node if node >= 0 else None
        except (OSError, ValueError):
            pass
    return found


def of_rank(device_type: str = "cpu", device_index: int | None = None) -> dict[str, Any]:
    """This rank's placement, for run.json `placement.per_rank` (gathered off the timed path)."""
    cpus = affinity()
    found: dict[str, Any] = {"cpus": cpu_list(cpus), "cpu_count": len(cpus), "numa_nodes": numa_nodes(cpus)}
    found["device"] = f"{device_type}:{device_index}" if device_index is not None else device_type
    if device_type == "cuda" and device_index is not None:
        found.update(gpu_of(device_index))
    return found


def record(policy: str | None, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """run.json `placement`: the policy, the cores the job could use, and each rank's affinity in rank order.

    `bound` says whether any rank ran on fewer cores than the job could use (a launcher's or --bind cores'
    binding); under srun, `srun_cpu_bind` is srun's own binding (SLURM_CPU_BIND, e.g. `quiet,mask_cpu:0x1,0x2`)."""
    cpus = available()
    found = {
        "policy": policy or AS_LAUNCHED,
        "available": cpu_list(cpus),
        "bound": any(r["cpu_count"] < len(cpus) for r in per_rank),
        "per_rank": [{"rank": rank, **r} for rank, r in enumerate(per_rank)],
    }
    if bind := os.environ.get("SLURM_CPU_BIND"):  # srun's --cpu-bind as it applied it (task/affinity)
        found["srun_cpu_bind"] = bind
    return found


def summary(placement: dict[str, Any] | None) -> str | None:
    """One phrase for a report: 'none: every rank on 0-1', 'cores: 0 | 1' (per rank), None if not recorded."""
    if not isinstance(placement, dict) or not placement.get("per_rank"):
        return None
    cpus = dict.fromkeys(r.get("cpus") for r in placement["per_rank"])
    where = f"every rank on {next(iter(cpus))}" if len(cpus) == 1 else " | ".join(map(str, cpus))
    return f"{placement.get('policy')}: {where}"
