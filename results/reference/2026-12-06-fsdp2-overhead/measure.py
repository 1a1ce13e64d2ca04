"""Where FSDP2's step goes on CPU ranks, beside what `distbench project` models of it.

Per workload, the median step (forward, backward, SGD step) of: the plain model (what the compute baseline
times); FSDP2 over a group of this rank alone (its hooks, copies and DTensor optimizer, no network); FSDP2
over every rank (what training runs); and, apart, the collectives FSDP2 issues per step (at each unit's size:
two all-gathers, as reshard after forward gathers again in backward, and one reduce-scatter) one after the
other. Units and resharding as `backends/fsdp.py` makes them by default (its `shard_units`).

    .venv/bin/torchrun --standalone --nproc-per-node 2 results/reference/2026-12-06-fsdp2-overhead/measure.py mlp 32
"""

import copy
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from backends.fsdp import check_units, shard_units
from benchmarks.config import FSDPConfig
from benchmarks.run import workloads

STEPS, WARMUP = 20, 3


def median_ms(fn) -> float:
    times = []
    for i in range(WARMUP + STEPS):
        start = time.perf_counter()
        fn()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    name, batch = sys.argv[1], int(sys.argv[2])
    w = workloads.load(name, 0)
    x, y = w.train[0][:batch], w.train[1][:batch]
    torch.manual_seed(0)
    base = w.build_model()
    options = FSDPConfig()  # the defaults: units, resharding
    units = check_units(base, options)

    def step_ms(model: torch.nn.Module) -> float:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            w.loss(model(x), y).mean().backward()
            optimizer.step()
            optimizer.zero_grad()

        dist.barrier()
        return median_ms(step)

    def sharded(mesh: DeviceMesh) -> torch.nn.Module:
        return shard_units(copy.deepcopy(base), units, mesh, options.reshard_after_forward, MixedPrecisionPolicy())

    alone = DeviceMesh.from_group([dist.new_group([r]) for r in range(world)][rank], "cpu")
    everyone = init_device_mesh("cpu", (world,))
    plain = [step_ms(copy.deepcopy(base)) for _ in range(2)]
    solo = [step_ms(sharded(alone)) for _ in range(2)]
    full = [step_ms(sharded(everyone)) for _ in range(2)]

    sizes = [sum(p.numel() for p in base.get_submodule(u).parameters()) for u in units]
    sizes.append(sum(p.numel() for p in base.parameters()) - sum(sizes))  # the root's own
    collectives = 0.0
    for numel in sizes:
        numel = max(numel - numel % world, world)
        whole, shard = torch.zeros(numel), torch.zeros(numel // world)
        dist.barrier()
        collectives += 2 * median_ms(lambda w=whole, s=shard: dist.all_gather_into_tensor(w, s))
        collectives += median_ms(lambda w=whole, s=shard: dist.reduce_scatter_tensor(s, w))
    if rank == 0:

        def show(values: list[float]) -> str:
            return " / ".join(f"{v:.1f}" for v in values)

        print(
            f"{name} batch {batch}, {world} ranks, {len(sizes)} units: plain {show(plain)} ms, FSDP2 alone "
            f"{show(solo)} ms, FSDP2 over {world} ranks {show(full)} ms; its collectives alone {collectives:.1f} ms"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
