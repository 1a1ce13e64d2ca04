"""Rendezvous for torch.distributed: where rank 0 listens, whatever launcher started the job.

torchrun and srun say it in the environment (`LaunchInfo.master_addr/port`); under mpirun (or horovodrun
--mpi, which runs mpirun) rank 0 picks its address and a free port and tells the others over MPI; a lone
python process needs no peer.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import NoReturn

from benchmarks.launch import LaunchInfo, uses_mpi


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def share_rendezvous_over_mpi(one_host: bool) -> tuple[str, int]:
    """Agree on rank 0's address and a free port through MPI, so mpirun needs no MASTER_ADDR. On one host
    (`one_host`: every rank is local) the address is 127.0.0.1, so the hostname need not resolve."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        address = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
        addr_port: tuple[str, int] | None = (address, free_port())
    else:
        addr_port = None
    return comm.bcast(addr_port, root=0)


def endpoint(info: LaunchInfo) -> tuple[str, int]:
    """The tcp:// address and port every rank of this job uses to form a process group."""
    if uses_mpi(info):
        return share_rendezvous_over_mpi(info.local_world_size == info.world_size)
    if info.master_addr is None:  # plain python: a one-process group
        return "127.0.0.1", free_port()
    return info.master_addr, info.master_port or 29500


def exit_process(code: int) -> NoReturn:
    """End a completed rank without interpreter teardown, finalizing MPI first when mpi4py was used.

    DDP keeps gloo's threads alive until the process ends (destroy_process_group does not stop them). Left
    to ordinary interpreter teardown, a rank could abort at exit ("terminate called without an active
    exception") after a run that had completed — seen under mpirun (about 1 run in 20) and, rarely, under
    torchrun. Everything is written and fsync'ed by now, so nothing is lost by skipping teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    os._exit(code)
