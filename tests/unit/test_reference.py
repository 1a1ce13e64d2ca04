"""The committed reference results follow the current contract, so they cannot go stale unnoticed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.analysis import check, load
from benchmarks.cli import main
from benchmarks.run import recorder as results
from benchmarks.suite.comparison import COMPARISON_COLUMNS
from tests.helpers import REPO

REFERENCE = REPO / "results" / "reference"
COMPARES = sorted(p.parent for p in REFERENCE.glob("*/comparison.csv"))


def test_there_is_a_reference_comparison() -> None:
    assert COMPARES, f"no comparison.csv under {REFERENCE}"


def test_distbench_check_passes_on_every_reference_run(capsys) -> None:
    assert main(["check", str(REFERENCE / "*")]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("compare_dir", COMPARES, ids=lambda p: p.name)
def test_reference_columns_are_the_current_contract(compare_dir) -> None:
    columns = list(pd.read_csv(compare_dir / "comparison.csv", nrows=0).columns)
    assert columns in (list(COMPARISON_COLUMNS), [c for c in COMPARISON_COLUMNS if c not in NEWER_COMPARISON_COLUMNS])
    runs = load.find_run_dirs(compare_dir)
    assert runs
    for run_dir in runs:
        version = json.loads((run_dir / results.RUN_JSON).read_text())["schema_version"]
        assert version >= OLDEST_REFERENCE_SCHEMA, f"{run_dir}: schema {version}; regenerate the reference"
        for name, columns in (
            (results.TIMING_CSV, results.TIMING_COLUMNS),
            (results.LOSS_CSV, results.LOSS_COLUMNS_OF[version]),
            (results.SUMMARY_CSV, results.SUMMARY_COLUMNS_OF[version]),
        ):
            assert tuple(pd.read_csv(run_dir / name, nrows=0).columns) == columns, run_dir / name
        assert check.check_run(run_dir) == []


NEWER_COMPARISON_COLUMNS = ("step_config",)
"""comparison.csv's columns added after the references were made (the step, 2026-12-07: theirs is `fp32 eager`)."""
OLDEST_REFERENCE_SCHEMA = 4
"""Schema 5 (2026-12-07) added run.json `step` and summary.csv's FLOPs columns (FLOPS_COLUMNS) at the end; the
references made before it are schema 4 and are read with that schema's columns until they are made again."""

NEWER_THAN_THE_REFERENCES = {"compute_baseline", "step", "outside"}
"""Keys added after the references of 2026-12-01 to 2026-12-03 were made, which they lack until they are made
again: `compute_baseline` (its phases and the gradient-ready schedule, 2026-12-04; results/reference's
2026-12-04-projection has it) `step` (the step options as applied, their compile time, FLOPs and peak,
2026-12-07) and `outside` (the seconds outside the timed window by part, 2026-12-07). Only these; any other
key a run writes today must be in every reference."""

NEWER_CONFIG_THAN_THE_REFERENCES = {
    "compute_baseline_spread",
    "amp",
    "compile",
    "clip_grad_norm",
    "activation_checkpointing",
    "peak_tflops",
    "zero_stage",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
}
"""Run options added after every reference was made, which their run.json `config` lacks until they are made
again: `compute_baseline_spread` (2026-12-06) and the step options (2026-12-07); absent means off, which is how
every reference ran (fp32, eager, unclipped); DeepSpeed's section (2026-12-07), which no reference ran."""


@pytest.mark.timeout(60)
def test_reference_run_json_has_every_key_a_run_writes_today(tmp_path) -> None:
    argv = [
        "run",
        "--backend",
        "single",
        "--workload",
        "linear",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "3",
        "--warmup-steps",
        "1",
        "--quiet",
        "--out",
        str(tmp_path),
        "--run-id",
        "fresh",
    ]
    assert main(argv) == 0
    fresh = json.loads((tmp_path / "fresh" / results.RUN_JSON).read_text())
    for compare_dir in COMPARES:
        for run_dir in load.find_run_dirs(compare_dir):
            meta = json.loads((run_dir / results.RUN_JSON).read_text())
            missing = sorted(set(fresh) - set(meta) - NEWER_THAN_THE_REFERENCES)
            assert not missing, f"{run_dir} predates today's run.json: no {missing}; regenerate the reference"
            missing = sorted(set(fresh["config"]) - set(meta["config"]) - NEWER_CONFIG_THAN_THE_REFERENCES)
            assert not missing, f"{run_dir} predates today's run.json config: no {missing}; regenerate the reference"
