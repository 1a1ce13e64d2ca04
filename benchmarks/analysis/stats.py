"""Statistics for comparisons: confidence intervals, bootstrap ratios, plain-words verdicts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval; the interval is (mean, mean) for one value."""
    data = np.asarray(values, dtype=float)
    mean = float(data.mean())
    if len(data) < 2:
        return mean, mean, mean
    half = float(stats.sem(data) * stats.t.ppf((1 + confidence) / 2, len(data) - 1))
    return mean, mean - half, mean + half


def bootstrap_ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Ratio of means with a percentile-bootstrap interval, resampling each group independently."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    ratio = float(a.mean() / b.mean())
    rng = np.random.default_rng(seed)
    boot_a = rng.choice(a, size=(resamples, len(a))).mean(axis=1)
    boot_b = rng.choice(b, size=(resamples, len(b))).mean(axis=1)
    lo, hi = np.percentile(boot_a / boot_b, [(1 - confidence) / 2 * 100, (1 + confidence) / 2 * 100])
    return ratio, float(lo), float(hi)


def verdict(name_a: str, name_b: str, ratio: float, lo: float, hi: float) -> str:
    """'horovod is 1.12× ddp (1.08–1.16)', or no significant difference when the CI spans 1."""
    if lo <= 1.0 <= hi:
        return f"no significant difference between {name_a} and {name_b} ({ratio:.2f}×, CI {lo:.2f}–{hi:.2f})"
    return f"{name_a} is {ratio:.2f}× {name_b} ({lo:.2f}–{hi:.2f})"
