"""Autotuning under horovodrun --gloo: `run --backend horovod --autotune` logs Horovod's autotuner into the
run directory and records what it settled on; a warm-up too short for its search is refused before any job.

Horovod's own defaults need 4437 steps on a CPU build (backends/horovod_autotune.py); the autotuner's exported
settings shrink its search to 48 steps: (0 warm-up + (1 + 1) × 2^2) scores × (5 × 1 + 1) steps.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import horovodrun, run_cmd, run_ok

SMALL = {
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "1",
}
RUN = [
    "run",
    "--backend",
    "horovod",
    "--autotune",
    "--workload",
    "linear",
    "--epochs",
    "1",
    "--quiet",
    "--compute-baseline-steps",
    "0",
    "--val-size",
    "64",
    "--train-size",
    "8192",
]


@pytest.mark.timeout(200)
def test_autotune_logs_its_search_and_records_what_it_settled_on(tmp_path, horovod_available) -> None:
    cmd = [*horovodrun(2), *RUN, "--steps-per-epoch", "60", "--warmup-steps", "50", "--out", str(tmp_path)]
    run_ok([*cmd, "--run-id", "r"], 180, **SMALL)
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    knobs = meta["knobs"]
    assert meta["status"] == "completed" and meta["config"]["autotune"] is True
    assert knobs["fusion_threshold_mb"] == knobs["cycle_time_ms"] == "autotuned"
    assert knobs["autotune"]["settled_within_steps"] == 48 and knobs["autotune"]["held"] == []
    settled = knobs["autotuned"]
    assert settled["finished"] and settled["scored"] == 8 and settled["log"] == "autotune.csv"
    assert settled["fusion_threshold_mb"] >= 0 and settled["cycle_time_ms"] > 0
    log = (tmp_path / "r" / "autotune.csv").read_text().splitlines()
    assert log[0].startswith("hierarchical_allreduce,") and len(log) == 1 + 8 + 1  # header, scores, best
    assert meta["environment"]["variables"]["HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"] == "1"


@pytest.mark.timeout(200)
def test_a_warm_up_too_short_for_the_search_is_refused(tmp_path, horovod_available) -> None:
    cmd = [*horovodrun(2), *RUN, "--steps-per-epoch", "20", "--warmup-steps", "5", "--out", str(tmp_path)]
    proc = run_cmd(cmd, 180)
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if "distbench: error:" in line]
    assert said and "settles after at most 4437 steps" in said[0] and "--warmup-steps 4437" in said[0]
    assert not any(tmp_path.iterdir())  # refused before any process group: no run directory
