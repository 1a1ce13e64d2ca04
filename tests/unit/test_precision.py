"""The decision's statistics checked by simulation (seeded, in-process): the two-stage plan and interval with
each variant's own spread, the margin apart from the precision, and the power behind "N runs would settle it".

Each check has a negative control, a wrong procedure that must fail the same check, so the check can tell:
a pooled spread under unequal spreads, the margin used as the target half-width, the planner that froze its
first guess, the pilot's runs dropped, and stopping as soon as the interval looks decided.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from benchmarks.analysis import decision, intervals, stats
from benchmarks.suite import precision

SIMULATIONS = 1200  # a binomial standard error of about 0.6 % at 95 %
PILOT = 3


def _two_stage(
    sigmas: tuple[float, ...],
    ratio: float,
    target: float,
    seed: int,
    pooled: bool = False,
    cap: int = 10**6,
    sims: int = SIMULATIONS,
) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of the first variant over the second, per simulated two-stage compare: log-normal runs, the
    first variant `ratio` times the others' throughput. `pooled`: the old plan and interval, one spread pooled
    over every variant."""
    rng = np.random.default_rng(seed)
    centres = [np.log(ratio)] + [0.0] * (len(sigmas) - 1)
    bounds = np.empty((sims, 2))
    for i in range(sims):
        pilots = [np.exp(m + rng.normal(0, s, PILOT)) for m, s in zip(centres, sigmas, strict=True)]
        if pooled:
            logs = [np.log(p) for p in pilots]
            s2, nu = sum(((x - x.mean()) ** 2).sum() for x in logs) / (len(logs) * (PILOT - 1)), len(logs) * (PILOT - 1)
            t = scipy_stats.t.ppf(0.975, nu)
            n = [max(PILOT, int(np.ceil(2 * s2 * (t / np.log1p(target)) ** 2)))] * len(pilots)
        else:
            n = intervals.planned_runs(pilots, target)
        n = [min(cap, k) for k in n]
        runs = [
            np.append(p, np.exp(m + rng.normal(0, s, k - PILOT)))
            for p, m, s, k in zip(pilots, centres, sigmas, n, strict=True)
        ]
        if pooled:
            diff = np.log(runs[0]).mean() - np.log(runs[1]).mean()
            half = t * np.sqrt(s2 * (1 / n[0] + 1 / n[1]))
            bounds[i] = np.exp(diff - half), np.exp(diff + half)
        else:
            bounds[i] = intervals.ratio_interval(runs[0], runs[1], (pilots[0], pilots[1]))[1:]
    return bounds[:, 0], bounds[:, 1]


@pytest.mark.parametrize(
    ("sigmas", "ratio", "seed"),
    [((0.04, 0.04, 0.04), 1.0, 1), ((0.12, 0.04, 0.04), 1.0, 2), ((0.04, 0.12), 1.1, 3), ((0.03, 0.06, 0.09), 0.9, 4)],
)
def test_the_two_stage_interval_covers_with_each_variants_own_spread(sigmas, ratio, seed) -> None:
    """Spreads up to 3:1 between variants, two and three variants: coverage 93-97.5 % (slightly conservative),
    and the target half-width always reached when the plan is not capped."""
    lo, hi = _two_stage(sigmas, ratio, 0.05, seed)
    coverage = np.mean((lo <= ratio) & (ratio <= hi))
    assert 0.93 <= coverage <= 0.975, coverage
    assert np.all(np.sqrt(hi / lo) - 1 <= 0.05 + 1e-9)


def test_negative_control_a_pooled_spread_under_unequal_spreads_covers_too_rarely() -> None:
    lo, hi = _two_stage((0.16, 0.04, 0.04), 1.0, 0.05, 2, pooled=True)
    assert np.mean((lo <= 1) & (1 <= hi)) < 0.93


def test_the_plan_gives_the_noisy_variant_the_runs_not_its_quiet_rival() -> None:
    rng = np.random.default_rng(0)
    noisy, quiet = (100 * np.exp(rng.normal(0, s, PILOT)) for s in (0.12, 0.02))
    n_noisy, n_quiet = intervals.planned_runs([noisy, quiet], 0.05)
    assert n_noisy > 5 * n_quiet >= 5 * PILOT


def _outcomes(ratio: float, margin: float, target: float, seed: int, cap: int = 10**6) -> dict[str, float]:
    lo, hi = _two_stage((0.04, 0.04), ratio, target, seed, cap=cap, sims=600)
    found = [decision.status_of(a, b, margin) for a, b in zip(lo, hi, strict=True)]
    return {s: found.count(s) / len(found) for s in ("resolved", "equivalent", "unresolved")}


def test_two_equal_variants_end_equivalent_at_the_margins_target() -> None:
    """The target √(1+M) − 1 always decides: at a true ratio of 1 nearly every compare ends equivalent."""
    rates = _outcomes(1.0, 0.1, precision.target_for(0.1), 5)
    assert rates["unresolved"] == 0 and rates["equivalent"] >= 0.9, rates


def test_negative_control_margin_equal_to_the_half_width_rarely_ends_equivalent() -> None:
    rates = _outcomes(1.0, 0.1, 0.1, 5)
    assert rates["equivalent"] < 0.5, rates


def test_a_difference_twice_the_margin_ends_resolved() -> None:
    rates = _outcomes(1.2, 0.1, precision.target_for(0.1), 6)
    assert rates["resolved"] >= 0.95, rates


def _simulated_power(n: int, diff: float, sigma_a: float, sigma_b: float, seed: int, sims: int = 2000) -> float:
    rng = np.random.default_rng(seed)
    a = np.exp(diff + rng.normal(0, sigma_a, (sims, n)))
    b = np.exp(rng.normal(0, sigma_b, (sims, n)))
    return float(
        np.mean([not lo <= 1 <= hi for lo, hi in (stats.ratio_ci(x, y)[1:] for x, y in zip(a, b, strict=True))])
    )


def _old_runs_to_resolve(x: np.ndarray, y: np.ndarray) -> int:
    """The planner before: its first guess frozen (`n = max(n, …)`), t at the pilot's few degrees of freedom."""
    diff, vx, vy = abs(x.mean() - y.mean()), x.var(ddof=1), y.var(ddof=1)
    n = max(stats.MIN_RUNS, len(x), len(y))
    for _ in range(8):
        df = (n - 1) * (vx + vy) ** 2 / (vx**2 + vy**2)
        n = max(n, int(np.ceil((vx + vy) * (float(scipy_stats.t.ppf(0.975, df)) / diff) ** 2)))
    return n


def test_runs_to_resolve_is_the_smallest_n_with_80_percent_power() -> None:
    """Against a brute-force search of the power function, and against simulation; the observed difference
    and spreads are set exactly (3 runs each, σ = 0.05, 8 %) so the check is of the search, not of noise."""
    unit = np.array([-1.0, 0.0, 1.0]) * 0.05  # sample sd exactly 0.05
    diff = np.log(1.08)
    a, b = np.exp(diff + unit), np.exp(unit)
    n = intervals.runs_to_resolve(a, b)
    brute = next(k for k in range(4, 1000) if intervals.welch_power(k, diff, 0.05**2, 0.05**2) >= 0.8)
    assert n == brute
    assert 0.76 <= _simulated_power(n, diff, 0.05, 0.05, seed=7) <= 0.86
    assert _simulated_power(n - 2, diff, 0.05, 0.05, seed=8) < 0.8


def test_negative_control_the_frozen_planner_overstates_the_runs() -> None:
    """At 50 % power (what 'the observed difference would be resolved' means) the old planner asked for far
    more runs than the smallest n that gives it."""
    unit = np.array([-1.0, 0.0, 1.0]) * 0.05
    diff = np.log(1.02)
    old = _old_runs_to_resolve(diff + unit, unit)
    half = intervals.runs_to_resolve(np.exp(diff + unit), np.exp(unit), power=0.5)
    assert half is not None and old > 1.5 * half, (old, half)


def test_identical_repeats_give_no_zero_width_interval() -> None:
    same = [100.0, 100.0, 100.0]
    floor = intervals.spread_floor(80, 2.0)
    _, lo, hi = intervals.ratio_interval(same, same, floors=(floor, floor))
    assert lo < 1 < hi and hi - lo > 0
    _, lo, hi = intervals.ratio_interval(same, same, (same, same), (floor, floor))
    assert lo < 1 < hi


@pytest.mark.parametrize(("lo", "hi", "digits"), [(0.54, 0.9996, 4), (0.59, 0.91, 2), (1.004, 1.2, 3)])
def test_an_interval_excluding_1_never_reads_as_touching_it(lo: float, hi: float, digits: int) -> None:
    assert stats.interval_digits(lo, hi) == digits


def test_a_pair_whose_plans_were_both_cut_short_takes_welch_over_all_runs_and_still_covers() -> None:
    """When the cap stops both plans (their pilots were noisy), the runs each got say nothing more of their
    spread: Welch over all runs (the noisy pilot in it) covers 93-97.5 % and is narrower than the two-stage one."""
    import pandas as pd

    rng = np.random.default_rng(9)
    covered, narrower, cap = 0, 0, 8
    for _ in range(SIMULATIONS // 2):
        pilots = [np.exp(rng.normal(0, 0.05, PILOT)) for _ in range(2)]
        needed = intervals.planned_runs(pilots, 0.025)
        runs = [
            np.append(p, np.exp(rng.normal(0, 0.05, min(cap, k) - PILOT))) for p, k in zip(pilots, needed, strict=True)
        ]
        frames = [
            pd.DataFrame({"run_id": [f"{arm}-r{i}" for i in range(len(r))], "samples_per_s": r})
            for arm, r in zip(("a", "b"), runs, strict=True)
        ]
        plan = {
            "pilot": PILOT,
            "needed": dict(zip("ab", needed, strict=True)),
            "ran": {a: min(cap, k) for a, k in zip("ab", needed, strict=True)},
        }
        _, lo, hi = intervals.interval_of(frames[0], frames[1], plan)
        _, slo, shi = intervals.interval_of(frames[0], frames[1], PILOT)  # two-stage whatever the cap
        covered += lo <= 1 <= hi
        narrower += hi / lo <= shi / slo
    assert 0.93 <= covered / (SIMULATIONS // 2) <= 0.975
    assert narrower / (SIMULATIONS // 2) > 0.7
