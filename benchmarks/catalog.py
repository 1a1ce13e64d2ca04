"""The workload catalogue: built-in names, their size arguments, presets and the run options each brings.

Declared once here, in a leaf that imports neither torch nor any other layer, so the option help texts
(`benchmarks.config`), the checks made before any process starts and the rank side that builds a
workload (`benchmarks.run.workloads`) read the same table. A name is parsed and checked here without
torch, so a bad one stops before any process group starts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any


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
        f"{_B}:linear",
        "nn.Linear(10, 1) regression, MSE",
        {"lr": 0.05, "batch_size": 32, "train_size": 4096, "val_size": 1024},
    ),
    "mlp": WorkloadSpec(
        f"{_B}:mlp",
        "64-128-128-10 MLP on sklearn digits (1797)",
        {"lr": 0.1, "batch_size": 32, "val_size": 360},
        {"hidden": 128, "layers": 2},
    ),
    "cnn": WorkloadSpec(
        f"{_B}:cnn",
        "small ResNet with BatchNorm, 3x32x32",
        {"lr": 0.05, "batch_size": 32, "train_size": 2048, "val_size": 512},
        {"width": 16, "stages": 3, "blocks": 1},
    ),
    "transformer": WorkloadSpec(
        f"{_B}:transformer",
        "tiny GPT, 4 layers, dim 128",
        {"lr": 0.3, "batch_size": 16, "train_size": 2048, "val_size": 256},
        {"vocab": 512, "context": 32, "dim": 128, "layers": 4, "heads": 4, "tied": 0},
    ),
}

STORAGE = ("memory", "disk")
"""Every built-in's `storage` argument: `disk` writes its data once as numpy memmaps under DATA_CACHE and
trains from a Dataset reading them, through a DataLoader (the same samples, so the same loss curve)."""


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
        "transformer",
        {"vocab": 50257, "context": 128, "dim": 768, "layers": 12, "heads": 12, "tied": 1},
        "GPT-2 small's shape (tied embeddings), context 128: 123,751,680 parameters, 495.0 MB of gradients",
        {"lr": 0.01, "batch_size": 4, "train_size": 512, "val_size": 32},
    ),
    "cnn-25m": Preset(
        "cnn",
        {"width": 96, "stages": 4, "blocks": 2},
        "ResNet-18-like, 4 stages of 2 blocks, widths 96-768: 25,129,066 parameters, 100.5 MB of gradients",
        {"lr": 0.05, "batch_size": 16, "train_size": 1024, "val_size": 128},
    ),
}

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
    defaults: dict[str, Any] = field(default_factory=dict)
    """The option values the name brings (`defaults_for`): a preset's own, which `base` no longer says."""


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
    kind, base, args = _parts(name)
    return Name(kind, base, args, defaults_for(name))


def _parts(name: str) -> tuple[str, str, dict[str, Any]]:
    head, sep, rest = name.partition(":")
    if head == HF:
        config, _, overrides = rest.partition(":")
        if not config:
            raise ValueError("workload 'hf:': name a model, e.g. hf:gpt2, hf:bert-base-uncased or hf:GPT2Config")
        if importlib.util.find_spec("transformers") is None:
            raise ValueError(f"workload '{name}' needs transformers: pip install -e '.[hf]' (make setup installs it)")
        return HF, HF_ALIASES.get(config, config), _pairs(name, overrides)
    if head in PRESETS:
        preset = PRESETS[head]
        return "builtin", preset.base, _check_builtin(name, preset.base, {**preset.args, **_pairs(name, rest)})
    if head in REGISTRY:
        return "builtin", head, _check_builtin(name, head, _pairs(name, rest))
    if not sep:
        known = ", ".join([*REGISTRY, *PRESETS])
        raise ValueError(f"unknown workload '{name}'; known: {known}, hf:MODEL (or package.module:factory)")
    return "custom", name, {}


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
