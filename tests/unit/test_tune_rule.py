"""`distbench tune` keeps the sweep's best knobs only when their gain's 95 % interval (the decision's, one
function) lies wholly above 1: the rule on its own, after a two-stage final stage, and through `tune.finish` on
constructed final runs (4 repeats of each setting)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import stats
from benchmarks.config import RunConfig
from benchmarks.suite import comparison, tune, variants
from tests.helpers import BEYOND_NOISE, DEFAULT, WITHIN_NOISE, make_run

POINT = {"bucket_cap_mb": 5.0}


def runs(values: list[float]) -> pd.DataFrame:
    """Final runs as tune.finish has them: run ids with their repeat, throughput, an 80-step 2 s window."""
    return pd.DataFrame(
        {
            "run_id": [f"x-r{i}" for i in range(len(values))],
            "samples_per_s": values,
            "timed_steps": 80,
            "timed_wall_s": 2.0,
        }
    )


def test_the_constructed_intervals_are_what_they_claim() -> None:
    _, lo, hi = stats.ratio_ci(WITHIN_NOISE, DEFAULT)
    assert 0.9 < lo < 1.0 < hi < 1.2
    assert stats.ratio_ci(BEYOND_NOISE, DEFAULT)[1] > 1.0


def test_a_gain_whose_interval_includes_1_keeps_the_default() -> None:
    keep, why, (gain, lo, hi) = tune.keep_or_default(runs(WITHIN_NOISE), runs(DEFAULT), POINT)
    assert keep == "default" and gain > 1.0 and lo < 1.0 < hi
    assert "within noise" in why


def test_a_gain_wholly_above_1_keeps_the_best() -> None:
    keep, why, (_, lo, _) = tune.keep_or_default(runs(BEYOND_NOISE), runs(DEFAULT), POINT)
    assert keep == "best" and lo > 1.0
    assert "beyond noise" in why


@pytest.mark.parametrize(
    ("tuned", "default", "reason"),
    [
        (BEYOND_NOISE[:2], DEFAULT[:2], "runs"),  # a large gain from 2 runs each has no interval
        ([], DEFAULT, "the default is the sweep's best"),
    ],
)
def test_without_an_interval_the_default_is_kept(tuned: list[float], default: list[float], reason: str) -> None:
    keep, why, _ = tune.keep_or_default(runs(tuned), runs(default), POINT)
    assert keep == "default" and reason in why


def test_finish_holds_the_rule_on_final_runs(tmp_path: Path) -> None:
    """Two variants' final runs: ddp's best within noise (default kept), horovod's beyond it (best kept)."""
    chosen = variants.parse("ddp@torchrun,horovod@gloo")
    throughputs = {
        "ddp@torchrun": {"default": DEFAULT, "best": WITHIN_NOISE},
        "horovod@gloo": {"default": DEFAULT, "best": BEYOND_NOISE},
    }
    gloo = {"launcher": "horovodrun", "launcher_detail": "gloo", "knobs": {"controller": "gloo"}}
    metas = {"ddp@torchrun": {"launcher": "torchrun"}, "horovod@gloo": gloo}
    attempts, jobs = [], []
    for v in chosen:
        for setting, values in throughputs[v.name].items():
            prefix = f"{v.slug}-{setting}"
            jobs.append(variants.Job(v, 1, RunConfig(), [], 1, prefix))
            for repeat, samples_per_s in enumerate(values):
                run_id = f"{prefix}-r{repeat}"
                # 3 steps of 10 samples, the first warm-up: 20 timed samples in the window.
                make_run(
                    tmp_path / "final",
                    run_id,
                    v.backend,
                    [[0.1, 0.1, 0.1]],
                    wall=20 / samples_per_s,
                    meta=metas[v.name],
                )
                attempts.append(comparison.Attempt(v.name, v.backend, 1, 10, repeat, run_id, [], returncode=0))
    best = {v.name: POINT for v in chosen}
    tune.finish(tmp_path, attempts, jobs, best, chosen, {"margin": 0.05})
    tuned = pd.read_csv(tmp_path / tune.TUNED_CSV).set_index("variant")
    assert tuned.loc["ddp@torchrun", "gain_low"] < 1.0 < tuned.loc["ddp@torchrun", "gain_high"]
    assert tuned.loc["ddp@torchrun", "kept"] == "default"
    assert tuned.loc["horovod@gloo", "gain_low"] > 1.0
    assert tuned.loc["horovod@gloo", "kept"] == "best"


def test_after_a_two_stage_final_stage_the_rule_takes_the_two_stage_interval() -> None:
    """A quiet pilot then noisy later runs: the two-stage interval (spread from the pilot) is the decision's."""
    from benchmarks.analysis import intervals

    tuned, default = runs([110.0, 111.0, 109.0, 100.0, 125.0]), runs([100.0, 101.0, 99.0, 112.0, 90.0])
    _, _, (gain, lo, hi) = tune.keep_or_default(tuned, default, POINT, pilot=3)
    assert (gain, lo, hi) == intervals.interval_of(tuned, default, 3)
    assert (lo, hi) != intervals.interval_of(tuned, default, None)[1:]
