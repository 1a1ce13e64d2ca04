"""A hand-written CUDA training loop of a distbench workload: what `make gpu-check` holds the harness to.

The same model, data, batches and optimizer as `distbench run --backend single`, in the loop a user
writes: no host synchronisation between steps, one before and one after the timed steps. It then times
as many steps again with a synchronisation after each, which is what the harness must do to time a
step, so the two numbers bracket the cost of timing. Prints one JSON line.

    python docker/gpu_raw_loop.py --workload cnn --steps 400 --warmup 5 --train-size 12960
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.config import RunConfig
from benchmarks.run import sharding, workloads
from benchmarks.run.trainer import make_optimizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--steps", type=int, required=True, help="timed steps, as the harness's timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first, as --warmup-steps")
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the same loop, for testing")
    args = parser.parse_args(argv)

    cfg = workloads.resolve(RunConfig(workload=args.workload, train_size=args.train_size))
    workload = workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)  # as the harness's memory meter: just before the model
    sharding.seed_everything(cfg.seed)
    model = workload.build_model().to(device)
    optimizer = make_optimizer(model, cfg, workload)
    x_all, y_all = workload.train
    batches = sharding.train_batches(len(x_all), cfg.batch_size, 0, 1, 0, cfg.seed)

    def step(indices: list[int]) -> None:
        index = torch.tensor(indices, dtype=torch.long)
        x = x_all[index].to(device, non_blocking=True)
        y = y_all[index].to(device, non_blocking=True)
        loss = workload.loss(model(x), y).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def samples_per_s(first: int, sync_each_step: bool) -> float:
        sync()
        start = time.perf_counter()
        for i in range(first, first + args.steps):
            step(batches[i % len(batches)])
            if sync_each_step:
                sync()
        sync()
        return args.steps * cfg.batch_size / (time.perf_counter() - start)

    for i in range(args.warmup):
        step(batches[i % len(batches)])
    free = samples_per_s(args.warmup, sync_each_step=False)
    synced = samples_per_s(args.warmup + args.steps, sync_each_step=True)
    print(
        json.dumps(
            {
                "workload": args.workload,
                "batch_size": cfg.batch_size,
                "steps": args.steps,
                "warmup": args.warmup,
                "samples_per_s": free,
                "samples_per_s_sync_each_step": synced,
                "parameters": sum(p.numel() for p in model.parameters()),
                "parameter_mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
                "cuda_max_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            }
        )
    )


if __name__ == "__main__":
    main()
