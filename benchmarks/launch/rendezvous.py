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


def share_rendezvous_over_mpi() -> tuple[str, int]:
    """Agree on rank 0's address and a free port through MPI, so mpirun needs no MASTER_ADDR."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    addr_port = (socket.gethostbyname(socket.gethostname()), free_port()) if comm.rank == 0 else None
    return comm.bcast(addr_port, root=0)


def endpoint(info: LaunchInfo) -> tuple[str, int]:
    """The tcp:// address and port every rank of this job uses to form a process group."""
    if uses_mpi(info):
        return share_rendezvous_over_mpi()
    if info.master_addr is None:  # plain python: a one-process group
        return "127.0.0.1", free_port()
    return info.master_addr, info.master_port or 29500


def exit_process(code: int) -> NoReturn:
    """End a rank that used mpi4py for its rendezvous: finalize MPI, then exit without interpreter teardown.

    A DDP job under mpirun keeps gloo's threads alive until the process ends (destroy_process_group does
    not stop them). Left to ordinary interpreter teardown, one rank's sockets could close while a peer's gloo
    thread still used them, and a job that had completed aborted at exit (about 1 run in 20). Everything is
    written and fsync'ed by now, so nothing is lost by skipping teardown.
    """
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    os._exit(code)
