"""Datasets that read from disk: the `storage=disk` argument of every built-in workload.

The built-in data is generated from the seed; with `storage=disk` it is written once as `.npy` files under
the data cache (named by a hash of their content, so a stale or half-written file is never read) and
every sample is then read back through a memory map, in the DataLoader's workers when there are some.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from benchmarks.run.workloads import Workload


class MemmapDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i is row i of an inputs and a targets `.npy` file, read through a memory map."""

    def __init__(self, inputs: Path, targets: Path) -> None:
        self.paths = (inputs, targets)
        self._maps: tuple[np.ndarray, np.ndarray] | None = None
        self._len = len(np.load(inputs, mmap_mode="r"))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._maps is None:  # opened in each process that reads: the main one and every loader worker
            self._maps = (np.load(self.paths[0], mmap_mode="r"), np.load(self.paths[1], mmap_mode="r"))
        x, y = self._maps
        return torch.from_numpy(np.array(x[index])), torch.from_numpy(np.array(y[index]))

    def __getstate__(self) -> dict[str, Any]:
        # A spawned worker gets the file names, not a pickled copy of the whole mapped array.
        return {**self.__dict__, "_maps": None}


def write_once(array: np.ndarray, directory: Path) -> Path:
    """`array` as `<sha256>.npy` in `directory`; an existing file of that content is reused as is."""
    digest = hashlib.sha256(array.tobytes() + str((array.dtype, array.shape)).encode()).hexdigest()
    path = directory / f"{digest[:32]}.npy"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        # Every rank may write at once: each into its own file, then an atomic rename onto the name.
        tmp = directory / f"{digest[:32]}.{os.getpid()}.tmp.npy"
        np.save(tmp, array)
        os.replace(tmp, path)
    return path


def on_disk(workload: Workload, name: str, seed: int, cache: Path) -> Workload:
    """The same workload with its tensor splits written to `cache` and read back through MemmapDataset."""
    splits = {}
    for split in ("train", "val"):
        data = getattr(workload, split)
        if not isinstance(data, tuple):
            raise ValueError(f"workload '{name}': storage=disk needs in-memory tensors to write, not a Dataset")
        x, y = (write_once(t.contiguous().numpy(), cache) for t in data)
        splits[split] = MemmapDataset(x, y)
    return dataclasses.replace(workload, **splits)
