"""Issue 52: a backend is declared once. The toy backend of tests/integration/toy_backend.py registers itself
from the test's own module (DISTBENCH_BACKENDS) and runs through compare, tune, report and project; nothing
else in distbench names it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import BIN, REPO, run_cmd, run_ok, torchrun

DISTBENCH = str(BIN / "distbench")
SHORT = ["--workload", "mlp", "--epochs", "1", "--steps-per-epoch", "20"]
PLUGIN = {"DISTBENCH_BACKENDS": "tests.integration.toy_backend"}


def test_nothing_outside_the_tests_names_the_toy() -> None:
    named = [p for p in (*REPO.glob("benchmarks/**/*.py"), *REPO.glob("backends/*.py")) if "toy" in p.read_text()]
    assert named == []


@pytest.mark.full_matrix
@pytest.mark.timeout(400)
def test_a_backend_declared_in_a_tests_module_runs_through_compare_tune_report_and_project(tmp_path: Path) -> None:
    cmp = run_ok([DISTBENCH, "compare", "--backends", "ddp,toy", *SHORT, "--repeats", "3", "--out", str(tmp_path)],
                 180, **PLUGIN)  # fmt: skip
    assert "Decision (" in cmp.stdout and "toy@torchrun" in cmp.stdout
    # its check_run, said at start-up, and not again by each job's rank 0
    assert cmp.stderr.count("toy: checked once for the machine, buckets of 25.0 MB") == 1, cmp.stderr
    root = Path(cmp.stdout.strip().splitlines()[-1])
    runs = pd.read_csv(root / "comparison.csv")
    assert set(runs.variant) == {"ddp@torchrun", "toy@torchrun"} and (runs.status == "completed").all()
    toy = json.loads(next(root.glob("toy-r0/run.json")).read_text())
    assert toy["config"]["toy_bucket_mb"] == 25.0 and toy["knobs"]["bucket_cap_mb"] == 25.0  # its own section
    assert "train 0.00e+00" in cmp.stdout  # DDP underneath: the same curve
    projected = run_ok([DISTBENCH, "project", str(root), "--link", "1gbit"], 120, **PLUGIN)
    assert "toy@torchrun" in projected.stdout  # its declared schedule
    run_ok([DISTBENCH, "report", str(root), "--out", str(tmp_path / "report")], 120, **PLUGIN)
    assert "toy@torchrun" in (tmp_path / "report" / "report.md").read_text()
    tune = [DISTBENCH, "tune", "--backends", "toy", *SHORT, "--tune-steps", "12", "--repeats", "3"]
    tuned = run_ok([*tune, "--out", str(tmp_path), "--run-id", "t"], 240, **PLUGIN)
    assert "distbench tune: toy: checked once for the machine" in tuned.stderr
    swept = pd.read_csv(tmp_path / "t" / "tune.csv")
    assert sorted(swept.toy_bucket_mb) == [1.0, 25.0]  # its declared grid


@pytest.mark.timeout(120)
def test_a_plain_run_says_what_its_backend_did_for_the_machine_once(tmp_path: Path) -> None:
    argv = [*torchrun(2), "run", "--backend", "toy", *SHORT, "--toy-bucket-mb", "4", "--out", str(tmp_path)]
    done = run_ok(argv, 100, **PLUGIN)
    said = [line for line in done.stderr.splitlines() if "checked once for the machine" in line]
    assert said == ["distbench: toy: checked once for the machine, buckets of 4.0 MB"], done.stderr  # rank 0's


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_a_module_that_cannot_be_imported_is_one_line_and_exit_2() -> None:
    done = run_cmd([DISTBENCH, "compare", "--help"], 60, DISTBENCH_BACKENDS="no_such_module_here")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "distbench: error: DISTBENCH_BACKENDS names no_such_module_here, which cannot be imported "
        "(ModuleNotFoundError: No module named 'no_such_module_here'); fix the module or the variable"
    ]
