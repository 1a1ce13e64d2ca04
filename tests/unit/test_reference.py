"""The committed reference results follow the current contract, so they cannot go stale unnoticed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.analysis import check, load
from benchmarks.cli import main
from benchmarks.run import recorder as results
from benchmarks.suite.compare import COMPARISON_COLUMNS
from tests.helpers import REPO

REFERENCE = REPO / "results" / "reference"
COMPARES = sorted(p.parent for p in REFERENCE.glob("*/comparison.csv"))


def test_there_is_a_reference_comparison() -> None:
    assert COMPARES, f"no comparison.csv under {REFERENCE}"


def test_distbench_check_passes_on_every_reference_run(capsys) -> None:
    assert main(["check", str(REFERENCE / "*")]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("compare_dir", COMPARES, ids=lambda p: p.name)
def test_reference_columns_are_the_current_contract(compare_dir) -> None:
    assert list(pd.read_csv(compare_dir / "comparison.csv", nrows=0).columns) == list(COMPARISON_COLUMNS)
    runs = load.find_run_dirs(compare_dir)
    assert runs
    for run_dir in runs:
        assert json.loads((run_dir / results.RUN_JSON).read_text())["schema_version"] == results.SCHEMA_VERSION
        for name, columns in (
            (results.TIMING_CSV, results.TIMING_COLUMNS),
            (results.LOSS_CSV, results.LOSS_COLUMNS),
            (results.SUMMARY_CSV, results.SUMMARY_COLUMNS),
        ):
            assert tuple(pd.read_csv(run_dir / name, nrows=0).columns) == columns, run_dir / name
        assert check.check_run(run_dir) == []


NEWER_THAN_THE_REFERENCES = {"compute_baseline"}
"""Keys added after the references of 2026-12-01 to 2026-12-03 were made, which they lack until they are made
again: `compute_baseline` (its phases and the gradient-ready schedule, 2026-12-04; results/reference's
2026-12-04-projection has it). Only these; any other key a run writes today must be in every reference."""

NEWER_CONFIG_THAN_THE_REFERENCES = {"compute_baseline_spread"}
"""Run options added after every reference was made, which their run.json `config` lacks until they are made
again: `compute_baseline_spread` (2026-12-06; absent means off, which is how every reference ran)."""


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
