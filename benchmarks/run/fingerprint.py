"""Rank-consistency fingerprints: what each rank is about to train on, hashed before training.

Data-parallel training assumes every rank holds the same dataset (each reads its own shard of it) and
starts from the same weights. A workload written the tutorial way, data made at import with an unseeded
`torch.randn`, breaks the first silently: each rank trains on different samples, and backends that
should agree do not. So every rank hashes its training and validation samples and its model's initial
parameters (as built, before the backend broadcasts rank 0's), the harness compares the hashes across
ranks off the timed path, and run.json keeps them, so runs of different variants can be compared too.

Hashes cover content only (dtype, shape, bytes): never an object's identity, which differs per process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.errors import InputError
from benchmarks.run.workloads import Workload, load

DIGEST_CHARS = 16
FRESH_TIMEOUT_S = 120.0
DATASET_ITEMS = 32
"""Items hashed from a Dataset: spread evenly over it, the first and last included. A Dataset may compute
or read each item, so all of them would cost as much as an epoch; in-memory tensors are hashed whole."""
WHOLE_TENSOR_BYTES = 256 * 2**20
"""In-memory splits up to this size are hashed whole (every built-in at its defaults, ~0.3 s at most);
larger ones by `TENSOR_ROWS` rows spread evenly, so a huge set costs no seconds on every rank."""
TENSOR_ROWS = 4096


def _feed(h: Any, value: Any) -> None:
    """Hash a sample's content: tensors and arrays by dtype, shape and bytes; containers element-wise."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        if flat.numel():  # the tensor's own memory, no copy
            h.update(flat.view(torch.uint8).numpy())
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for key in sorted(value, key=str):
            _feed(h, str(key))
            _feed(h, value[key])
    elif isinstance(value, (str, bytes, bool, numbers.Number)) or value is None:
        h.update(repr(value).encode())
    else:  # an object of its own: its repr may hold an address, so only its type is known to be equal
        h.update(type(value).__qualname__.encode())


def dataset_indices(count: int, items: int = DATASET_ITEMS) -> list[int]:
    """The items of a Dataset of `count` that are hashed: evenly spread, first and last included."""
    if count <= items:
        return list(range(count))
    return sorted({round(k * (count - 1) / (items - 1)) for k in range(items)})


def of_split(samples: Any) -> dict[str, Any]:
    """A split's fingerprint: every row of in-memory tensors, a fixed sample of a Dataset's items."""
    h = hashlib.sha256()
    if isinstance(samples, tuple):
        if sum(t.numel() * t.element_size() for t in samples) <= WHOLE_TENSOR_BYTES:
            _feed(h, samples)
            return {"sha256": h.hexdigest()[:DIGEST_CHARS], "items": "all"}
        rows = torch.tensor(dataset_indices(len(samples[0]), TENSOR_ROWS))
        h.update(str([tuple(t.shape) for t in samples]).encode())
        _feed(h, tuple(t.index_select(0, rows.to(t.device)) for t in samples))
        return {"sha256": h.hexdigest()[:DIGEST_CHARS], "items": len(rows)}
    indices = dataset_indices(len(samples))
    for i in indices:
        h.update(f"#{i}".encode())
        _feed(h, samples[i])
    return {"sha256": h.hexdigest()[:DIGEST_CHARS], "items": len(indices)}


def of_data(train: Any, val: Any) -> dict[str, dict[str, Any]]:
    return {"train": of_split(train), "val": of_split(val)}


def of_model(model: nn.Module) -> str:
    """The parameters and buffers as built, by name."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        _feed(h, tensor)
    return h.hexdigest()[:DIGEST_CHARS]


def float_buffers(model: nn.Module) -> int:
    """Floating-point buffers (BatchNorm running statistics): what DDP's broadcast_buffers acts on."""
    return sum(1 for b in model.buffers() if b.is_floating_point())


def differing_data(prints: list[dict[str, dict[str, Any]]], name: str, who: str = "") -> str | None:
    """The bad-input line when some rank's data (`prints`, by rank) is not rank 0's, else None. `who`
    names the builders when they are not ranks."""
    for split in ("train", "val"):
        others = [r for r, fp in enumerate(prints) if fp[split]["sha256"] != prints[0][split]["sha256"]]
        if others:
            which = "training" if split == "train" else "validation"
            ranks = f"the ranks built different {which} data (rank {', '.join(map(str, others))} differs from rank 0)"
            return (
                f"workload '{name}': {f'{who} built different {which} data' if who else ranks}, so each rank "
                "would train on samples of its own; build the data from the factory's `seed` argument "
                "(e.g. torch.Generator().manual_seed(seed)), not from unseeded random state at import"
            )
    return None


def weights_record(by_rank: list[str]) -> dict[str, Any]:
    """run.json's record of the initial weights: rank 0's, and each rank's when they differ (which is
    harmless, since rank 0's are broadcast, but says the model's construction is not seeded)."""
    same = all(fp == by_rank[0] for fp in by_rank)
    return {"initial_weights": by_rank[0], "initial_weights_agree": same, **({} if same else {"by_rank": by_rank})}


def check_data(mine: dict[str, dict[str, Any]], gather: Callable[[Any], list[Any]], name: str) -> None:
    """Compare this rank's data fingerprint with every other rank's (a collective: off the timed path);
    InputError, the same on every rank, when they differ."""
    problem = differing_data(gather(mine), name)
    if problem:
        raise InputError(problem)


def recording(workload: Workload) -> tuple[Workload, list[str]]:
    """The workload with a `build_model` that also hashes each model it builds, as built (before the backend
    broadcasts rank 0's weights), and the list the digests go to."""
    built: list[str] = []
    build = workload.build_model

    def build_and_hash() -> nn.Module:
        model = build()
        built.append(of_model(model))
        return model

    return dataclasses.replace(workload, build_model=build_and_hash), built


def check_fresh_process(workload: Workload, name: str, seed: int, sizes: tuple[int | None, int | None]) -> None:
    """Bad input when a fresh process builds other data than `workload` (built here): what each rank of a
    job would then do. Lets compare refuse an unseeded workload before any job starts."""
    argv = [sys.executable, "-m", "benchmarks.run.fingerprint", name, str(seed), *(str(s or 0) for s in sizes)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=FRESH_TIMEOUT_S, check=True)
        theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return  # a workload that cannot be built twice fails in its jobs, where the error is said
    problem = differing_data([of_data(workload.train, workload.val), theirs], name)
    if problem:
        raise InputError(
            problem.replace("the ranks built", "two processes built").replace(" (rank 1 differs from rank 0)", "")
        )


if __name__ == "__main__":  # check_fresh_process's other process
    name, seed, train_size, val_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    built = load(name, seed, train_size or None, val_size or None)
    print(json.dumps(of_data(built.train, built.val)))
