"""Distributed validation: which samples each rank evaluates, how the results are combined, and its time.

`--val-strategy`:
- `exact` (the default): rank r evaluates samples r, r+W, r+2W, … of N: every sample once, none padded
  or dropped; loss and correct sums and the count are reduced, so the loss is the mean over the set.
- `sampler`: torch's `DistributedSampler(shuffle=False)`, the usual tutorial: it pads by repeating the
  first samples until every rank has ⌈N/W⌉, and each rank's mean loss is averaged over the ranks (a mean
  of means over a padded set: wrong whenever W does not divide N).
- `replicated`: every rank evaluates the whole set (a plain DataLoader on every rank): right, no speed-up.
- `rank0`: rank 0 evaluates the whole set while the others wait: right, no speed-up, idle ranks.

All four evaluate the one model `exact` does (floating-point buffers set to their mean over ranks first)
and, from the same pass, also sum the losses of distinct samples only (every duplicate left out), so each
validation records the exact loss of that model beside the loss the strategy reports: the difference is
the strategy's own error, with no second pass and no other run involved.

Timing: a barrier, this rank's evaluation and the combining reduction, a barrier; each rank's time between
the two barriers is gathered afterwards (off the clock), and the validation's time is the slowest rank's.
Averaging the buffers comes before the first barrier: it is distbench's step, not the strategy's. A
validation always follows a closed timed window and a gather, so no barrier lands inside a training step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from backends import step as step_options
from backends.base import Backend
from benchmarks.config import VAL_STRATEGIES, RunConfig
from benchmarks.run import data, sharding, workloads
from benchmarks.run import recorder as results

STRATEGIES = VAL_STRATEGIES
EXACT, SAMPLER, REPLICATED, RANK0 = STRATEGIES

VALIDATION_BUFFERS = "mean over ranks of floating-point buffers before each validation; training continues with it"
"""What a validation evaluates, recorded in run.json: BatchNorm running statistics differ per rank (Horovod
never syncs buffers; DDP's last forward updates them locally), so they are made equal first."""


def average_buffers(backend: Backend, model: nn.Module) -> None:
    """Set every floating-point buffer to its mean over ranks; one already equal everywhere keeps its bits.

    The mean is kept for training, so every rank carries on from the model that was evaluated. For
    running statistics (linear updates) that changes no later mean; DDP broadcasts rank 0's, now the mean.
    """
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if not buffers or backend.world_size == 1:
        return
    flat = torch.cat([b.detach().reshape(-1).double() for b in buffers])
    total = backend.all_reduce(flat.clone(), "sum")
    high = backend.all_reduce(flat.clone(), "max")
    low = -backend.all_reduce(-flat, "max")
    # An equal buffer (a constant mask, say) stays bit-exact: sum / world size may round it.
    mean = torch.where(high == low, flat, total / backend.world_size)
    offset = 0
    for buffer in buffers:
        buffer.copy_(mean[offset : offset + buffer.numel()].view_as(buffer))
        offset += buffer.numel()


@dataclass(frozen=True)
class Shard:
    """What one rank evaluates under a strategy."""

    indices: Sequence[int]
    """The samples, in order."""
    distinct: int
    """The first `distinct` of them are counted once over all ranks; every one after is a duplicate (of a
    sample another rank, or this one, also evaluates)."""

    @property
    def samples(self) -> int:
        return len(self.indices)

    @property
    def duplicates(self) -> int:
        return len(self.indices) - self.distinct


def shard(strategy: str, n: int, rank: int, world_size: int) -> Shard:
    """This rank's validation samples under `strategy`; over all ranks the distinct ones are each of the n once."""
    if strategy == EXACT:
        mine = sharding.val_indices(n, rank, world_size)
        return Shard(mine, len(mine))
    if strategy == SAMPLER:
        # torch's own sampler, as a tutorial uses it: position p of its padded list goes to rank p % W, and
        # positions >= n repeat the first samples. This rank's positions rank, rank + W, … below n come first.
        padded = list(DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False))
        return Shard(padded, len(range(rank, n, world_size)))
    if strategy == REPLICATED:  # rank 0's copy counts; every other rank's is a duplicate of it
        return Shard(range(n), n if rank == 0 else 0)
    if strategy == RANK0:
        return Shard(range(n) if rank == 0 else range(0), n if rank == 0 else 0)
    raise ValueError(f"unknown validation strategy {strategy!r}; known: {', '.join(STRATEGIES)}")


def per_rank_counts(strategy: str, n: int, world_size: int) -> list[dict[str, int]]:
    """Every rank's samples and duplicates (run.json `validation.per_rank`), known without communication."""
    shards = [shard(strategy, n, r, world_size) for r in range(world_size)]
    return [{"rank": r, "samples": s.samples, "duplicates": s.duplicates} for r, s in enumerate(shards)]


# The per-rank sums reduced once per validation: over every sample this rank evaluated, over its distinct
# ones only, and this rank's own mean (what `sampler` and `replicated` average over the ranks).
LOSS, CORRECT, COUNT, D_LOSS, D_CORRECT, D_COUNT, MEAN_LOSS, MEAN_CORRECT = range(8)


def combine(strategy: str, totals: Sequence[float], world_size: int) -> tuple[float, float, float, float]:
    """(reported loss, reported accuracy, exact loss, exact accuracy) from the reduced sums."""
    exact_loss, exact_acc = totals[D_LOSS] / totals[D_COUNT], totals[D_CORRECT] / totals[D_COUNT]
    if strategy in (SAMPLER, REPLICATED):  # a mean of the ranks' means
        return totals[MEAN_LOSS] / world_size, totals[MEAN_CORRECT] / world_size, exact_loss, exact_acc
    if strategy == RANK0:  # rank 0's alone: the others added nothing
        return totals[LOSS] / totals[COUNT], totals[CORRECT] / totals[COUNT], exact_loss, exact_acc
    return exact_loss, exact_acc, exact_loss, exact_acc


class Validation:
    """One rank's validations of a run under its --val-strategy; rank 0 records them."""

    def __init__(
        self, backend: Backend, workload: workloads.Workload, cfg: RunConfig, beat: Callable[[], None]
    ) -> None:
        self.backend, self.workload, self.cfg, self.beat = backend, workload, cfg, beat
        self.device = backend.device
        self.n = data.size(workload.val)
        self.strategy = cfg.val_strategy
        self.shard = shard(self.strategy, self.n, backend.rank, backend.world_size)
        self.feed = data.ValFeed(workload.val, cfg, backend.rank, backend.world_size, self.device, self.shard.indices)
        self.times: list[tuple[float, float]] = []
        """This rank's (seconds between the barriers, seconds evaluating) of each validation."""
        self.slowest: list[float] = []
        """Each validation's time: its slowest rank's."""

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _evaluate(self, model: nn.Module) -> torch.Tensor:
        """This rank's sums over its shard (see LOSS … MEAN_CORRECT)."""
        totals = torch.zeros(8, dtype=torch.float64, device=self.device)
        correct_fn, distinct, seen = self.workload.correct, self.shard.distinct, 0
        for batch, (x, y) in self.feed:
            out = model(x)
            loss = self.workload.loss(out, y).double()
            correct = correct_fn(out, y).double() if correct_fn is not None else torch.zeros_like(loss)
            keep = max(0, min(len(batch), distinct - seen))  # duplicates only ever come last
            totals[LOSS] += loss.sum()
            totals[CORRECT] += correct.sum()
            totals[D_LOSS] += loss[:keep].sum()
            totals[D_CORRECT] += correct[:keep].sum()
            seen += len(batch)
            self.beat()
        totals[COUNT], totals[D_COUNT] = seen, distinct
        if seen:
            totals[MEAN_LOSS], totals[MEAN_CORRECT] = totals[LOSS] / seen, totals[CORRECT] / seen
        return totals

    @torch.no_grad()
    def run(
        self, model: nn.Module, epoch: int, step: int, recorder: results.Recorder | None, repeat: int = 1
    ) -> dict[str, Any]:
        """One timed validation of `model` (the unwrapped one: DDP's forward would broadcast buffers);
        returns its loss.csv row, the same on every rank."""
        backend = self.backend
        average_buffers(backend, model)  # one model on every rank, not one per rank
        model.eval()
        backend.barrier()
        start = time.perf_counter()
        # FSDP2: every unit gathered once, so the passes make no collective; --amp: under training's autocast
        with backend.evaluation(model), step_options.autocast(self.cfg, self.device):
            totals = self._evaluate(model)
        self._sync()
        busy = time.perf_counter() - start
        reduced = backend.all_reduce(totals, "sum").tolist()
        backend.barrier()
        between = time.perf_counter() - start
        model.train()
        times = backend.all_gather_object((between, busy))  # after the closing barrier: off the clock
        self.times.append((between, busy))
        val_s = max(t for t, _ in times)
        self.slowest.append(val_s)
        loss, accuracy, exact_loss, _ = combine(self.strategy, reduced, backend.world_size)
        has_acc = self.workload.correct is not None
        if recorder is not None:
            recorder.meta["validation"] = self.describe(times)
        meta = recorder.meta if recorder is not None else {}
        return {
            "run_id": meta.get("run_id"),
            "backend": meta.get("backend"),
            "world_size": meta.get("world_size"),
            "epoch": epoch,
            "step": step,
            "split": "val",
            "loss": loss,
            "accuracy": accuracy if has_acc else None,
            "samples": int(reduced[D_COUNT]),
            "val_pass": repeat,
            "val_s": val_s,
            "val_samples_per_s": self.n / val_s if val_s > 0 else None,
            "val_exact_loss": exact_loss,
        }

    def describe(self, last: Sequence[tuple[float, float]]) -> dict[str, Any]:
        """run.json `validation`: the strategy, what each rank evaluates, and each rank's last times."""
        ranks = per_rank_counts(self.strategy, self.n, self.backend.world_size)
        for entry, (between, busy) in zip(ranks, last, strict=True):
            entry.update(last_s=between, last_busy_s=busy)
        return {
            "strategy": self.strategy,
            "val_size": self.n,
            "validations": len(self.slowest),
            "samples": sum(r["samples"] for r in ranks),
            "duplicates": sum(r["duplicates"] for r in ranks),
            "per_rank": ranks,
            "val_s_median": statistics.median(self.slowest),
        }

    def close(self) -> None:
        self.feed.close()
