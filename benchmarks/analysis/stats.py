"""Statistics for comparisons: intervals that respect positivity and sample size, plain-words verdicts.

Throughput is positive and its noise is multiplicative, so intervals are Student-t intervals on log
throughput, mapped back: the point estimate is the geometric mean and no bound can be negative. With
fewer than MIN_RUNS values an interval would claim more than the data hold, so none is given (NaN
bounds) and `no_interval_reason` says why.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

MIN_RUNS = 3


def _logs(values: Sequence[float]) -> np.ndarray:
    data = np.asarray(values, dtype=float)
    return np.log(data[np.isfinite(data) & (data > 0)])


def usable(values: Sequence[float]) -> int:
    """How many values an interval is computed from (finite and positive)."""
    return len(_logs(values))


def no_interval_reason(n: int) -> str:
    """'' when n values are enough for an interval, else the plain-words reason."""
    return "" if n >= MIN_RUNS else f"{n} run{'s' * (n != 1)}: no interval (needs ≥ {MIN_RUNS})"


def log_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean and a Student-t interval on log values; NaN bounds with fewer than MIN_RUNS values."""
    logs = _logs(values)
    if not len(logs):
        return np.nan, np.nan, np.nan
    centre = float(np.exp(logs.mean()))
    if len(logs) < MIN_RUNS:
        return centre, np.nan, np.nan
    half = float(stats.sem(logs) * stats.t.ppf((1 + confidence) / 2, len(logs) - 1))
    return centre, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def ratio_ci(
    numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """Ratio of geometric means with a Welch-t interval on the difference of mean logs.

    NaN bounds unless both groups have MIN_RUNS values: two values cannot estimate a spread.
    """
    a, b = _logs(numerator), _logs(denominator)
    if not len(a) or not len(b):
        return np.nan, np.nan, np.nan
    diff = a.mean() - b.mean()
    ratio = float(np.exp(diff))
    if len(a) < MIN_RUNS or len(b) < MIN_RUNS:
        return ratio, np.nan, np.nan
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:  # identical repeats: the data show no spread at all
        return ratio, ratio, ratio
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(np.sqrt(va + vb) * stats.t.ppf((1 + confidence) / 2, df))
    return ratio, float(np.exp(diff - half)), float(np.exp(diff + half))


def verdict(name_a: str, name_b: str, ratio: float, lo: float, hi: float) -> str:
    """'horovod is 1.12× ddp (1.08–1.16)', no significant difference when the CI spans 1, or no call."""
    if np.isnan(ratio):
        return f"{name_a} vs {name_b}: no throughput to compare"
    if np.isnan(lo) or np.isnan(hi):
        return (
            f"{name_a} is {ratio:.2f}× {name_b} from too few runs to call a difference "
            f"(an interval needs ≥ {MIN_RUNS} runs of each; use --repeats {MIN_RUNS} or more)"
        )
    if lo <= 1.0 <= hi:
        return f"no significant difference between {name_a} and {name_b} ({ratio:.2f}×, CI {lo:.2f}–{hi:.2f})"
    return f"{name_a} is {ratio:.2f}× {name_b} ({lo:.2f}–{hi:.2f})"
