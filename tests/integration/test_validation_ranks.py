"""Distributed validation on 2- and 3-rank gloo groups (torch.multiprocessing, DDP): every --val-strategy
held against one process evaluating the saved model, on linear (1001 validation samples, whose
per-sample losses differ), a Dataset workload through its DataLoader, and an `hf:` model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DistributedSampler

from backends.ddp import DDPBackend
from benchmarks import config as options
from benchmarks.analysis import check
from benchmarks.config import DDPConfig, RunConfig
from benchmarks.launch import TORCHRUN, LaunchInfo, rendezvous
from benchmarks.run import recorder as results
from benchmarks.run import workloads
from tests.helpers import TINY_GPT2, config, fit

STRATEGIES = options.VAL_STRATEGIES
N = 1001
OTHER_WORKLOADS = [("disk", "linear:storage=disk", N), ("hf", TINY_GPT2, 11)]
"""Every strategy also runs for a Dataset workload (memmaps through a DataLoader) and an `hf:` model."""


def _ranks(rank: int, world: int, port: int, out: Path) -> None:
    """One rank: a linear run per strategy (1001 validation samples), rank 0 keeps the evaluated model."""
    torch.set_num_threads(1)
    info = LaunchInfo(
        launcher=TORCHRUN,
        rank=rank,
        local_rank=rank,
        world_size=world,
        local_world_size=world,
        master_addr="127.0.0.1",
        master_port=port,
    )
    backend = DDPBackend(RunConfig(timeout=60), DDPConfig(), info)
    backend.init()
    try:
        for strategy in STRATEGIES:
            cfg = config(
                workload="linear",
                epochs=1,
                steps_per_epoch=4,
                batch_size=8,
                warmup_steps=1,
                train_size=96,
                val_size=N,
                val_strategy=strategy,
            )
            trainer = fit(backend, cfg, out / strategy if rank == 0 else None)
            if rank == 0:
                torch.save(trainer.raw_model.state_dict(), out / f"{strategy}.pt")
            for tag, workload, size in OTHER_WORKLOADS:  # a Dataset through its DataLoader, an hf: model
                cfg = config(
                    workload=workload,
                    epochs=1,
                    steps_per_epoch=4,
                    batch_size=8,
                    warmup_steps=1,
                    train_size=96,
                    val_size=size,
                    val_strategy=strategy,
                )
                fit(backend, cfg, out / f"{tag}-{strategy}" if rank == 0 else None)
    finally:
        backend.shutdown()
    # As a completed rank does: gloo's threads outlive the group and can abort interpreter teardown.
    rendezvous.exit_process(0)


@pytest.fixture(scope="module", params=[2, pytest.param(3, marks=pytest.mark.full_matrix)])  # 3: test-all
def ranked(request, tmp_path_factory) -> tuple[int, Path]:
    world, out = request.param, tmp_path_factory.mktemp(f"w{request.param}")
    mp.start_processes(_ranks, args=(world, rendezvous.free_port(), out), nprocs=world, start_method="spawn")
    return world, out


@torch.no_grad()
def per_sample_losses(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """One process: the model's loss on each validation sample."""
    cfg = config(workload="linear", train_size=96, val_size=N)
    workload = workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    model = workload.build_model()
    model.load_state_dict(state)
    x, y = workload.val
    return workload.loss(model(x), y).double()


@pytest.mark.timeout(180)
def test_every_strategy_against_one_process(ranked: tuple[int, Path]) -> None:
    world, out = ranked
    for strategy in STRATEGIES:
        losses = per_sample_losses(torch.load(out / f"{strategy}.pt"))
        val = pd.read_csv(out / strategy / results.LOSS_CSV).query("split == 'val'").iloc[-1]
        meta = json.loads((out / strategy / results.RUN_JSON).read_text())["validation"]
        summary = pd.read_csv(out / strategy / results.SUMMARY_CSV).iloc[0]
        exact = float(losses.mean())
        assert val.val_exact_loss == pytest.approx(exact, rel=1e-6, abs=1e-9), strategy  # same model, same pass
        assert val.samples == N and val.val_s > 0 and not check.check_run(out / strategy)
        per_rank = [r["samples"] for r in meta["per_rank"]]
        if strategy == "sampler":
            means = [
                float(losses[list(DistributedSampler(range(N), world, r, shuffle=False))].mean()) for r in range(world)
            ]
            # float32 losses: this process's thread count (not the ranks' one) reorders a matmul's sums (~3e-9)
            assert val.loss == pytest.approx(sum(means) / world, rel=1e-7)
            assert abs(val.loss - exact) > 1e-6  # the padding's duplicates and the mean of means show
            duplicates = math.ceil(N / world) * world - N
            assert (meta["duplicates"], summary.val_duplicates) == (duplicates, duplicates)
            assert per_rank == [math.ceil(N / world)] * world
        else:  # exact, replicated and rank0 report the exact loss
            assert val.loss == pytest.approx(exact, rel=1e-6, abs=1e-9), strategy
        if strategy == "exact":
            assert meta["duplicates"] == 0 and per_rank == [len(range(r, N, world)) for r in range(world)]
        if strategy == "replicated":  # the slowest rank evaluates the whole set: no speed-up possible
            assert per_rank == [N] * world and meta["duplicates"] == (world - 1) * N
        if strategy == "rank0":  # rank 0 alone evaluates: the others only wait
            assert per_rank == [N] + [0] * (world - 1) and meta["duplicates"] == 0
            busy = [r["last_busy_s"] for r in meta["per_rank"]]
            assert busy[0] > 0 and max(busy[1:]) < busy[0]


@pytest.mark.timeout(180)
def test_a_dataset_and_an_hf_model_work_with_every_strategy(ranked: tuple[int, Path]) -> None:
    world, out = ranked
    for tag, _, size in OTHER_WORKLOADS:
        rows = {
            s: pd.read_csv(out / f"{tag}-{s}" / results.LOSS_CSV).query("split == 'val'").iloc[-1] for s in STRATEGIES
        }
        exact = rows["exact"].loss
        for strategy, val in rows.items():  # one model, whatever the strategy: its exact loss is exact's
            assert val.val_exact_loss == pytest.approx(exact, rel=1e-6), (tag, strategy)
            assert val.samples == size and not check.check_run(out / f"{tag}-{strategy}")
        assert abs(rows["sampler"].loss - exact) > 1e-9, tag  # padded at 2 and 3 ranks (1001 and 11 samples)
        summary = pd.read_csv(out / f"{tag}-sampler" / results.SUMMARY_CSV).iloc[0]
        assert summary.val_duplicates == math.ceil(size / world) * world - size
    # The Dataset holds linear's samples: its exact loss is the tensor path's.
    assert last_val(out / "disk-exact").loss == pytest.approx(last_val(out / "exact").loss, rel=1e-6)


def last_val(run_dir: Path) -> pd.Series:
    """The run's last loss.csv `val` row."""
    return pd.read_csv(run_dir / results.LOSS_CSV).query("split == 'val'").iloc[-1]
