"""compare's runs sized to the workload, its one plan after the pilot, and where a job's time outside its timed
window goes: the arithmetic and the words, in-process."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from benchmarks.analysis import decision_words
from benchmarks.errors import InputError
from benchmarks.suite import comparison, precision, sizing, variants
from tests.helpers import config


def test_a_run_is_sized_to_fill_its_window_over_as_many_epochs_as_the_data_takes() -> None:
    one = sizing.length(step_s=0.05, window_s=6.0, warmup_steps=5, data_steps=200)
    assert one == {"timed_steps": 120, "epochs": 1, "steps_per_epoch": 125}
    many = sizing.length(step_s=0.015, window_s=6.0, warmup_steps=5, data_steps=32)  # a small data set
    assert many["epochs"] == math.ceil(405 / 32) == 13 and many["steps_per_epoch"] is None  # 13 whole epochs
    assert many["timed_steps"] == 416 - 5  # what runs, not what was asked: whole epochs of the same length
    two = sizing.length(step_s=0.05, window_s=12.0, warmup_steps=5, data_steps=128)
    assert two == {"timed_steps": 241, "epochs": 2, "steps_per_epoch": 123}  # 2 × 123, not 2 whole epochs
    slow = sizing.length(step_s=2.0, window_s=6.0, warmup_steps=5, data_steps=1000)
    assert slow["timed_steps"] == sizing.MIN_TIMED_STEPS  # never a window of a handful of steps


def _args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"window": 6.0, "epochs": None, "steps_per_epoch": None, **given})


def test_sizing_applies_only_when_the_user_gave_no_length() -> None:
    assert sizing.wanted(_args())
    assert not sizing.wanted(_args(epochs=3)) and not sizing.wanted(_args(steps_per_epoch=50))
    assert not sizing.wanted(_args(window=0.0))
    with pytest.raises(InputError):
        sizing.wanted(_args(window=-1.0))


def test_every_job_gets_the_probes_length_and_sizing_json_says_why(tmp_path: Path) -> None:
    [ddp, hvd] = [variants.parse(name, None)[0] for name in ("ddp", "horovod")]
    cfg = config(workload="mlp", epochs=1, steps_per_epoch=85)
    jobs = variants.jobs_for(cfg, [ddp, hvd], [2], None, {}, threads=1, env={})
    probes = []

    def run_probe(job: variants.Job) -> Path:
        probes.append(job)
        run_dir = tmp_path / "probe-r0"
        run_dir.mkdir()
        (run_dir / "summary.csv").write_text("run_id,step_p50_s\nprobe-r0,0.02\n")
        return run_dir

    sized, line = sizing.size(jobs, 6.0, tmp_path, run_probe, lambda job: 40)
    assert [p.cfg.compute_baseline_steps for p in probes] == [0] and probes[0].variant == ddp
    assert {(j.cfg.epochs, j.cfg.steps_per_epoch) for j in sized} == {(8, 39)}  # 305 steps: 8 epochs of 39
    assert "takes 20.0 ms" in line and "307 timed steps a run" in line and "8 epochs" in line
    assert (tmp_path / sizing.SIZING_JSON).is_file() and not (tmp_path / "probe-r0").exists()


def _plan_args(**given: object) -> argparse.Namespace:
    base = {"precision": 0.0247, "margin": 0.05, "repeats": 3, "max_repeats": 8, "budget_s": 240.0}
    return argparse.Namespace(**{**base, **given})


def test_a_budget_that_cannot_decide_says_the_one_plan_that_would() -> None:
    assert precision.advice(_plan_args(), {"ddp": 5, "hvd": 8}, round_s=30.0) is None  # within the budget
    said = precision.advice(_plan_args(), {"ddp": 9626, "hvd": 300}, round_s=30.0)
    assert said is not None and "cannot decide at ±5%" in said and "need 9626 runs of each" in said
    margin = precision.reachable_margin(0.0247, 9626, 8)
    assert f"--margin {margin:.2f}" in said and margin > 0.05
    # the reachable margin is the one whose target half-width 8 runs reach
    reached = math.expm1(math.log1p(0.0247) * math.sqrt(9626 / 8))
    assert math.isclose(precision.target_for(margin), reached)


def test_the_final_lines_repeat_the_pilots_plan_and_give_no_other_count() -> None:
    plan = {"pilot": 3, "precision": 0.0247, "advice": "this budget (8 runs of each) cannot decide at ±5%: …"}
    alt = {"variant": "hvd", "status": "unresolved", "ratio": 0.8, "ci": [0.5, 1.1], "half_width": 0.3}
    setup = {
        "workload": "w",
        "global_batch": 8,
        "world_size": 2,
        "decides": True,
        "status": "unresolved",
        "recommended": {"variant": "ddp", "knobs": {}, "memory_mb": {}, "runs": 8},
        "alternatives": [{**alt, "runs": 8, "memory_mb": {}, "repeats_to_resolve_estimate": 58, "command": "x"}],
    }
    lines = decision_words.words({"plan": plan, "setups": [setup]})
    text = "\n".join(lines)
    assert plan["advice"] in text and "58 runs" not in text and "the plan the pilot gave" in text
    # Decided after all (the pilot's spreads were wide by chance): no "cannot decide" beside a decision.
    settled = {**setup, "status": "resolved", "alternatives": [{**setup["alternatives"][0], "status": "resolved"}]}
    text = "\n".join(decision_words.words({"plan": plan, "setups": [settled]}))
    assert plan["advice"] not in text and "decided with these runs" in text
    # A setup with nothing to decide between (no alternatives) is not "decided": the plan stands.
    alone = {**setup, "status": "oversubscribed", "alternatives": []}
    assert plan["advice"] in "\n".join(decision_words.words({"plan": plan, "setups": [alone]}))


def test_the_time_line_says_what_each_job_spends_outside_its_window() -> None:
    def attempt(wall: float, timed: float, outside: dict[str, float]) -> comparison.Attempt:
        a = comparison.Attempt("ddp@torchrun", "ddp", 2, 8, 0, "ddp-r0", [], 0, wall, timed)
        a.outside = outside
        return a

    parts = comparison.outside_parts([attempt(10.0, 4.0, {"start": 2.0, "baseline": 1.0}), attempt(12.0, 4.0, {})])
    assert parts == {"launch and exit": 3.0, "start": 2.0, "baseline": 1.0}  # the job without parts is left out
    line = comparison.time_line([attempt(10.0, 4.0, {"start": 2.0, "baseline": 1.0})], {"1 jobs": 10.0}, 10.0)
    assert "outside the timed window, per job: 6.0 s (launch and exit 3.0, start 2.0, baseline 1.0)" in line
