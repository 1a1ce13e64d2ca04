"""The one interval of a throughput ratio, and the plans that size a comparison for it.

Every place that shows or uses a ratio's interval (the decision, the per-backend table, tune's keep rule,
the report, decision.json) calls `ratio_interval`, so the same runs always give the same interval:

- a fixed design (`--repeats N`): Welch's t interval on log throughput over all runs;
- a two-stage design (a pilot, then as many runs as the pilot's spreads asked for): each variant's spread
  from its own pilot runs, the means from all runs, and the Behrens–Fisher quantile of the difference of two
  independent t variables on the pilots' degrees of freedom. The number of runs depends on the pilot's
  spread only, and a normal sample's mean is independent of its variance, so (mean − μ) / (s / √n) is
  exactly t on the pilot's degrees of freedom for each variant, whatever n the plan chose: a noisy variant
  gets more runs and its own spread, never its quiet rival's (a pooled spread under-covers then).

No interval is narrower than the clock allows: each variant's log-throughput spread is floored at
`spread_floor`, so identical repeats give a small interval, never a zero-width one that looks certain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as scipy_stats

from benchmarks.analysis import stats

TIMER_RESOLUTION_S = 1e-6
"""What one clock read can be off by, taken at 1 µs: time.perf_counter resolves ns, CUDA events 0.5 µs."""
_GRID = (np.arange(4000) + 0.5) / 4000  # equal-probability nodes for the Behrens–Fisher integral


def spread_floor(timed_steps: float, timed_wall_s: float) -> float:
    """The smallest log-throughput spread one run's timing can show: each of `timed_steps` steps read to within
    TIMER_RESOLUTION_S, independent errors, over a window of `timed_wall_s` (0 when either is unknown)."""
    if not (np.isfinite(timed_steps) and np.isfinite(timed_wall_s)) or timed_wall_s <= 0 or timed_steps <= 0:
        return 0.0
    return float(TIMER_RESOLUTION_S * np.sqrt(timed_steps) / timed_wall_s)


@lru_cache(maxsize=4096)
def _unit_quantile(theta: float, nu_a: int, nu_b: int, confidence: float) -> float:
    """The two-sided `confidence` quantile of cos(θ)·Ta − sin(θ)·Tb, Ta ~ t(nu_a), Tb ~ t(nu_b) independent."""
    u = scipy_stats.t.ppf(_GRID, nu_b)
    cos, sin = np.cos(theta), np.sin(theta)
    target = (1 + confidence) / 2
    if cos < 1e-9:
        return float(scipy_stats.t.ppf(target, nu_b))
    cdf = lambda x: float(scipy_stats.t.cdf((x + sin * u) / cos, nu_a).mean()) - target  # noqa: E731
    return float(optimize.brentq(cdf, 0.0, 1e3))


def behrens_fisher_half(c_a: float, c_b: float, nu_a: int, nu_b: int, confidence: float = 0.95) -> float:
    """Half-width of an interval for a difference whose error is c_a·Ta − c_b·Tb (standard errors c, t on nu)."""
    theta = round(float(np.arctan2(c_b, c_a)), 3)  # 0.001 rad: the quantile moves by < 1e-3 of itself
    return float(np.hypot(c_a, c_b) * _unit_quantile(theta, int(nu_a), int(nu_b), confidence))


def _log_spread(logs: np.ndarray, floor: float) -> float:
    return max(float(logs.var(ddof=1)) if len(logs) >= 2 else 0.0, floor**2)


def ratio_interval(
    a: Sequence[float],
    b: Sequence[float],
    pilots: tuple[Sequence[float], Sequence[float]] | None = None,
    floors: tuple[float, float] = (0.0, 0.0),
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """Ratio of geometric means of `a` over `b` and its `confidence` interval: two-stage when `pilots` (each
    variant's pilot runs, a subset of its runs) are given, else Welch. NaN bounds with fewer than
    stats.MIN_RUNS values (runs, or pilot runs) of either."""
    x, y = stats.log_values(a), stats.log_values(b)
    if not len(x) or not len(y):
        return np.nan, np.nan, np.nan
    diff = float(x.mean() - y.mean())
    spread_of = (x, y) if pilots is None else (stats.log_values(pilots[0]), stats.log_values(pilots[1]))
    if min(len(x), len(y), *(len(s) for s in spread_of)) < stats.MIN_RUNS:
        return float(np.exp(diff)), np.nan, np.nan
    va, vb = (_log_spread(s, f) for s, f in zip(spread_of, floors, strict=True))
    ca, cb = np.sqrt(va / len(x)), np.sqrt(vb / len(y))
    nu_a, nu_b = len(spread_of[0]) - 1, len(spread_of[1]) - 1
    if pilots is None:  # Welch–Satterthwaite degrees of freedom
        df = (ca**2 + cb**2) ** 2 / (ca**4 / nu_a + cb**4 / nu_b)
        half = float(np.hypot(ca, cb) * scipy_stats.t.ppf((1 + confidence) / 2, df))
    else:
        half = behrens_fisher_half(ca, cb, nu_a, nu_b, confidence)
    return float(np.exp(diff)), float(np.exp(diff - half)), float(np.exp(diff + half))


def planned_runs(
    pilots: Sequence[Sequence[float]],
    precision: float,
    floors: Sequence[float] | None = None,
    confidence: float = 0.95,
) -> list[int]:
    """Runs of each variant (in `pilots`' order) for every pair's two-stage interval to have a relative
    half-width of at most `precision`, from the pilots' spreads alone (never fewer than a pilot ran).

    Each variant gets n = ⌈s² / z⌉ runs, s² its own pilot variance of log throughput, so that its standard
    error √(s²/n) is at most √z; any pair's half-width is then at most √(2z) · q, q the Behrens–Fisher
    quantile at equal standard errors on the smallest pilot's degrees of freedom, and z = (ln(1 + P) / q)² / 2
    makes that ln(1 + P). A variant without a spread (fewer than 2 pilot runs) gets its pilot's count."""
    logs = [stats.log_values(p) for p in pilots]
    floors = list(floors) if floors is not None else [0.0] * len(logs)
    sized = [x for x in logs if len(x) >= 2]
    if not sized:
        return [len(x) for x in logs]
    nu = min(len(x) for x in sized) - 1
    z = (np.log1p(precision) / behrens_fisher_half(1.0, 1.0, nu, nu, confidence)) ** 2
    return [
        max(len(x), int(np.ceil(_log_spread(x, f) / z))) if len(x) >= 2 else len(x)
        for x, f in zip(logs, floors, strict=True)
    ]


def welch_power(n: int, diff: float, va: float, vb: float, confidence: float = 0.95) -> float:
    """The chance that a Welch interval from n runs of each excludes 1 when the true log ratio is `diff` and the
    log-throughput variances are va and vb (noncentral t, Welch's degrees of freedom at n runs each)."""
    if n < 2 or va + vb <= 0:
        return float("nan")
    df = (n - 1) * (va + vb) ** 2 / (va**2 + vb**2)
    ncp = abs(diff) / np.sqrt((va + vb) / n)
    t = scipy_stats.t.ppf((1 + confidence) / 2, df)
    power = float(scipy_stats.nct.sf(t, df, ncp) + scipy_stats.nct.cdf(-t, df, ncp))
    return power if np.isfinite(power) else float(ncp > t)  # scipy gives NaN far out in the tail


POWER = 0.8
RUNS_LIMIT = 10_000


def runs_to_resolve(
    a: Sequence[float], b: Sequence[float], floors: tuple[float, float] = (0.0, 0.0), power: float = POWER
) -> int | None:
    """The smallest n such that n runs of each (a fixed design, Welch's interval) resolve a true difference of
    the size observed between `a` and `b` with probability `power`, at their measured spreads (floored): more
    runs than either has now. None without two runs of each, without a difference, or beyond RUNS_LIMIT."""
    x, y = stats.log_values(a), stats.log_values(b)
    if len(x) < 2 or len(y) < 2:
        return None
    diff = float(x.mean() - y.mean())
    va, vb = _log_spread(x, floors[0]), _log_spread(y, floors[1])
    if diff == 0 or va + vb == 0:
        return None
    low = max(len(x), len(y), stats.MIN_RUNS - 1)  # power grows with n: bisect for the first n that reaches it
    if welch_power(RUNS_LIMIT, diff, va, vb) < power:
        return None
    high = RUNS_LIMIT
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if welch_power(mid, diff, va, vb) >= power else (mid, high)
    return high


def repeat_of(run_id: Any) -> int:
    """The repeat of a run id `<arm>-r<N>` (0 without one)."""
    match = re.search(r"-r(\d+)$", str(run_id))
    return int(match.group(1)) if match else 0


def arm_of(run_id: Any) -> str:
    """A run id less its repeat: a variant in compare, a variant at one setting in tune's final stage."""
    return re.sub(r"-r\d+$", "", str(run_id))


def floor_of(rows: pd.DataFrame) -> float:
    """A variant's spread floor (`spread_floor`) from its runs' timed steps and windows (median)."""
    if not len(rows) or "timed_steps" not in rows or "timed_wall_s" not in rows:
        return 0.0
    steps = pd.to_numeric(rows["timed_steps"], errors="coerce")
    wall = pd.to_numeric(rows["timed_wall_s"], errors="coerce")
    found = [spread_floor(s, w) for s, w in zip(steps, wall, strict=True)]
    return float(np.median(found))


def interval_of(
    rows: pd.DataFrame, base: pd.DataFrame, plan: dict[str, Any] | int | None
) -> tuple[float, float, float]:
    """The interval of `rows`' throughput over `base`'s (run rows with samples_per_s and run_id, each one arm): the
    one every table and decision shows. Without a second stage (`plan` without a pilot): Welch. After one (`plan`:
    plan.json's content, or just the pilot's repeats): two-stage, except for a pair whose plans the cap or the
    budget cut short both — their number of runs then says nothing of their spread beyond "large", and Welch
    over all runs, the noisy pilot in it, is valid and no narrower than it should be (docs/fairness.md)."""
    plan = {"pilot": plan} if isinstance(plan, int) else plan or {}
    pilot, needed, ran = plan.get("pilot"), plan.get("needed") or {}, plan.get("ran") or {}
    arms = [arm_of(r.run_id.iloc[0]) if len(r) else "" for r in (rows, base)]
    cut = all(needed.get(a, 0) > ran.get(a, needed.get(a, 0)) for a in arms)
    pilots = None
    if pilot and not cut:
        pilots = tuple(r.samples_per_s[r.run_id.map(repeat_of) < pilot] for r in (rows, base))
    floors = (floor_of(rows), floor_of(base))
    return ratio_interval(rows.samples_per_s, base.samples_per_s, pilots, floors)  # type: ignore[arg-type]
