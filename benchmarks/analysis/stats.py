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


def log_values(values: Sequence[float]) -> np.ndarray:
    """The natural logs of the finite, positive values (throughputs)."""
    data = np.asarray(values, dtype=float)
    return np.log(data[np.isfinite(data) & (data > 0)])


def usable(values: Sequence[float]) -> int:
    """How many values an interval is computed from (finite and positive)."""
    return len(log_values(values))


def no_interval_reason(n: int) -> str:
    """'' when n values are enough for an interval, else the plain-words reason."""
    return "" if n >= MIN_RUNS else f"{n} run{'s' * (n != 1)}: no interval (needs ≥ {MIN_RUNS})"


def log_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean and a Student-t interval on log values; NaN bounds with fewer than MIN_RUNS values."""
    logs = log_values(values)
    if not len(logs):
        return np.nan, np.nan, np.nan
    centre = float(np.exp(logs.mean()))
    if len(logs) < MIN_RUNS:
        return centre, np.nan, np.nan
    half = float(stats.sem(logs) * stats.t.ppf((1 + confidence) / 2, len(logs) - 1))
    return centre, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def mean_ci(values: Sequence[float], least: int = MIN_RUNS, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and a Student-t interval, NaN values left out; NaN bounds with fewer than `least` values."""
    data = np.asarray(values, dtype=float)
    data = data[~np.isnan(data)]
    if not len(data):
        return np.nan, np.nan, np.nan
    if len(data) < max(least, 2):
        return float(data.mean()), np.nan, np.nan
    half = float(stats.sem(data) * stats.t.ppf((1 + confidence) / 2, len(data) - 1))
    return float(data.mean()), float(data.mean() - half), float(data.mean() + half)


def ratio_ci(
    numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """Ratio of geometric means with a Welch-t interval on the difference of mean logs.

    NaN bounds unless both groups have MIN_RUNS values: two values cannot estimate a spread. (A throughput
    ratio a decision rests on takes `intervals.ratio_interval`, which also floors the spread at the clock's.)
    """
    diff, lo, hi = diff_ci(log_values(numerator), log_values(denominator), confidence)
    return float(np.exp(diff)), float(np.exp(lo)), float(np.exp(hi))


def verdict(name_a: str, name_b: str, ratio: float, lo: float, hi: float) -> str:
    """'horovod is 1.12× ddp (1.08–1.16)', no significant difference when the CI spans 1, or no call."""
    if np.isnan(ratio):
        return f"{name_a} vs {name_b}: no throughput to compare"
    if np.isnan(lo) or np.isnan(hi):
        return (
            f"{name_a} is {ratio:.2f}× {name_b} from too few runs to call a difference "
            f"(an interval needs ≥ {MIN_RUNS} runs of each; use --repeats {MIN_RUNS} or more)"
        )
    d = interval_digits(lo, hi)
    if lo <= 1.0 <= hi:
        return f"no significant difference between {name_a} and {name_b} ({ratio:.{d}f}×, CI {lo:.{d}f}–{hi:.{d}f})"
    return f"{name_a} is {ratio:.{d}f}× {name_b} ({lo:.{d}f}–{hi:.{d}f})"


def diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Difference of means a − b with a Welch-t interval; NaN bounds unless both have MIN_RUNS values."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if not len(x) or not len(y):
        return np.nan, np.nan, np.nan
    diff = float(x.mean() - y.mean())
    if len(x) < MIN_RUNS or len(y) < MIN_RUNS:
        return diff, np.nan, np.nan
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return diff, diff, diff
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = float(np.sqrt(vx + vy) * stats.t.ppf((1 + confidence) / 2, df))
    return diff, diff - half, diff + half


def interval_digits(lo: float, hi: float, margin: float | None = None, least: int = 2) -> int:
    """Decimals (at least `least`, at most 4) for a ratio interval so that rounding never changes what it says: an
    interval excluding 1 never reads as touching it, nor one within [1/(1+M), 1+M] as reaching past it."""
    edges = [1.0] + ([1 / (1 + margin), 1 + margin] if margin else [])
    for digits in range(least, 4):
        if all((round(lo, digits) > e) == (lo > e) and (round(hi, digits) < e) == (hi < e) for e in edges):
            return digits
    return 4


def excludes_zero(lo: float, hi: float) -> bool:
    """True when an interval exists and lies wholly on one side of 0 (the difference is resolved)."""
    return bool(np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0))


def relative_half_width(ratio: float, lo: float, hi: float) -> float:
    """A ratio interval's half-width relative to the ratio, on the log scale: exp((ln hi − ln lo) / 2) − 1."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= 0:
        return np.nan
    return float(np.exp((np.log(hi) - np.log(lo)) / 2) - 1)
