"""Sharding and workloads, in-process: which rank sees which sample, and deterministic data."""

from __future__ import annotations

import pytest

from benchmarks import catalog
from benchmarks.run import sharding, workloads


def test_val_shards_cover_every_sample_once() -> None:
    for n in (1, 7, 1001):
        for world in (1, 2, 3, 4):
            seen = sorted(i for r in range(world) for i in sharding.val_indices(n, r, world))
            assert seen == list(range(n))


def test_train_shards_are_disjoint_and_reshuffled_each_epoch() -> None:
    def epoch_indices(rank: int, epoch: int) -> list[int]:
        return [i for batch in sharding.train_batches(100, 8, rank, 2, epoch, seed=0) for i in batch]

    r0, r1 = epoch_indices(0, 0), epoch_indices(1, 0)
    assert not set(r0) & set(r1) and len(r0) == len(r1) == 48
    assert epoch_indices(0, 1) != r0


def test_union_of_rank_batches_is_the_single_process_batch() -> None:
    single = sharding.train_batches(100, 16, 0, 1, 0, seed=3)
    per_rank = [sharding.train_batches(100, 8, r, 2, 0, seed=3) for r in range(2)]
    assert len(single) == len(per_rank[0])
    for step, batch in enumerate(single):
        assert sorted(batch) == sorted(per_rank[0][step] + per_rank[1][step])


def test_workloads_are_deterministic_by_index() -> None:
    for name in catalog.REGISTRY:
        a = workloads.load(name, seed=1, train_size=64, val_size=32)
        b = workloads.load(name, seed=1, train_size=64, val_size=32)
        assert all((x == y).all() for x, y in zip(a.train + a.val, b.train + b.val, strict=True))
        assert len(a.train[0]) == 64 and len(a.val[0]) == 32


def test_unknown_workload_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="known: linear, mlp, cnn, transformer"):
        workloads.load("nope", seed=0)


def test_unknown_backend_lists_known_ones() -> None:
    import backends

    with pytest.raises(ValueError, match="known: ddp, horovod, fsdp, deepspeed, single"):
        backends.get("mxnet")
