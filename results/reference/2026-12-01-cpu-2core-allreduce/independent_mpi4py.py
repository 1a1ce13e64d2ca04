"""Independent check of `distbench allreduce --impl mpi4py`: mpirun -np 2 python independent_mpi4py.py [4,1024,...]"""

import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
sizes = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4 << k for k in range(27)]  # 4 B-256 MiB
for size in sizes:
    buf, n = np.zeros(size // 4, np.float32), max(5, min(200_000, (4 << 30) // size))  # 4 GiB or 200k calls
    for _ in range(10):
        comm.Allreduce(MPI.IN_PLACE, buf)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        comm.Allreduce(MPI.IN_PLACE, buf)
    t = comm.allreduce((time.perf_counter() - t0) / n) / comm.size  # mean over ranks of each rank's mean
    if comm.rank == 0:
        print(f"{size},{n},{t:.9g},{size / t / 1e9:.6g}", flush=True)
