"""The compute baseline (summary.csv `compute_s`) makes no collective, so a slower gradient allreduce moves
`exposed_comm_s` and leaves `compute_s` alone. Real DDP on a 2-rank gloo group (torch.multiprocessing),
its gradient allreduce through a Python comm hook that notes each call and can sleep first."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from backends.ddp import DDPBackend
from benchmarks.config import DDPConfig, RunConfig
from benchmarks.launch import TORCHRUN, LaunchInfo, rendezvous
from benchmarks.run import recorder as results
from benchmarks.run.ready import READY_STEPS
from benchmarks.run.trainer import BASELINE_WARMUP_STEPS, Trainer
from tests.helpers import config, fit

DELAY_S = 0.05
"""Slept in the comm hook before each gradient allreduce (the mlp's gradients fit in one bucket: once a step)."""
BASELINE_STEPS = 10
SPREAD_EPOCHS = 3
"""--compute-baseline-spread: a share of the baseline after each epoch, each with its own warm-up."""


class HookedDDP(DDPBackend):
    """The real DDP backend; every model it wraps sends its gradients through `_allreduce`."""

    delay_s = 0.0

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.gradient_allreduces = 0

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module, Any]:
        wrapped, optimizer = super().prepare(model, optimizer)
        wrapped.register_comm_hook(self, HookedDDP._allreduce)
        return wrapped, optimizer

    @staticmethod
    def _allreduce(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        state.gradient_allreduces += 1
        time.sleep(state.delay_s)
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


def collectives_so_far() -> int:
    """The default group's sequence number: one per collective on it, whoever issued it (DDP's C++ reducer too)."""
    return dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()


class CountingTrainer(Trainer):
    """The real Trainer, counting the collectives and hook calls inside each training and baseline step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_baseline = False
        self.counts: dict[str, list[tuple[int, int]]] = {"training": [], "baseline": []}
        self.order = ""
        """A letter a step, in the order they ran: t training, b the baseline."""

    def compute_baseline(self, plan: list[list[list[list[int]]]], chunk: int | None = None) -> list[float]:
        self.in_baseline = True  # by where the step runs, not by its `bare` argument, which a mutant may drop
        try:
            return super().compute_baseline(plan, chunk)
        finally:
            self.in_baseline = False

    def train_step(self, micro_batches: list[list[int]], epoch: int, bare: Any = None, *rest: Any) -> dict[str, Any]:
        backend = self.backend
        assert isinstance(backend, HookedDDP)
        seq, hooks = collectives_so_far(), backend.gradient_allreduces
        row = super().train_step(micro_batches, epoch, bare, *rest)
        counts = (collectives_so_far() - seq, backend.gradient_allreduces - hooks)
        self.counts["baseline" if self.in_baseline else "training"].append(counts)
        self.order += "b" if self.in_baseline else "t"
        return row


def _two_ranks(rank: int, port: int, out: Path) -> None:
    torch.set_num_threads(1)
    info = LaunchInfo(
        launcher=TORCHRUN,
        rank=rank,
        local_rank=rank,
        world_size=2,
        local_world_size=2,
        master_addr="127.0.0.1",
        master_port=port,
    )
    backend = HookedDDP(RunConfig(timeout=60), DDPConfig(), info)
    backend.init()
    found = {}
    try:
        for name, delay, epochs in (("plain", 0.0, 1), ("delayed", DELAY_S, 1), ("spread", 0.0, SPREAD_EPOCHS)):
            backend.delay_s = delay
            cfg = config(
                workload="mlp",
                epochs=epochs,
                steps_per_epoch=14,
                batch_size=16,
                warmup_steps=2,
                compute_baseline_steps=BASELINE_STEPS,
                compute_baseline_spread=name == "spread",
            )
            trainer = fit(backend, cfg, out / name if rank == 0 else None, CountingTrainer)
            assert isinstance(trainer, CountingTrainer)
            found[name] = {**trainer.counts, "order": trainer.order, "recorded": [len(trainer.compute_step_s)]}
    finally:
        backend.shutdown()
    (out / f"rank{rank}.json").write_text(json.dumps(found))
    # As a completed rank does: gloo's threads outlive the group and can abort interpreter teardown.
    rendezvous.exit_process(0)


@pytest.fixture(scope="module")
def hooked_runs(tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("baseline")
    mp.start_processes(_two_ranks, args=(rendezvous.free_port(), out), nprocs=2, start_method="spawn")
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_the_baseline_makes_no_collective(hooked_runs) -> None:
    _, ranks = hooked_runs
    for rank in ranks:
        for name, counts in rank.items():
            counts = {k: v for k, v in counts.items() if k in ("training", "baseline")}
            # The counters see the gradient allreduce: every training step issues one, through the hook.
            assert counts["training"] and all(seq >= 1 and hooks >= 1 for seq, hooks in counts["training"])
            warmups = BASELINE_WARMUP_STEPS * (SPREAD_EPOCHS if name == "spread" else 1)
            assert len(counts["baseline"]) == warmups + BASELINE_STEPS + READY_STEPS  # the ready schedule's too
            assert all(step == [0, 0] for step in counts["baseline"]), counts["baseline"]


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_spread_baseline_runs_between_the_epochs_and_records_every_step(hooked_runs) -> None:
    out, ranks = hooked_runs
    share = BASELINE_STEPS // SPREAD_EPOCHS
    for rank in ranks:
        order, steps = rank["spread"]["order"], len(rank["spread"]["training"]) // SPREAD_EPOCHS
        epoch = "t" * steps + "b" * (BASELINE_WARMUP_STEPS + share)  # an epoch, then its share (10 over 3: 3, 3, 4)
        assert steps > 0 and order.startswith(epoch + epoch + "t" * steps + "b"), order
        assert rank["plain"]["order"].startswith("t" * len(rank["plain"]["training"]) + "b"), rank["plain"]["order"]
        assert rank["spread"]["recorded"] == [BASELINE_STEPS]  # every chunk's steps, gathered at the end
    assert pd.read_csv(out / "spread" / results.SUMMARY_CSV).iloc[0]["compute_s"] > 0


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_slower_allreduce_moves_exposed_comm_not_compute(hooked_runs) -> None:
    out, _ = hooked_runs
    fast, slow = (pd.read_csv(out / d / results.SUMMARY_CSV).iloc[0] for d in ("plain", "delayed"))
    shown = {"fast": fast.to_dict(), "slow": slow.to_dict()}
    assert slow["exposed_comm_s"] - fast["exposed_comm_s"] > 0.6 * DELAY_S, shown
    assert abs(slow["compute_s"] - fast["compute_s"]) < 0.3 * DELAY_S, shown
