"""Did the variants train the same model? Train and validation losses compared, differences explained.

Same seed, data order, initial weights and optimizer go to every variant (backend@launcher: ddp@torchrun
and ddp@mpirun are two), so the train-loss curves of one setup should agree to rounding. Each run.json
holds fingerprints of the data and the initial weights its ranks built (run/fingerprint.py), so whether
every run saw the same inputs is checked, not assumed, and said. Validation can still differ when the
models' buffers differ — BatchNorm running statistics, which DDP broadcasts from rank 0 every forward and
Horovod never does — so validation is compared too, and what is known to explain a difference is named:
different data or weights, the buffer broadcast (only for a model with floating-point buffers), other
knobs, CUDA's nondeterministic kernels.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.analysis import rundir
from benchmarks.analysis.load import RunSet
from benchmarks.config import PLAIN_STEP

TOLERANCE = 1e-5  # below this, a difference is floating-point reduction order, not a different model
COMPILED_TOLERANCE = 1e-4
"""fp32 compiled: each framework compiles other graphs (DDP split at its buckets, FSDP2 per unit), whose fused
kernels sum in other orders; rounding of order 1e-7 per op, compounded over a run's steps."""
AMP_TOLERANCE = 5e-3
"""bf16/fp16 autocast: where the order differs (single's whole batch against two ranks' halves, FSDP2's
reduce-scatter, DDP's compiled graph split at its buckets against Horovod's whole), each matmul's output rounds
differently at 2^-8 (bf16) of its size, and the difference compounds over the steps: measured 1e-5 after 8 fp16
steps of a 2-layer transformer, and after the default transformer's 90 steps (losses near 1.8) 1.4e-3 (bf16 eager,
FSDP2 against DDP) and 1.9e-3 (bf16 compiled, Horovod against DDP). 5e-3 holds those with room, while a clip that
binds moves a curve further (the tests hold it to more). Where the order is the same (DDP and Horovod eager) the
curves agree exactly, as in fp32."""
GROUP = ("workload", "global_batch", "val_strategy", "step_config")  # loss curves line up at one workload, global
# batch and step; validation losses only under one --val-strategy (sampler's padding repeats samples, exact's does not)


def tolerance_of(step: object) -> float:
    """The largest difference that is rounding, not a different model, for runs of `step` (config.step_of's words)."""
    words = str(step)
    if not words.startswith("fp32") and words != "nan":
        return AMP_TOLERANCE
    return COMPILED_TOLERANCE if " compiled" in words else TOLERANCE


@dataclass
class Agreement:
    train: float = math.nan
    """Max abs difference of the train-loss curves (first run of each variant against the first variant's)."""
    val: float = math.nan
    """Max abs difference of the validation losses at the same step; NaN when none were recorded."""
    explanation: str = ""
    """The recorded knob that explains a difference, or that none does."""
    inputs: str = ""
    """Whether the runs compared saw the same data and initial weights (their run.json fingerprints)."""
    variants: list[str] = dataclasses.field(default_factory=list)
    """The variants compared (ddp@torchrun, horovod@gloo, …), in the order of the runs."""
    tolerance: float = TOLERANCE
    """The difference below which the curves are the same model (tolerance_of the runs' step)."""
    alone: str = ""
    """Why nothing was compared, where loss curves were recorded but no two variants share a setup."""
    per_setup: dict[str, Agreement] = dataclasses.field(default_factory=dict)
    """Per workload and global batch ("cifar10 · global batch 64"), where variants were compared in
    several; the fields above are then the worst over them and the first explanation."""

    def lines(self) -> list[str]:
        if len(self.per_setup) > 1:
            return [line for setup, one in self.per_setup.items() for line in one._lines(setup)]
        return self._lines("")

    def _lines(self, setup: str) -> list[str]:
        def text(value: float) -> str:
            return "not recorded" if math.isnan(value) else f"{value:.2e}"

        if self.alone:
            return [f"loss, max abs difference between variants: nothing to compare ({self.alone})"]
        where = "; ".join(part for part in (", ".join(self.variants), setup) if part)
        within = f" (rounding below {self.tolerance:.0e}: docs/fairness.md)" if self.tolerance != TOLERANCE else ""
        out = [
            f"loss, max abs difference between variants{f' ({where})' if where else ''}: train {text(self.train)}, "
            f"validation {text(self.val)}{within}"
        ]
        return out + [f"  {line}" for line in (self.inputs, self.explanation) if line]

    def __float__(self) -> float:
        return self.train


def _worst(curves: list[pd.Series]) -> float:
    worst = math.nan
    for curve in curves[1:]:
        common = curves[0].index.intersection(curve.index)
        if len(common):
            diff = float((curves[0][common] - curve[common]).abs().max())
            worst = diff if math.isnan(worst) else max(worst, diff)
    return worst


@dataclass
class Inputs:
    """What the run.json fingerprints of a set of runs say."""

    words: str = ""
    data_differ: bool = False
    weights_differ: bool = False
    float_buffers: int | None = None
    """The most floating-point buffers any run's model had; None when no run recorded it (older runs)."""


def _fingerprints(rs: RunSet, keys: list[str]) -> Inputs:
    prints: dict[str, dict[str, Any]] = {}
    buffers = []
    for key in keys:
        meta = rundir.read_or_none(Path(key)) or {}
        if isinstance(meta.get("fingerprint"), dict):
            prints[key] = meta["fingerprint"]
        if meta.get("model_float_buffers") is not None:
            buffers.append(int(meta["model_float_buffers"]))
    result = Inputs(float_buffers=max(buffers) if buffers else None)
    if len(prints) < 2:
        return result
    variant = variant_names(rs)

    def groups(of: Any) -> list[str]:
        by: dict[Any, list[str]] = {}
        for key, fp in prints.items():
            by.setdefault(of(fp), []).append(str(variant.get(key, Path(key).name)))
        return [" and ".join(dict.fromkeys(names)) for names in by.values()]

    data = groups(lambda fp: (fp.get("train", {}).get("sha256"), fp.get("val", {}).get("sha256")))
    weights = groups(lambda fp: fp.get("initial_weights"))
    result.data_differ, result.weights_differ = len(data) > 1, len(weights) > 1
    if result.data_differ:
        result.words = (
            f"inputs: the runs trained on different data ({' vs '.join(data)}: run.json "
            "fingerprints differ), so they compare nothing; build the data from the factory's `seed` "
            "argument"
        )
    elif result.weights_differ:
        result.words = (
            f"inputs: the same data, but different initial weights ({' vs '.join(weights)}: run.json "
            "fingerprints differ)"
        )
    else:
        result.words = f"inputs: the same data and initial weights in all {len(prints)} runs (run.json fingerprints)"
    return result


def _explain(rs: RunSet, firsts: list[str], differs: str, inputs: Inputs) -> str:
    runs = rs.runs.set_index("run_key").loc[firsts]
    names = pd.Series(variant_names(rs)).reindex(runs.index)
    if inputs.data_differ:
        return f"{differs} differ: the runs trained on different data"
    has_buffers = inputs.float_buffers != 0  # unknown (older runs) may have them
    if has_buffers and "knob_broadcast_buffers" in runs and runs["knob_broadcast_buffers"].nunique(dropna=False) > 1:
        yes = ", ".join(names[runs.knob_broadcast_buffers == True])  # noqa: E712 (None is not False)
        no = ", ".join(names[runs.knob_broadcast_buffers != True])  # noqa: E712
        return (
            f"{differs} differ: {yes} broadcast buffers (knob broadcast_buffers=True) and {no} do not, so "
            "BatchNorm running statistics differ; run with --no-broadcast-buffers for parity"
        )
    if inputs.weights_differ:
        return f"{differs} differ: the runs started from different initial weights"
    knobs = [c for c in runs if c.startswith("knob_") and runs[c].astype(str).nunique() > 1]
    knobs = [k for k in knobs if has_buffers or k != "knob_broadcast_buffers"]  # no buffers: the knob does nothing
    known = [f"knobs that differ: {', '.join(k.removeprefix('knob_') for k in knobs)}"] if knobs else []
    if "config_device" in runs and (runs["config_device"] == "cuda").any():
        known.append("on CUDA, nondeterministic kernels (atomic adds in backward) differ from run to run")
    return f"{differs} differ; {'; '.join(known)}" if known else f"{differs} differ and no recorded knob explains it"


def variant_names(rs: RunSet) -> dict[str, str]:
    """Each run's variant (ddp@torchrun, horovod@gloo, …) by `run_key`, less its validation strategy; the
    backend alone for a run whose run.json names no launcher (results from before there were variants)."""
    out = {}
    for run in rs.runs.to_dict("records"):
        variant, launcher = run.get("variant"), run.get("launcher")
        known = isinstance(variant, str) and isinstance(launcher, str) and launcher != ""
        out[str(run["run_key"])] = variant.split(" (val ", 1)[0] if known else str(run.get("backend"))
    return out


def loss_agreement(rs: RunSet) -> Agreement:
    """Worst differences of train and validation losses between variants, within each workload, global batch
    and validation strategy. Two variants of one backend (ddp@torchrun, ddp@mpirun) are two curves."""
    loss = rs.loss[rs.loss.status == "completed"] if len(rs.loss) else rs.loss
    if not len(loss):
        return Agreement()
    names = variant_names(rs)
    order = list(dict.fromkeys(names.values()))  # the runs' order: compare's --backends order where known
    runs = rs.runs.set_index("run_key")
    strategy = runs["val_strategy"] if "val_strategy" in runs else pd.Series(dtype=object)
    step = runs["step_config"] if "step_config" in runs else pd.Series(dtype=object)
    key = loss["run_key"].astype(str)
    loss = loss.assign(variant=key.map(names), val_strategy=key.map(strategy), step_config=key.map(step))
    result = Agreement()
    # The strategy and step split only where runs differ in them: most compares have one, and their lines stay short.
    keys = [c for c in GROUP if c in loss and (c not in ("val_strategy", "step_config") or loss[c].nunique() > 1)]
    for values, group in loss.groupby(keys, sort=False, dropna=False) if keys else [((), loss)]:
        firsts = list(group.groupby("variant", sort=False)["run_key"].min())
        if len(firsts) < 2:
            continue
        worst = []
        for split in ("train", "val"):
            rows = group[group.split == split]
            worst.append(_worst([rows[rows.run_key == key].set_index("step")["loss"] for key in firsts]))
        train, val = worst
        tolerance = tolerance_of(group["step_config"].iloc[0] if "step_config" in group else PLAIN_STEP)
        differs = [name for name, v in (("train losses", train), ("validation losses", val)) if v > tolerance]
        inputs = _fingerprints(rs, list(dict.fromkeys(group["run_key"].astype(str))))
        explained = _explain(rs, firsts, " and ".join(differs), inputs) if differs else ""
        compared = sorted(dict.fromkeys(group["variant"]), key=order.index)  # as the table lists them
        one = Agreement(train, val, explained, inputs.words, compared, tolerance)
        result.per_setup[setup_words(dict(zip(keys, values, strict=True)))] = one
        result.train = train if math.isnan(result.train) else max(result.train, train)
        result.val = val if math.isnan(result.val) else max(result.val, val)
        result.explanation = result.explanation or one.explanation
        result.tolerance = max(result.tolerance, tolerance)
        result.inputs = result.inputs if result.inputs and not inputs.data_differ else one.inputs
        result.variants = list(dict.fromkeys([*result.variants, *compared]))
    if not result.per_setup:
        seen = sorted(dict.fromkeys(loss["variant"]), key=order.index)
        result.alone = f"one variant, {seen[0]}" if len(seen) == 1 else "no two variants trained one setup"
    return result


def setup_words(setup: dict) -> str:
    """ "synthetic · global batch 20 · 2 rank(s)": a setup as the report's tables head it."""
    words = {
        "workload": "{}",
        "global_batch": "global batch {}",
        "world_size": "{} rank(s)",
        "val_strategy": "val {}",
        "step_config": "{}",
    }
    # The plain step goes unsaid: it is every run's before the step options, and most compares'.
    shown = {k: v for k, v in setup.items() if k in words and not (k == "step_config" and v == PLAIN_STEP)}
    return " · ".join(words[k].format(_plain(v)) for k, v in shown.items())


def _plain(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
