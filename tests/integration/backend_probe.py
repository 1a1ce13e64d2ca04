"""Run under a launcher: exercise one backend's collectives and print what rank 0 saw, as JSON.

torchrun --standalone --nproc-per-node 2 tests/integration/backend_probe.py ddp
"""

from __future__ import annotations

import json
import sys

import torch

import backends
from benchmarks import launch
from benchmarks.config import RunConfig
from benchmarks.launch import rendezvous


def main(name: str) -> None:
    cls = backends.get(name)
    backend = cls(RunConfig(timeout=30), backends.options_of(cls.name)(), launch.detect())
    backend.init()
    rank = backend.rank
    value = torch.tensor([float(rank + 1)], dtype=torch.float64)
    seen = {
        "world_size": backend.world_size,
        "sum": backend.all_reduce(value.clone(), "sum").item(),
        "mean": backend.all_reduce(value.clone(), "mean").item(),
        "max": backend.all_reduce(value.clone(), "max").item(),
        "gathered": backend.all_gather_object({"rank": rank}),
        "broadcast": backend.broadcast_object(f"from rank {rank}", src=0),
        "describe": sorted(backend.describe()),
    }
    backend.barrier()
    backend.shutdown()
    if rank == 0:
        print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
    rendezvous.exit_process(0)  # gloo's threads outlive destroy_process_group; teardown can abort an exit
