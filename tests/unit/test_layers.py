"""The import layering (pyproject.toml's import-linter contracts) holds: no cycle, no import up a layer,
between the packages and inside `benchmarks.analysis` and `benchmarks.run`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = (
    "cli > suite > analysis > run > backends > leaves",
    "analysis: report > sections > tables > loaders > check > rundir",
    "run: harness > trainer > validation > workloads > recorder > guard",
)


def test_the_contracts_are_the_ones_pyproject_declares() -> None:
    declared = re.findall(r'^name = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)[1:]
    assert tuple(declared) == CONTRACTS  # the first `name` is the distribution's


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_imports_run_one_way() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports is missing: pip install -e '.[dev]' (make setup installs it)"
    proc = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in proc.stdout, proc.stdout[-2000:]
    kept = " ".join(proc.stdout.split())  # a long name wraps in lint-imports' output
    for name in CONTRACTS:
        assert f"{name} KEPT" in kept, proc.stdout[-2000:]
