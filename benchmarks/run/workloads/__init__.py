"""Workloads by name: loading and building one; torch is imported only to build one.

A workload is a model factory plus train and validation sets that are deterministic by index. A
user's own is loaded with `--workload package.module:factory`, where
`factory(seed, train_size, val_size) -> Workload`; it takes the generic defaults.

What each name means (built-ins, size arguments such as `transformer:dim=768,layers=12,heads=12`,
presets such as `gpt2-small`, `hf:` models) and the options each brings are declared once in
`benchmarks.catalog`, which this package reads.

A run asks once, `prepare(cfg, world_size)`, and gets a `ResolvedWorkload`: its options with the workload's
defaults filled in, the workload built and checked (`checks`), and the source run.json pins.
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

from benchmarks.catalog import HF, REGISTRY, Name, defaults_for, parse
from benchmarks.errors import InputError

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from benchmarks.config import RunConfig


@dataclass
class Workload:
    """What the harness trains: the same object for every backend."""

    name: str
    build_model: Callable[[], nn.Module]
    train: tuple[torch.Tensor, torch.Tensor] | Dataset[Any]
    """Inputs and targets, row i sample i (the fast path), or a map-style Dataset whose item i is the
    pair (input, target) of sample i, fed through a DataLoader."""
    val: tuple[torch.Tensor, torch.Tensor] | Dataset[Any]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Per-sample losses (no reduction), so sums and counts reduce exactly across ranks."""
    correct: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """Per-sample correctness in [0, 1]; None for regression."""
    optimizer: Callable[[nn.Module, float], torch.optim.Optimizer] | None = None
    """`optimizer(model, lr)`: the workload's own optimizer, used instead of --optimizer's."""
    args: dict[str, Any] = field(default_factory=dict)
    """The size arguments the model and data were built with, defaults filled in (run.json)."""


DATA_CACHE = Path(os.environ.get("DISTBENCH_DATA_CACHE", Path.home() / ".cache" / "distbench" / "data"))


@dataclass(frozen=True)
class ResolvedWorkload:
    """What a run needs of its workload, asked for once (`prepare`); the harness then only runs it."""

    cfg: RunConfig
    """The run's options, every one left at None that the workload has a default for filled in."""
    name: Name
    """`cfg.workload`, parsed once."""
    workload: Workload
    """Built and checked: well-formed, and a timed step for every rank at the world size asked for."""
    train_size: int
    val_size: int
    source: dict[str, str]
    """The file the factory lives in and its SHA-256 (run.json `workload_source`), so run.json pins the code."""


def prepare(cfg: RunConfig, world_size: int, autotune: bool = False) -> ResolvedWorkload:
    """The workload `cfg` names, resolved, built and checked before any process group starts; InputError, in
    one line, when it cannot be built, is malformed, or gives a rank no timed step (`autotune`: none after
    Horovod's autotuner has searched)."""
    from benchmarks.run import data
    from benchmarks.run.workloads import checks

    try:
        parsed = parse(cfg.workload)
        cfg = _filled(cfg, parsed.defaults)
        workload = _build(parsed, cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    checks.check_workload(workload, cfg.workload)
    train_size = data.size(workload.train)
    checks.check_steps(cfg, train_size, world_size, autotune)
    return ResolvedWorkload(cfg, parsed, workload, train_size, data.size(workload.val), _source(parsed))


def resolve(cfg: RunConfig) -> RunConfig:
    """`cfg` with every option left at None that the workload has a default for filled in; a bad name is
    left for `parse` to say."""
    return _filled(cfg, defaults_for(cfg.workload))


def _filled(cfg: RunConfig, defaults: dict[str, Any]) -> RunConfig:
    return dataclasses.replace(cfg, **{k: v for k, v in defaults.items() if getattr(cfg, k) is None})


OURS = (str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[3] / "backends"))
"""distbench's own source (benchmarks/, backends/): where an error is raised in a user's code, these frames are not."""


def raised_at(exc: BaseException) -> str:
    """' (at file.py:LINE)': the last frame of the traceback in a user's own file (not distbench's, not an installed
    library's), so an error raised inside a workload module says where; '' when there is none."""
    tb, found = exc.__traceback__, ""
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        library = "site-packages" in path or "dist-packages" in path or path.startswith("<")
        if not library and not path.startswith(OURS) and "/lib/python" not in path:
            found = f" (at {path}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found


def _factory(name: str) -> Callable[..., Any]:
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
        raise ValueError(f"cannot load workload '{name}': {type(exc).__name__}: {exc}{raised_at(exc)}") from exc


def _module_of(parsed: Name) -> str:
    if parsed.kind == HF:
        return "benchmarks.run.workloads.hf"
    factory = REGISTRY[parsed.base].factory if parsed.kind == "builtin" else parsed.base
    return factory.partition(":")[0]


def load(name: str, seed: int, train_size: int | None = None, val_size: int | None = None) -> Workload:
    """Build a workload by registry name or `package.module:factory`; ValueError, naming it, on any failure.
    Unchecked: a run's goes through `prepare`."""
    return _build(parse(name), name, seed, train_size, val_size)


def _build(parsed: Name, name: str, seed: int, train_size: int | None, val_size: int | None) -> Workload:
    if parsed.kind == "custom":
        factory = _factory(name)
        args: dict[str, Any] = {}
    elif parsed.kind == HF:
        from benchmarks.run.workloads import hf

        factory, args = hf.build, {"config": parsed.base, **parsed.args}
    else:
        module_name, _, attr = REGISTRY[parsed.base].factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        args = {k: v for k, v in parsed.args.items() if k != "storage"}
    try:
        workload = factory(seed, train_size, val_size, **args)
    except Exception as exc:
        said = " ".join(str(exc).split())  # one line: some libraries' messages span several
        raise ValueError(f"workload '{name}' failed to build: {type(exc).__name__}: {said}{raised_at(exc)}") from exc
    if not isinstance(workload, Workload):
        raise ValueError(f"workload '{name}': the factory returned {type(workload).__name__}, not a workloads.Workload")
    if parsed.kind == "builtin":  # hf's factory records its own, the configuration's values included
        workload.args = dict(parsed.args)
    if parsed.args.get("storage") == "disk":
        from benchmarks.run.workloads import datasets

        workload = datasets.on_disk(workload, name, seed, DATA_CACHE)
    return workload


def _source(parsed: Name) -> dict[str, str]:
    """The file a built workload's factory lives in (imported by building it) and its SHA-256."""
    module_name = _module_of(parsed)
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if path is None:
        return {"module": module_name, "file": "", "sha256": ""}
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {"module": module_name, "file": str(Path(path).resolve()), "sha256": digest}
