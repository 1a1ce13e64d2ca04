"""Launcher detection: the one place that reads a launcher's environment.

`distbench run` works unchanged under torchrun, mpirun/mpiexec (Open MPI), horovodrun (--gloo or
--mpi), Slurm's srun, and plain python. `detect()` turns whichever environment it finds into a
`LaunchInfo`; nothing else in distbench looks at RANK, OMPI_COMM_WORLD_* or SLURM_* variables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

TORCHRUN = "torchrun"
MPIRUN = "mpirun"
HOROVODRUN = "horovodrun"
SRUN = "srun"
PYTHON = "python"
LAUNCHERS = (TORCHRUN, MPIRUN, HOROVODRUN, SRUN, PYTHON)
HOROVODRUN_MPI = "horovodrun --mpi"
"""In a backend's `launchers`: horovodrun with its MPI controller only, which starts the ranks through mpirun
and so offers mpirun's rendezvous (HOROVODRUN accepts either controller)."""
SRUN_MPI = "srun --mpi=pmix"
"""In a backend's `launchers`: srun with an MPI plugin (`--mpi=pmix` for Open MPI), through which MPI's ranks
find each other; a plain srun (`--mpi=none`, Slurm's usual default) gives each rank an MPI world of one."""
SRUN_MPI_HINT = "srun --mpi=pmix (Open MPI's ranks find each other through PMIx; `srun --mpi=list` shows the others)"


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job, as the launcher told it."""

    launcher: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int | None = None
    """Which machine (agent) of the job this rank runs on, where the launcher says."""
    master_addr: str | None = None
    """Rendezvous host for torch.distributed; None where it must be agreed at start-up (mpirun)."""
    master_port: int | None = None
    detail: str = ""
    """Launcher sub-mode worth recording, e.g. horovodrun's controller (gloo or mpi)."""


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None:
        if default is None:
            raise KeyError(name)
        return default
    return int(value)


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm host list the way `scontrol show hostnames` does.

    "node[01-03,7],gpu-a1" → ["node01", "node02", "node03", "node7", "gpu-a1"].
    """
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        hosts.extend(_expand_host(item.strip()))
    return [h for h in hosts if h]


def _expand_host(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if not match:
        return [pattern]
    prefix, suffix = pattern[: match.start()], pattern[match.end() :]
    expanded: list[str] = []
    for part in match.group(1).split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            width = len(lo)
            expanded += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
        else:
            expanded.append(f"{prefix}{part}")
    return [host for item in expanded for host in _expand_host(item + suffix)]


def detect(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Work out which launcher started this process, from its environment alone."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "LOCAL_RANK" in env and "MASTER_ADDR" in env):
        return LaunchInfo(
            launcher=TORCHRUN,
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
            node_rank=_int(env, "GROUP_RANK", 0),
            master_addr=env.get("MASTER_ADDR"),
            master_port=_int(env, "MASTER_PORT", 29500),
        )
    # horovodrun --gloo sets HOROVOD_RANK & co. horovodrun --mpi runs mpirun and sets no HOROVOD_* variable; it
    # is told apart from a plain mpirun by the --tag-output it always passes to Open MPI, which every rank sees
    # as OMPI_MCA_orte_tag_output. (Not by its interface pins: a plain mpirun across hosts exports those too.) A
    # plain mpirun given --tag-output is recorded as horovodrun (detail mpi), which every backend that runs under
    # mpirun accepts (`accepts`), so the guess can mislabel a run but never refuse one.
    if "HOROVOD_RANK" in env:
        return LaunchInfo(
            launcher=HOROVODRUN,
            rank=_int(env, "HOROVOD_RANK"),
            local_rank=_int(env, "HOROVOD_LOCAL_RANK", 0),
            world_size=_int(env, "HOROVOD_SIZE"),
            local_world_size=_int(env, "HOROVOD_LOCAL_SIZE", 1),
            node_rank=_int(env, "HOROVOD_CROSS_RANK", 0),
            detail="gloo",
        )
    if "OMPI_COMM_WORLD_RANK" in env:
        via_horovodrun = env.get("OMPI_MCA_orte_tag_output") == "1"
        return LaunchInfo(
            launcher=HOROVODRUN if via_horovodrun else MPIRUN,
            rank=_int(env, "OMPI_COMM_WORLD_RANK"),
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            world_size=_int(env, "OMPI_COMM_WORLD_SIZE"),
            local_world_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1),
            detail="mpi",
        )
    if "PMI_RANK" in env and "PMI_SIZE" in env:  # MPICH / Intel MPI hydra
        return LaunchInfo(
            launcher=MPIRUN,
            rank=_int(env, "PMI_RANK"),
            local_rank=_int(env, "MPI_LOCALRANKID", 0),
            world_size=_int(env, "PMI_SIZE"),
            local_world_size=_int(env, "MPI_LOCALNRANKS", 1),
            detail="mpi",
        )
    # SLURM_STEP_ID tells an srun task from the batch script itself, which also has SLURM_PROCID.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "localhost")
        job_id = _int(env, "SLURM_JOB_ID", 0)
        return LaunchInfo(
            launcher=SRUN,
            rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            world_size=_int(env, "SLURM_NTASKS"),
            local_world_size=_local_tasks(env),
            node_rank=_int(env, "SLURM_NODEID", 0),
            master_addr=env.get("MASTER_ADDR") or expand_slurm_nodelist(nodelist)[0],
            master_port=_int(env, "MASTER_PORT", 15000 + job_id % 20000),
            detail=_srun_mpi(env),
        )
    return LaunchInfo(launcher=PYTHON)


def detect_or_plain(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """detect(), or one plain rank where a launcher's variables are only half set: for saying an error (which rank
    says it, how long the others wait), where failing to tell would hide the error itself."""
    try:
        return detect(env)
    except (KeyError, ValueError):
        return LaunchInfo(launcher=PYTHON)


def _srun_mpi(env: Mapping[str, str]) -> str:
    # srun exports its --mpi plugin as SLURM_MPI_TYPE (absent or "none" without one).
    value = env.get("SLURM_MPI_TYPE", "")
    return "" if value == "none" else value


def _local_tasks(env: Mapping[str, str]) -> int:
    # SLURM_TASKS_PER_NODE looks like "4(x2),3"; the local count is the first group's.
    value = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
    match = re.match(r"\d+", value)
    return int(match.group(0)) if match else 1


def uses_mpi(info: LaunchInfo) -> bool:
    """The ranks were started by an MPI launcher (mpirun, mpiexec, horovodrun --mpi): MPI can carry the rendezvous."""
    return info.launcher == MPIRUN or info.detail == "mpi"


def accepts(supported: tuple[str, ...], info: LaunchInfo) -> bool:
    """Whether a backend whose `launchers` are `supported` can run under the launcher that started `info`."""
    if info.launcher in supported:
        return True
    if info.launcher == SRUN:
        return bool(info.detail) and SRUN_MPI in supported
    return info.launcher == HOROVODRUN and info.detail == "mpi" and HOROVODRUN_MPI in supported


def check_supported(backend: str, supported: tuple[str, ...], info: LaunchInfo) -> None:
    """Stop before any work when a backend is started under a launcher it cannot use."""
    if not accepts(supported, info):
        if info.launcher == SRUN and SRUN_MPI in supported:
            raise WrongLauncherError(
                f"backend '{backend}' needs MPI under srun, and this srun has no MPI plugin (--mpi=none); "
                f"start it with {SRUN_MPI_HINT}"
            )
        started = f"{info.launcher} --{info.detail}" if info.launcher == HOROVODRUN and info.detail else info.launcher
        raise WrongLauncherError(
            f"backend '{backend}' cannot run under {started}; launch it with one of: {', '.join(supported)}"
        )


class WrongLauncherError(RuntimeError):
    """The backend cannot run under the launcher that started this process."""


def default_threads(local_world_size: int) -> int:
    """Torch threads per rank when --threads is not given: the CPUs this process may use ÷ local ranks, at
    least 1 (`placement.default_threads`)."""
    from benchmarks.launch import placement

    return placement.default_threads(local_world_size)
