"""Horovod's autotuner: its minimum of steps and its log (backends/horovod_autotune.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from backends import horovod_autotune as at
from benchmarks import environment
from benchmarks.config import HorovodConfig
from benchmarks.errors import InputError

# ParameterManager's own header and rows, as Horovod 0.28.1 writes them (note the ", " after torus_allreduce).
HEADER = "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
HEADER += "tensor_fusion_threshold,score"
ROWS = ["0,0,0, 1,5,4,120.5", "0,0,0, 1,50,32,180.25", "0,1,0, 0,25,16,90"]


def write_log(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def test_defaults_on_a_cpu_build_need_4437_steps() -> None:
    plan = at.plan({}, gpu_build=False)
    assert plan.tunable == ("hierarchical_allgather", "cache_enabled")  # hierarchical/torus allreduce need NCCL
    assert plan.scores == 21 * 4 and plan.steps_per_score == 51
    assert plan.steps == (3 + 84) * 51 == 4437
    assert "(3 warm-up + (20 + 1) × 2^2" in plan.derivation()


def test_a_gpu_build_tunes_all_four_switches() -> None:
    assert at.plan({}, gpu_build=True).steps == (3 + 21 * 16) * 51 == 17289


def test_exported_settings_and_fixed_parameters_change_the_minimum() -> None:
    env = {
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "1",
        "HOROVOD_CACHE_CAPACITY": "1024",
    }
    plan = at.plan(env, gpu_build=False)
    assert plan.tunable == ("hierarchical_allgather",) and plan.steps == (0 + 2 * 2) * 6
    with pytest.raises(InputError, match="not an integer"):
        at.plan({"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "ten"}, gpu_build=False)


def test_a_warm_up_shorter_than_the_search_is_refused_in_one_line() -> None:
    with pytest.raises(InputError) as exc:
        at.check_steps(5, 85, {}, gpu=False)
    message = str(exc.value)
    assert "\n" not in message and "at most 4437 steps" in message and "--warmup-steps 4437" in message
    with pytest.raises(InputError):  # the warm-up holds it, but no step is left to time
        at.check_steps(4437, 4437, {}, gpu=False)
    at.check_steps(4437, 4438, {}, gpu=False)


def test_a_finished_log_gives_its_last_row(tmp_path) -> None:
    # 2 scored rows expected, then LogBestParameters' row.
    found = at.read_log(write_log(tmp_path / "autotune.csv", ROWS), expected_scores=2)
    assert found["finished"] and found["scored"] == 2 and found["from"].startswith("its best")
    assert found["fusion_threshold_mb"] == 16.0 and found["cycle_time_ms"] == 25.0
    assert found["hierarchical_allgather"] is True and found["cache_enabled"] is False
    assert at.summary(found).endswith("(finished)") and "fusion 16 MB, cycle 25 ms" in at.summary(found)


def test_an_unfinished_log_gives_its_best_row_so_far(tmp_path) -> None:
    found = at.read_log(write_log(tmp_path / "autotune.csv", ROWS[:2]), expected_scores=10)
    assert not found["finished"] and found["scored"] == 2
    assert found["fusion_threshold_mb"] == 32.0 and found["score_bytes_per_us"] == 180.25
    assert "not finished" in at.summary(found)


def test_an_empty_or_missing_log_says_so(tmp_path) -> None:
    assert at.read_log(write_log(tmp_path / "a.csv", []), 2)["scored"] == 0
    assert "no autotune log" in at.read_log(tmp_path / "missing.csv", 2)["error"]


def test_an_exported_horovod_autotune_is_adopted_as_the_option() -> None:
    options, adopted = environment.adopt(HorovodConfig(), set(), {"HOROVOD_AUTOTUNE": "1"})
    assert options.autotune is True and adopted["autotune"]["from"] == "HOROVOD_AUTOTUNE=1"
    assert environment.adoption_notes(adopted) == [
        "distbench: HOROVOD_AUTOTUNE=1 from the environment sets --autotune on (docs/fairness.md)"
    ]
    with pytest.raises(InputError, match="HOROVOD_AUTOTUNE=0 in the environment and --autotune on disagree"):
        environment.adopt(HorovodConfig(autotune=True), {"autotune"}, {"HOROVOD_AUTOTUNE": "0"})


def test_tune_finish_sets_the_autotuned_run_beside_default_and_grid_best(tmp_path: Path) -> None:
    """horovod@gloo's grid best within noise, its autotuned run beyond it: autotune kept, both rows say why,
    and the autotune row names what the autotuner settled on."""
    from benchmarks.config import RunConfig
    from benchmarks.suite import comparison, tune, variants
    from tests.helpers import BEYOND_NOISE, DEFAULT, WITHIN_NOISE, make_run

    [v] = variants.parse("horovod@gloo")
    settled = at.read_log(write_log(tmp_path / "log.csv", ROWS), expected_scores=2)
    attempts, jobs = [], []
    for setting, values in {"default": DEFAULT, "best": WITHIN_NOISE, "autotune": BEYOND_NOISE}.items():
        prefix = f"{v.slug}-{setting}"
        jobs.append(variants.Job(v, 1, RunConfig(), [], 1, prefix))
        knobs = {"controller": "gloo", **({"autotuned": settled} if setting == "autotune" else {})}
        for repeat, samples_per_s in enumerate(values):
            make_run(
                tmp_path / "final",
                f"{prefix}-r{repeat}",
                v.backend,
                [[0.1, 0.1, 0.1]],
                wall=20 / samples_per_s,
                meta={"launcher": "horovodrun", "launcher_detail": "gloo", "knobs": knobs},
            )
            attempts.append(
                comparison.Attempt(v.name, v.backend, 1, 10, repeat, f"{prefix}-r{repeat}", [], returncode=0)
            )
    text = tune.finish(tmp_path, attempts, jobs, {v.name: {"fusion_threshold_mb": 1.0}}, [v], {"margin": 0.05})
    tuned = pd.read_csv(tmp_path / tune.TUNED_CSV)
    assert len(tuned) == 2 and list(tuned.kept) == ["autotune", "autotune"]
    grid, auto = tuned.iloc[0], tuned.iloc[1]
    assert grid.gain_low < 1.0 < grid.gain_high and auto.gain_low > 1.0
    assert auto.best == "autotune: " + at.summary(settled)
    assert grid.why == auto.why and auto.why.startswith("grid best ") and "within noise; autotune " in auto.why
    assert auto.why.endswith("beyond noise: autotune kept")
    assert "autotune" in text
