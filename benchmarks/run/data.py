"""How a rank's batches reach the model: in-memory tensors indexed directly (the fast path), or a map-style
Dataset through a real DataLoader whose batch sampler wraps this rank's DistributedSampler.

Both paths take their order from `sharding.ShardBatchSampler`, and the loader's batches are checked
against the indices the trainer asks for, so the two give the same samples at the same step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.config import RunConfig
from benchmarks.run import sharding

Batch = tuple[torch.Tensor, torch.Tensor]


def size(data: tuple[torch.Tensor, torch.Tensor] | Dataset[Any]) -> int:
    """Samples in a split, tensors or Dataset."""
    return len(data[0]) if isinstance(data, tuple) else len(data)  # type: ignore[arg-type]


def loader_options(cfg: RunConfig, device: torch.device) -> dict[str, Any]:
    """DataLoader keywords: --workers and --prefetch-factor; pinned memory and persistent workers on CUDA."""
    options: dict[str, Any] = {"num_workers": cfg.workers, "pin_memory": device.type == "cuda"}
    if cfg.workers > 0:  # torch refuses both without worker processes
        options.update(prefetch_factor=cfg.prefetch_factor, persistent_workers=device.type == "cuda")
    return options


class _Batches:
    """A batch sampler over fixed index lists (validation's strided shards; a replay of training's)."""

    def __init__(self, batches: Iterable[list[int]], length: int | None = None) -> None:
        self.batches, self.length = batches, length

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("an endless replay has no length")
        return self.length


class Feed:
    """One split's batches on this rank. `fetch(indices)` returns exactly those samples."""

    def __init__(self, data: Any, cfg: RunConfig, device: torch.device) -> None:
        self.tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        if isinstance(data, tuple) and not cfg.dataloader:
            self.tensors = data
        self.dataset: Dataset[Any] = TensorDataset(*data) if isinstance(data, tuple) else data
        self.cfg, self.device = cfg, device
        self.options = loader_options(cfg, device)
        self._expected: Iterator[list[int]] = iter(())
        self._batches: Iterator[Batch] = iter(())

    def _loader(self, batch_sampler: Any, **options: Any) -> DataLoader[Any]:
        # Its own generator: drawing the workers' base seed leaves the global RNG as the tensor path does.
        generator = torch.Generator().manual_seed(self.cfg.seed)
        return DataLoader(self.dataset, batch_sampler=batch_sampler, generator=generator, **{**self.options, **options})

    def _open(self, expected: Iterable[list[int]], loader: DataLoader[Any]) -> None:
        """Read `loader` from here on; it yields the batches of `expected`, in order."""
        self._expected, self._batches = iter(expected), iter(loader)

    def _direct(self, indices: list[int]) -> Batch:
        assert self.tensors is not None
        index = torch.tensor(indices, dtype=torch.long)
        return self.tensors[0][index], self.tensors[1][index]

    def fetch(self, indices: list[int]) -> Batch:
        """The samples `indices`, on the device: the next batch of the open loader when it is the one
        asked for (always in training), otherwise a loader opened at it."""
        if self.tensors is not None:
            x, y = self._direct(indices)
        else:
            if next(self._expected, None) != indices:
                self._reopen(indices)
                next(self._expected)
            x, y = next(self._batches)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def _reopen(self, indices: list[int]) -> None:
        self._open([indices], self._loader(_Batches([indices], 1), persistent_workers=False))

    def close(self) -> None:
        """End the loader's workers now rather than when the iterator is collected."""
        self._expected, self._batches = iter(()), iter(())


class TrainFeed(Feed):
    """Training: a DataLoader over `ShardBatchSampler` (set_epoch every epoch), the one that defines
    `sharding.train_batches`; the compute baseline and the trace replay the batches trained on."""

    def __init__(self, data: Any, cfg: RunConfig, rank: int, world_size: int, device: torch.device) -> None:
        super().__init__(data, cfg, device)
        self.sampler = sharding.ShardBatchSampler(size(data), cfg.batch_size, rank, world_size, cfg.seed)
        # Only the micro-batches steps_in_epoch uses: a loader prefetches nothing past the cap.
        steps = len(self.sampler) // cfg.accumulate
        self.sampler.limit = min(steps, cfg.steps_per_epoch or steps) * cfg.accumulate
        self.loader = self._loader(self.sampler)
        self.history: list[list[int]] = []
        self.replaying = False
        """Set once training is over: the compute baseline and the trace may ask for any batch trained on."""

    def start_epoch(self, epoch: int) -> None:
        """Called at the top of each epoch (0-based), outside the timed window: workers start here."""
        if self.tensors is None:
            self.sampler.set_epoch(epoch)
            self._open(list(self.sampler), self.loader)

    def fetch(self, indices: list[int]) -> Batch:
        if self.tensors is None:  # only a loader's batches are ever replayed
            self.history.append(indices)
        return super().fetch(indices)

    def _reopen(self, indices: list[int]) -> None:
        if not self.replaying:  # in training a new loader would start inside a timed step: never silently
            raise RuntimeError(f"the DataLoader's next batch is not the trainer's ({indices[:4]}…): out of step")
        # The compute baseline and the trace cycle through the steps already trained, from the first
        # one they ask for: replay the batches seen so far, endlessly, from there.
        seen = self.history[:-1]
        start = next((i for i, b in enumerate(seen) if b == indices), None)
        if start is None:
            super()._reopen(indices)
            return
        replay = seen[start:] + seen[:start]
        self._open(itertools.cycle(replay), self._loader(_Batches(itertools.cycle(replay)), persistent_workers=False))


class ValFeed(Feed):
    """Validation: this rank's exact strided shard (`sharding.val_indices`), or the `indices` a
    --val-strategy gives it (`validation.shard`), in batches."""

    def __init__(
        self,
        data: Any,
        cfg: RunConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        indices: Sequence[int] | None = None,
    ) -> None:
        super().__init__(data, cfg, device)
        mine = sharding.val_indices(size(data), rank, world_size) if indices is None else indices
        self.batches = sharding.chunks(mine, cfg.batch_size)
        self.loader = None if self.tensors is not None else self._loader(_Batches(self.batches, len(self.batches)))

    def __iter__(self) -> Iterator[tuple[list[int], Batch]]:
        if self.loader is None:
            for batch in self.batches:
                x, y = self._direct(batch)
                yield batch, (x.to(self.device), y.to(self.device))
            return
        for batch, (x, y) in zip(self.batches, self.loader, strict=True):
            yield batch, (x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
