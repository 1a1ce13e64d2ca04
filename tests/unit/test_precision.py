"""The two-stage plan behind `compare --precision` (stats.planned_runs), checked by simulation.

Each simulated compare draws log-normal throughputs of two variants with a known true ratio, runs the
pilot, plans from the pilot's spread alone, runs the rest, and takes the two-stage interval (all runs'
means, the pilot's spread): it must cover the true ratio about 95 % of the time and always reach the
target half-width, as the plan promises. Wrong procedures (the pilot's runs dropped from the interval, or
stopping as soon as the interval looks decided) must fail the same checks, so the checks can tell.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.analysis import stats

SIMULATIONS = 1200
PILOT = 3
PRECISION = 0.05
CAP = 400
# 1200 Bernoulli trials: a binomial standard error of about 0.6 % at 95 %.


def _simulate(procedure: str, ratio: float, sigma: float, seed: int) -> tuple[float, float]:
    """Coverage of the true ratio and the share reaching PRECISION, over SIMULATIONS compares."""
    rng = np.random.default_rng(seed)
    covered = reached = 0
    for _ in range(SIMULATIONS):
        a = 100.0 * ratio * np.exp(rng.normal(0, sigma, PILOT))
        b = 100.0 * np.exp(rng.normal(0, sigma, PILOT))
        if procedure == "optional-stopping":  # look after every round, stop once it seems decided
            while len(a) < CAP:
                r, lo, hi = stats.ratio_ci(a, b)
                if not lo <= 1 <= hi or stats.relative_half_width(r, lo, hi) <= PRECISION:
                    break
                a = np.append(a, 100.0 * ratio * np.exp(rng.normal(0, sigma)))
                b = np.append(b, 100.0 * np.exp(rng.normal(0, sigma)))
            r, lo, hi = stats.ratio_ci(a, b)
        else:
            pilots = [a, b]
            n = min(CAP, stats.planned_runs(pilots, PRECISION))
            more_a = 100.0 * ratio * np.exp(rng.normal(0, sigma, n - PILOT))
            more_b = 100.0 * np.exp(rng.normal(0, sigma, n - PILOT))
            if procedure == "two-stage":
                a, b = np.append(a, more_a), np.append(b, more_b)
            else:  # "pilot-dropped": the interval from the second stage alone
                a, b = more_a, more_b
            r, lo, hi = stats.stein_ratio_ci(a, b, pilots)
        covered += bool(lo <= ratio <= hi)
        reached += bool(stats.relative_half_width(r, lo, hi) <= PRECISION)
    return covered / SIMULATIONS, reached / SIMULATIONS


@pytest.mark.parametrize(("ratio", "sigma", "seed"), [(1.0, 0.05, 1), (1.1, 0.08, 2), (0.8, 0.03, 3)])
def test_the_two_stage_plan_covers_and_reaches_what_it_promises(ratio: float, sigma: float, seed: int) -> None:
    coverage, reached = _simulate("two-stage", ratio, sigma, seed)
    assert 0.93 <= coverage <= 0.97, coverage
    assert reached == 1.0, reached


def test_dropping_the_pilot_fails_to_reach_the_precision() -> None:
    coverage, reached = _simulate("pilot-dropped", 1.0, 0.05, 1)
    assert reached < 0.99, (coverage, reached)


def test_optional_stopping_fails_coverage() -> None:
    coverage, _ = _simulate("optional-stopping", 1.0, 0.05, 1)
    assert not 0.93 <= coverage <= 0.97, coverage


def test_the_plan_never_asks_for_fewer_runs_than_the_pilot_and_grows_with_the_spread() -> None:
    rng = np.random.default_rng(0)
    quiet = [100 * np.exp(rng.normal(0, 0.001, 3)) for _ in range(2)]
    noisy = [100 * np.exp(rng.normal(0, 0.2, 3)) for _ in range(2)]
    assert stats.planned_runs(quiet, 0.05) == 3
    assert stats.planned_runs(noisy, 0.05) > stats.planned_runs(noisy, 0.2) > 3


def test_runs_to_resolve_grows_as_the_difference_shrinks() -> None:
    rng = np.random.default_rng(0)
    noise = np.exp(rng.normal(0, 0.05, 5))
    far, near = stats.runs_to_resolve(noise * 1.2, noise[::-1]), stats.runs_to_resolve(noise * 1.01, noise[::-1])
    assert far is not None and near is not None and near > far >= stats.MIN_RUNS
