"""Did the backends train the same model? Train and validation losses compared, differences explained.

Same seed, data order, initial weights and optimizer go to every backend, so the train-loss curves of
one setup should agree to rounding. Validation can still differ when the models' buffers differ —
BatchNorm running statistics, which DDP broadcasts from rank 0 every forward and Horovod never does —
so validation is compared too, and the recorded knob that explains a difference is named.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from benchmarks.analysis.load import RunSet

TOLERANCE = 1e-5  # below this, a difference is floating-point reduction order, not a different model
GROUP = ("workload", "global_batch")  # loss curves only line up at the same workload and global batch


@dataclass
class Agreement:
    train: float = math.nan
    """Max abs difference of the train-loss curves (first run of each backend against the first backend's)."""
    val: float = math.nan
    """Max abs difference of the validation losses at the same step; NaN when none were recorded."""
    explanation: str = ""
    """The recorded knob that explains a difference, or that none does."""
    per_setup: dict[str, Agreement] = dataclasses.field(default_factory=dict)
    """Per workload and global batch ("cifar10 · global batch 64"), where backends were compared in
    several; the fields above are then the worst over them and the first explanation."""

    def lines(self) -> list[str]:
        if len(self.per_setup) > 1:
            return [line for setup, one in self.per_setup.items() for line in one._lines(f" ({setup})")]
        return self._lines("")

    def _lines(self, where: str) -> list[str]:
        def text(value: float) -> str:
            return "not recorded" if math.isnan(value) else f"{value:.2e}"

        out = [f"loss, max abs difference between backends{where}: train {text(self.train)}, "
               f"validation {text(self.val)}"]  # fmt: skip
        return out + ([f"  {self.explanation}"] if self.explanation else [])

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


def _explain(rs: RunSet, firsts: list[str], differs: str) -> str:
    runs = rs.runs.set_index("run_key").loc[firsts]
    if "knob_broadcast_buffers" in runs and runs["knob_broadcast_buffers"].nunique(dropna=False) > 1:
        yes = ", ".join(runs.backend[runs.knob_broadcast_buffers == True])  # noqa: E712 (None is not False)
        no = ", ".join(runs.backend[runs.knob_broadcast_buffers != True])  # noqa: E712
        return (
            f"{differs} differ: {yes} broadcast buffers (knob broadcast_buffers=True) and {no} do not, so "
            "BatchNorm running statistics differ; run with --no-broadcast-buffers for parity"
        )
    knobs = [c for c in runs if c.startswith("knob_") and runs[c].astype(str).nunique() > 1]
    if knobs:
        return f"{differs} differ; knobs that differ: {', '.join(k.removeprefix('knob_') for k in knobs)}"
    return f"{differs} differ and no recorded knob explains it"


def loss_agreement(rs: RunSet) -> Agreement:
    """Worst differences of train and validation losses between backends, within each workload and global batch."""
    loss = rs.loss[rs.loss.status == "completed"] if len(rs.loss) else rs.loss
    if not len(loss):
        return Agreement()
    result = Agreement()
    keys = [c for c in GROUP if c in loss]
    for values, group in loss.groupby(keys, sort=False, dropna=False) if keys else [((), loss)]:
        firsts = list(group.groupby("backend", sort=False, observed=True)["run_key"].min())
        if len(firsts) < 2:
            continue
        worst = []
        for split in ("train", "val"):
            rows = group[group.split == split]
            worst.append(_worst([rows[rows.run_key == key].set_index("step")["loss"] for key in firsts]))
        train, val = worst
        differs = [name for name, v in (("train losses", train), ("validation losses", val)) if v > TOLERANCE]
        one = Agreement(train, val, _explain(rs, firsts, " and ".join(differs)) if differs else "")
        result.per_setup[setup_words(dict(zip(keys, values, strict=True)))] = one
        result.train = train if math.isnan(result.train) else max(result.train, train)
        result.val = val if math.isnan(result.val) else max(result.val, val)
        result.explanation = result.explanation or one.explanation
    return result


def setup_words(setup: dict) -> str:
    """ "synthetic · global batch 20 · 2 rank(s)": a setup as the report's tables head it."""
    words = {"workload": "{}", "global_batch": "global batch {}", "world_size": "{} rank(s)"}
    return " · ".join(words[k].format(_plain(v)) for k, v in setup.items() if k in words)


def _plain(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
