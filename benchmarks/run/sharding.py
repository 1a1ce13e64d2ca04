"""Seeding and data sharding: the one place that decides which rank sees which sample.

Training follows `torch.utils.data.DistributedSampler` (shuffle with seed + epoch, drop_last, a new
order every epoch), so the union of all ranks' batches at step s is exactly the contiguous block
s·W·B … (s+1)·W·B of the epoch's permutation: a single process with batch W·B sees the same samples.
Validation shards are exact: rank r evaluates samples r, r+W, r+2W, … of N, so every sample is
evaluated exactly once, with no padding duplicates and none dropped, for any N and world size.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import BatchSampler, DistributedSampler


def seed_everything(seed: int) -> None:
    """Seed every generator a workload might touch, identically on every rank and backend."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)


class ShardBatchSampler(BatchSampler):
    """This rank's training micro-batches: full batches over the `DistributedSampler` object itself.

    The one definition of the training order: `train_batches` lists it for the tensor path and a
    DataLoader iterates it for the Dataset path, so both feed the same samples to the same step.
    `limit` caps the batches per epoch, so a loader prefetches nothing past --steps-per-epoch.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        limit: int | None = None,
    ) -> None:
        self.shard = DistributedSampler(
            range(num_samples), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
        )
        super().__init__(self.shard, batch_size, drop_last=True)
        self.limit = limit

    def set_epoch(self, epoch: int) -> None:
        self.shard.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(super().__iter__(), self.limit)

    def __len__(self) -> int:
        full = super().__len__()
        return full if self.limit is None else min(full, self.limit)


def train_batches(
    num_samples: int,
    batch_size: int,
    rank: int,
    world_size: int,
    epoch: int,
    seed: int,
    shuffle: bool = True,
) -> list[list[int]]:
    """This rank's training batches for one epoch (full batches only, the same count on every rank)."""
    sampler = ShardBatchSampler(num_samples, batch_size, rank, world_size, seed, shuffle)
    sampler.set_epoch(epoch)
    return list(sampler)


def val_indices(num_samples: int, rank: int, world_size: int) -> range:
    """This rank's validation samples: strided, disjoint, covering all N exactly once."""
    return range(rank, num_samples, world_size)


def chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]
