"""Workloads by name, each declared once with its defaults; torch is imported only to build one.

A workload is a model factory plus train and validation sets that are deterministic by index. A
user's own is loaded with `--workload package.module:factory`, where
`factory(seed, train_size, val_size) -> Workload`; it takes the generic defaults below.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from benchmarks.config import RunConfig


@dataclass
class Workload:
    """What the harness trains: the same object for every backend."""

    name: str
    build_model: Callable[[], nn.Module]
    train: tuple[torch.Tensor, torch.Tensor]
    """Inputs and targets; row i is sample i."""
    val: tuple[torch.Tensor, torch.Tensor]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Per-sample losses (no reduction), so sums and counts reduce exactly across ranks."""
    correct: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """Per-sample correctness in [0, 1]; None for regression."""


@dataclass(frozen=True)
class WorkloadSpec:
    """A built-in workload: where its factory lives and the run options it brings."""

    factory: str
    """`module:function` returning a Workload."""
    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)
    """RunConfig fields the workload sets when the user does not (e.g. a learning rate that trains it)."""


GENERIC_DEFAULTS: dict[str, Any] = {"lr": 0.05, "batch_size": 32}
"""What a custom `module:factory` workload gets for options left at `None` (\"the workload's\")."""

_B = "benchmarks.run.workloads.builtin"
# Each learns well above chance with these in `run`'s default two epochs on 2 ranks (checked with
# `distbench run --backend single --batch-size 2×batch`): linear val MSE 0.011 (noise 0.01), mlp 90 %
# val accuracy, cnn 76 % (chance 10 %), transformer 64 % next-token accuracy. mlp's train size is
# left to the factory: every digit not in validation.
REGISTRY: dict[str, WorkloadSpec] = {
    "linear": WorkloadSpec(
        f"{_B}:linear", "nn.Linear(10, 1) regression, MSE",
        {"lr": 0.05, "batch_size": 32, "train_size": 4096, "val_size": 1024},
    ),
    "mlp": WorkloadSpec(
        f"{_B}:mlp", "64-128-128-10 MLP on sklearn digits (1797)", {"lr": 0.1, "batch_size": 32, "val_size": 360}
    ),
    "cnn": WorkloadSpec(
        f"{_B}:cnn", "small ResNet with BatchNorm, 3x32x32",
        {"lr": 0.05, "batch_size": 32, "train_size": 2048, "val_size": 512},
    ),
    "transformer": WorkloadSpec(
        f"{_B}:transformer", "tiny GPT, 4 layers, dim 128",
        {"lr": 0.3, "batch_size": 16, "train_size": 2048, "val_size": 256},
    ),
}  # fmt: skip


def defaults_for(name: str) -> dict[str, Any]:
    """The option values `name` brings (the generic ones for a custom workload)."""
    spec = REGISTRY.get(name)
    return {**GENERIC_DEFAULTS, **(spec.defaults if spec else {})}


def resolve(cfg: RunConfig) -> RunConfig:
    """`cfg` with every option left at None that the workload has a default for filled in."""
    fill = {k: v for k, v in defaults_for(cfg.workload).items() if getattr(cfg, k) is None}
    return dataclasses.replace(cfg, **fill)


def _factory(name: str) -> Callable[..., Any]:
    if name in REGISTRY:
        module_name, _, attr = REGISTRY[name].factory.partition(":")
        return getattr(importlib.import_module(module_name), attr)
    if ":" not in name:
        raise ValueError(f"unknown workload '{name}'; known: {', '.join(REGISTRY)} (or package.module:factory)")
    # The console script's sys.path[0] is its bin directory, not the working directory `python -m` would
    # add; put it first so `--workload mymodule:factory` finds ./mymodule.py either way.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # a user's module may fail to import in any way; say which workload
        raise ValueError(f"cannot load workload '{name}': {type(exc).__name__}: {exc}") from exc


def load(name: str, seed: int, train_size: int | None = None, val_size: int | None = None) -> Workload:
    """Build a workload by registry name or `package.module:factory`; ValueError, naming it, on any failure."""
    factory = _factory(name)
    try:
        workload = factory(seed, train_size, val_size)
    except Exception as exc:
        raise ValueError(f"workload '{name}' failed to build: {type(exc).__name__}: {exc}") from exc
    if not isinstance(workload, Workload):
        raise ValueError(f"workload '{name}': the factory returned {type(workload).__name__}, not a workloads.Workload")
    return workload


def source(name: str) -> dict[str, str]:
    """The file a loaded workload's factory lives in and its SHA-256, so run.json pins the exact code."""
    module_name = REGISTRY[name].factory.partition(":")[0] if name in REGISTRY else name.partition(":")[0]
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if path is None:
        return {"module": module_name, "file": "", "sha256": ""}
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {"module": module_name, "file": str(Path(path).resolve()), "sha256": digest}
