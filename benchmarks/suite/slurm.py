"""A Slurm allocation as the place a compare's ranks run: every job a job step (`srun`) of it.

Inside `salloc` or an `sbatch` script (SLURM_JOB_ID set), the variants `ddp@srun`, `fsdp@srun` and
`horovod@srun` start each of their jobs as `srun --exact`, one step at a time, interleaved like every other
launcher's. The step runs unbound (`--cpu-bind=none`: each rank applies --bind itself, as under mpirun) with
--threads CPUs per task, a fresh rendezvous port, and Horovod's MPI through `--mpi=pmix` (Open MPI's ranks
find each other through PMIx; the other backends need no MPI plugin). `--quit-on-interrupt` makes srun pass
compare's Ctrl-C to the ranks at once, which record the run interrupted; `--kill-on-bad-exit` ends the step
when a rank fails, as the other launchers do.

Imported by the parser of every `distbench` process: no torch.
"""

from __future__ import annotations

import os
import random
import re
import sys
from collections.abc import Mapping

from benchmarks import launch
from benchmarks.errors import InputError
from benchmarks.launch.variants import Variant

MPI_PLUGIN = "pmix"
"""srun's --mpi for a backend that needs MPI (Horovod): what Debian's Open MPI and Slurm 22.05 share."""


def allocation(env: Mapping[str, str] | None = None) -> str | None:
    """The id of the Slurm job this process runs in (salloc, sbatch, or a step of one), None outside one."""
    return (os.environ if env is None else env).get("SLURM_JOB_ID") or None


def check(chosen: list[Variant], sizes: list[int], many_hosts: bool, env: Mapping[str, str] | None = None) -> None:
    """`@srun` variants only inside an allocation, only there and not across --hosts, at world sizes the
    allocation holds (InputError, one line, before anything starts)."""
    steps = [v.name for v in chosen if v.launcher == launch.SRUN]
    if not steps:
        return
    env = os.environ if env is None else env
    if allocation(env) is None:
        raise InputError(
            f"{steps[0]} runs each job as a step of a Slurm allocation, and this compare runs outside one (no "
            "SLURM_JOB_ID); run it inside `salloc -n N` or an sbatch script (docs/commands.md, Slurm)"
        )
    if many_hosts:
        raise InputError(
            f"{steps[0]} runs where the allocation's nodes are; leave out --hosts, --hostfile, --emulate-hosts "
            "and --cluster (they are for torchrun, mpirun and horovodrun)"
        )
    tasks = env.get("SLURM_NTASKS")
    if tasks and tasks.isdigit() and max(sizes) > int(tasks):
        raise InputError(
            f"--nproc {max(sizes)} is more than allocation {allocation(env)}'s {tasks} tasks; ask salloc/sbatch "
            f"for -n {max(sizes)}, or lower --nproc"
        )


def step(variant: Variant, nproc: int, threads: int) -> list[str]:
    """The argv that starts `nproc` ranks of `python -m benchmarks.cli` as one step of this allocation."""
    port = random.randint(20000, 29999)  # each step its own rendezvous: the job id's port would be reused
    mpi = [f"--mpi={MPI_PLUGIN}"] if variant.backend == "horovod" else []
    return [
        "srun",
        "--exact",
        f"--ntasks={nproc}",
        f"--cpus-per-task={threads}",
        "--cpu-bind=none",
        "--kill-on-bad-exit=1",
        "--quit-on-interrupt",
        *mpi,
        f"--export=ALL,MASTER_PORT={port}",
        sys.executable,
        "-m",
        "benchmarks.cli",
    ]


CANCELLED = re.compile(r"\*\*\* (STEP|JOB) (\S+) ON (\S+) CANCELLED AT (\S+)(.*?)\*\*\*")
"""What slurmstepd says (through srun) when a step is cancelled: by scancel, the time limit or a preemption."""


def cancelled(said: str) -> str | None:
    """The step's cancellation in Slurm's words, from what its srun wrote; None when it was not cancelled.
    scancel of a step SIGKILLs its ranks at once, so they record nothing themselves."""
    match = CANCELLED.search(said)
    if match is None:
        return None
    kind, step, node, when, rest = match.groups()
    why = "scancel, a time limit or a preemption"
    return f"Slurm cancelled {kind.lower()} {step} on {node} at {when}{rest.rstrip()} ({why})"
