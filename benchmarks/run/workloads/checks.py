"""The checks a workload passes before any process group starts, each failing in one line (InputError).

Imports torch, so the package reads it only once a workload is built (`benchmarks.run.workloads.prepare`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from backends import horovod_autotune
from benchmarks import config
from benchmarks.config import RunConfig
from benchmarks.errors import InputError
from benchmarks.run.workloads import Workload


def _describe(exc: BaseException) -> str:
    from benchmarks.run.workloads import raised_at

    return (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) + raised_at(exc)


def _first_two(samples: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples 0 and 1 as one batch, collated as a DataLoader would."""
    if isinstance(samples, tuple):
        return samples[0][:2], samples[1][:2]
    return default_collate([samples[i] for i in range(min(2, len(samples)))])


def shape_hint(shape: tuple[int, ...] | str, batch: int) -> str:
    """How to turn what a loss returned into one value per sample."""
    if isinstance(shape, tuple) and len(shape) > 1 and shape[0] == batch:
        dims = "dim=1" if len(shape) == 2 else f"dim={tuple(range(1, len(shape)))}"
        return f"reduce over the dimensions after the first, e.g. .mean({dims})"
    return "return it unreduced, e.g. F.cross_entropy(out, target, reduction='none')"


def check_workload(workload: Workload, name: str) -> None:
    """Catch a malformed workload up front, in one line.

    A loss reduced to a mean would still train, on a gradient divided by the batch size, so the shape
    of the loss on two samples is checked here rather than trusted.
    """

    def problem(text: str) -> InputError:
        return InputError(f"workload '{name}': {text}")

    for split in ("train", "val"):
        samples = getattr(workload, split)
        if isinstance(samples, tuple):
            if not (len(samples) == 2 and all(isinstance(t, torch.Tensor) for t in samples)):
                raise problem(f"{split} must be a tuple (inputs, targets) of tensors or a map-style Dataset")
            if len(samples[0]) != len(samples[1]) or len(samples[0]) == 0:
                raise problem(
                    f"{split} has {len(samples[0])} inputs and {len(samples[1])} targets; both must be equal and > 0"
                )
            continue
        if not isinstance(samples, Dataset) or isinstance(samples, IterableDataset) or not hasattr(samples, "__len__"):
            raise problem(
                f"{split} is {type(samples).__name__}; give a tuple (inputs, targets) of tensors or a map-style "
                "torch.utils.data.Dataset with __len__ and __getitem__"
            )
        try:
            count, item = len(samples), samples[0] if len(samples) else None
        except Exception as exc:
            raise problem(f"reading {split}[0] failed: {_describe(exc)}") from exc
        if count == 0:
            raise problem(f"{split} is an empty Dataset")
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise problem(
                f"{split}[0] is {type(item).__name__}; a Dataset's item i must be the pair (input, target) of sample i"
            )
    try:
        model = workload.build_model()
        if not isinstance(model, torch.nn.Module):
            raise problem(f"build_model() returned {type(model).__name__}, not a torch.nn.Module")
        x, y = _first_two(workload.train)
        model.eval()  # a throwaway copy: no BatchNorm statistics of the real model move
        with torch.no_grad():
            out = model(x)
            checks = {"loss": workload.loss(out, y)}
            if workload.correct is not None:
                checks["correct"] = workload.correct(out, y)
    except InputError:
        raise
    except Exception as exc:
        raise problem(f"a forward pass and loss on the first training samples failed: {_describe(exc)}") from exc
    for fn, value in checks.items():
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        if shape != (len(x),):
            raise problem(
                f"{fn}(out, target) must give one value per sample (shape ({len(x)},) for 2 samples), got {shape}; "
                + shape_hint(shape, len(x))
            )
    if workload.optimizer is not None:  # its own optimizer: built on the throwaway model, so a bad one is bad input
        try:
            optimizer = workload.optimizer(model, 0.01)
        except Exception as exc:
            raise problem(f"optimizer(model, lr) failed: {_describe(exc)}") from exc
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise problem(f"optimizer(model, lr) returned {type(optimizer).__name__}, not a torch.optim.Optimizer")


def data_steps(cfg: RunConfig, train_size: int, world_size: int) -> int:
    """Optimizer steps the data gives each rank per epoch: its share of the samples ÷ (batch × accumulate),
    what sharding.train_batches gives it before --steps-per-epoch caps it."""
    return train_size // world_size // cfg.batch_size // cfg.accumulate


def epoch_steps(cfg: RunConfig, train_size: int, world_size: int) -> int:
    """Optimizer steps per epoch: the data's, capped by --steps-per-epoch."""
    steps = data_steps(cfg, train_size, world_size)
    return min(steps, cfg.steps_per_epoch or steps)


def check_steps(cfg: RunConfig, train_size: int, world_size: int, autotune: bool = False) -> None:
    """InputError when a rank's share of the `train_size` samples gives it no timed step; with `autotune`,
    none after Horovod's autotuner has searched (it searches in the warm-up)."""
    shard = train_size // world_size
    if shard < cfg.batch_size * cfg.accumulate:
        raise InputError(
            f"--batch-size {cfg.batch_size} × --accumulate {cfg.accumulate} is larger than each rank's share "
            f"of the {train_size} training samples ({shard} on {world_size} ranks); "
            "lower --batch-size or raise --train-size"
        )
    steps = epoch_steps(cfg, train_size, world_size)
    if cfg.epochs * steps <= cfg.warmup_steps and not cfg.eval_only:  # --eval-only times no training step
        raise config.no_timed_steps(cfg, steps)
    if autotune and not cfg.eval_only:
        horovod_autotune.check_steps(cfg.warmup_steps, cfg.epochs * steps, os.environ, horovod_autotune.gpu_build())
