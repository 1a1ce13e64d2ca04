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


def excludes_zero(lo: float, hi: float) -> bool:
    """True when an interval exists and lies wholly on one side of 0 (the difference is resolved)."""
    return bool(np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0))


def relative_half_width(ratio: float, lo: float, hi: float) -> float:
    """A ratio interval's half-width relative to the ratio, on the log scale: exp((ln hi − ln lo) / 2) − 1."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= 0:
        return np.nan
    return float(np.exp((np.log(hi) - np.log(lo)) / 2) - 1)


def _pooled(groups: Sequence[np.ndarray]) -> tuple[float, int]:
    """Pooled variance of log values and its degrees of freedom, Σ(nᵢ − 1)."""
    nu = sum(len(x) - 1 for x in groups)
    return (sum(float(((x - x.mean()) ** 2).sum()) for x in groups) / nu if nu > 0 else np.nan), nu


def planned_runs(pilots: Sequence[Sequence[float]], precision: float, confidence: float = 0.95) -> int:
    """Runs per variant a compare needs for every ratio's interval to reach `precision`, from its pilot
    runs' spread alone (Stein's two-stage procedure; never fewer runs than the pilot ran).

    With the pilots' pooled log variance s² on ν = Σ(nᵢ − 1) degrees of freedom, a ratio of two variants
    over n runs each gets the half-width t_ν √(2 s² / n) on log throughput (`stein_ratio_ci`), so
    n = ⌈2 s² (t_ν / ln(1 + precision))²⌉ reaches it. Only the spread is looked at, never a ratio, so the
    plan cannot favour a verdict.
    """
    logs = [x for x in (_logs(p) for p in pilots) if len(x) >= 2]
    if not logs:
        return 0
    s2, nu = _pooled(logs)
    t = float(stats.t.ppf((1 + confidence) / 2, nu))
    return max(min(len(x) for x in logs), int(np.ceil(2 * s2 * (t / np.log1p(precision)) ** 2)))


def stein_ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    pilots: Sequence[Sequence[float]],
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """A two-stage compare's ratio interval: the ratio of geometric means over all runs, the spread from
    the pilot runs alone (`pilots`, every variant's), t on the pilots' degrees of freedom.

    Because the number of runs was chosen from the pilots' spread, an interval taking its spread from all
    runs would be too narrow just when the pilot happened to be quiet; with the pilots' spread, which the
    later runs' means do not depend on, the coverage is exactly `confidence` (Stein, 1945)."""
    a, b = _logs(numerator), _logs(denominator)
    logs = [x for x in (_logs(p) for p in pilots) if len(x) >= 2]
    if not len(a) or not len(b) or not logs:
        return np.nan, np.nan, np.nan
    diff = float(a.mean() - b.mean())
    s2, nu = _pooled(logs)
    half = float(stats.t.ppf((1 + confidence) / 2, nu) * np.sqrt(s2 * (1 / len(a) + 1 / len(b))))
    return float(np.exp(diff)), float(np.exp(diff - half)), float(np.exp(diff + half))


def runs_to_resolve(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> int | None:
    """An estimate of the runs per variant after which a ratio of the size observed between `a` and `b`
    would have a Welch interval excluding 1, at their measured spreads: always more runs than either has
    now (the interval from those did not exclude 1); None without a spread or a difference."""
    x, y = _logs(a), _logs(b)
    if len(x) < 2 or len(y) < 2:
        return None
    diff = abs(float(x.mean() - y.mean()))
    vx, vy = float(x.var(ddof=1)), float(y.var(ddof=1))
    if diff == 0 or vx + vy == 0:
        return None
    n = max(MIN_RUNS, len(x), len(y))
    for _ in range(8):  # n = (vx + vy) (t / d)², t on the Welch degrees of freedom at n runs each
        df = (n - 1) * (vx + vy) ** 2 / (vx**2 + vy**2)
        n = max(n, int(np.ceil((vx + vy) * (float(stats.t.ppf((1 + confidence) / 2, df)) / diff) ** 2)))
    return max(n, len(x) + 1, len(y) + 1)
