"""Workloads by name, each declared once with its defaults; torch is imported only to build one.

A workload is a model factory plus train and validation sets that are deterministic by index. A
user's own is loaded with `--workload package.module:factory`, where
`factory(seed, train_size, val_size) -> Workload`; it takes the generic defaults below.

A built-in takes size arguments, `transformer:dim=768,layers=12,heads=12`; a preset names a set of them
(`gpt2-small`, itself open to more: `gpt2-small:context=64`); `hf:gpt2` builds a Hugging Face model from
its configuration class. Names are parsed and checked here without torch, so bad ones stop before any
process group starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


@dataclass(frozen=True)
class WorkloadSpec:
    """A built-in workload: where its factory lives and the run options it brings."""

    factory: str
    """`module:function` returning a Workload."""
    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)
    """RunConfig fields the workload sets when the user does not (e.g. a learning rate that trains it)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Size arguments (`name:key=value,...`) and their defaults; every one a positive integer."""


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
        f"{_B}:mlp", "64-128-128-10 MLP on sklearn digits (1797)", {"lr": 0.1, "batch_size": 32, "val_size": 360},
        {"hidden": 128, "layers": 2},
    ),
    "cnn": WorkloadSpec(
        f"{_B}:cnn", "small ResNet with BatchNorm, 3x32x32",
        {"lr": 0.05, "batch_size": 32, "train_size": 2048, "val_size": 512},
        {"width": 16, "stages": 3, "blocks": 1},
    ),
    "transformer": WorkloadSpec(
        f"{_B}:transformer", "tiny GPT, 4 layers, dim 128",
        {"lr": 0.3, "batch_size": 16, "train_size": 2048, "val_size": 256},
        {"vocab": 512, "context": 32, "dim": 128, "layers": 4, "heads": 4, "tied": 0},
    ),
}  # fmt: skip

STORAGE = ("memory", "disk")
"""Every built-in's `storage` argument: `disk` writes its data once as numpy memmaps under DATA_CACHE and
trains from a Dataset reading them, through a DataLoader (the same samples, so the same loss curve)."""

DATA_CACHE = Path(os.environ.get("DISTBENCH_DATA_CACHE", Path.home() / ".cache" / "distbench" / "data"))


@dataclass(frozen=True)
class Preset:
    """A named set of a built-in's size arguments, with run options that suit its size."""

    base: str
    args: dict[str, Any]
    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)


# Parameter counts and gradient bytes (fp32, per rank per step) are checked by tests/unit/test_workloads.py.
PRESETS: dict[str, Preset] = {
    "gpt2-small": Preset(
        "transformer", {"vocab": 50257, "context": 128, "dim": 768, "layers": 12, "heads": 12, "tied": 1},
        "GPT-2 small's shape (tied embeddings), context 128: 123,751,680 parameters, 495.0 MB of gradients",
        {"lr": 0.01, "batch_size": 4, "train_size": 512, "val_size": 32},
    ),
    "cnn-25m": Preset(
        "cnn", {"width": 96, "stages": 4, "blocks": 2},
        "ResNet-18-like, 4 stages of 2 blocks, widths 96-768: 25,129,066 parameters, 100.5 MB of gradients",
        {"lr": 0.05, "batch_size": 16, "train_size": 1024, "val_size": 128},
    ),
}  # fmt: skip

HF = "hf"
HF_DEFAULTS: dict[str, Any] = {"lr": 0.01, "batch_size": 8, "train_size": 512, "val_size": 64}
HF_ALIASES = {"gpt2": "GPT2Config", "bert-base-uncased": "BertConfig"}
"""Hub names whose architecture is their configuration class's defaults (no download needed)."""


@dataclass(frozen=True)
class Name:
    """A parsed `--workload`: a built-in (size arguments resolved), an `hf:` model, or a user's factory."""

    kind: str
    """builtin, hf or custom."""
    base: str
    """The registry name, the `hf:` configuration, or the `module:factory`."""
    args: dict[str, Any]


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(name: str, text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"workload '{name}': '{item}' is not key=value; write e.g. transformer:dim=256,layers=4")
        if key.strip() in out:
            raise ValueError(f"workload '{name}': {key.strip()} is given twice; give each argument once")
        out[key.strip()] = _value(value.strip())
    return out


def _check_builtin(name: str, base: str, args: dict[str, Any]) -> dict[str, Any]:
    known = {**REGISTRY[base].args, "storage": STORAGE[0]}
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise ValueError(f"workload '{name}': unknown argument '{unknown[0]}'; {base} takes {', '.join(known)}")
    resolved = {**known, **args}
    for key, value in resolved.items():
        if key == "storage":
            if value not in STORAGE:
                raise ValueError(f"workload '{name}': storage={value}; use storage=memory or storage=disk")
        elif key == "tied":
            if value not in (0, 1):
                raise ValueError(f"workload '{name}': tied={value}; use tied=0 or tied=1")
        elif not isinstance(value, int) or value < 1:
            raise ValueError(f"workload '{name}': {key}={value} must be a positive integer")
    if base == "transformer" and resolved["dim"] % resolved["heads"]:
        raise ValueError(
            f"workload '{name}': heads={resolved['heads']} does not divide dim={resolved['dim']}; "
            "choose heads that divide dim (e.g. dim=768,heads=12)"
        )
    return resolved


def parse(name: str) -> Name:
    """What `--workload` names, size arguments checked (torch-free); ValueError naming the fix."""
    head, sep, rest = name.partition(":")
    if head == HF:
        config, _, overrides = rest.partition(":")
        if not config:
            raise ValueError("workload 'hf:': name a model, e.g. hf:gpt2, hf:bert-base-uncased or hf:GPT2Config")
        if importlib.util.find_spec("transformers") is None:
            raise ValueError(f"workload '{name}' needs transformers: pip install -e '.[hf]' (make setup installs it)")
        return Name(HF, HF_ALIASES.get(config, config), _pairs(name, overrides))
    if head in PRESETS:
        preset = PRESETS[head]
        return Name("builtin", preset.base, _check_builtin(name, preset.base, {**preset.args, **_pairs(name, rest)}))
    if head in REGISTRY:
        return Name("builtin", head, _check_builtin(name, head, _pairs(name, rest)))
    if not sep:
        known = ", ".join([*REGISTRY, *PRESETS])
        raise ValueError(f"unknown workload '{name}'; known: {known}, hf:MODEL (or package.module:factory)")
    return Name("custom", name, {})


def defaults_for(name: str) -> dict[str, Any]:
    """The option values `name` brings (the generic ones for a custom workload); never raises, since a
    bad name is said by `parse` later."""
    head = name.partition(":")[0]
    if head == HF:
        return {**GENERIC_DEFAULTS, **HF_DEFAULTS}
    if head in PRESETS:
        return {**GENERIC_DEFAULTS, **REGISTRY[PRESETS[head].base].defaults, **PRESETS[head].defaults}
    spec = REGISTRY.get(head)
    return {**GENERIC_DEFAULTS, **(spec.defaults if spec else {})}


def resolve(cfg: RunConfig) -> RunConfig:
    """`cfg` with every option left at None that the workload has a default for filled in."""
    fill = {k: v for k, v in defaults_for(cfg.workload).items() if getattr(cfg, k) is None}
    return dataclasses.replace(cfg, **fill)


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
        raise ValueError(f"cannot load workload '{name}': {type(exc).__name__}: {exc}") from exc


def _module_of(parsed: Name) -> str:
    if parsed.kind == HF:
        return "benchmarks.run.workloads.hf"
    factory = REGISTRY[parsed.base].factory if parsed.kind == "builtin" else parsed.base
    return factory.partition(":")[0]


def load(name: str, seed: int, train_size: int | None = None, val_size: int | None = None) -> Workload:
    """Build a workload by registry name or `package.module:factory`; ValueError, naming it, on any failure."""
    parsed = parse(name)
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
        raise ValueError(f"workload '{name}' failed to build: {type(exc).__name__}: {said}") from exc
    if not isinstance(workload, Workload):
        raise ValueError(f"workload '{name}': the factory returned {type(workload).__name__}, not a workloads.Workload")
    if parsed.kind == "builtin":  # hf's factory records its own, the configuration's values included
        workload.args = dict(parsed.args)
    if parsed.args.get("storage") == "disk":
        from benchmarks.run.workloads import datasets

        workload = datasets.on_disk(workload, name, seed, DATA_CACHE)
    return workload


def source(name: str) -> dict[str, str]:
    """The file a loaded workload's factory lives in and its SHA-256, so run.json pins the exact code."""
    module_name = _module_of(parse(name))
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if path is None:
        return {"module": module_name, "file": "", "sha256": ""}
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {"module": module_name, "file": str(Path(path).resolve()), "sha256": digest}
