"""The built-in workloads learn with the defaults they declare, in a short run (what `compare --workload W`
uses): one epoch in-process on the single backend, through the real `distbench run`. The slow two (cnn,
transformer, ~10 s each) are checked under real launchers in tests/integration/test_compare.py."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import catalog, cli
from tests.helpers import BARS


def test_every_builtin_workload_has_a_bar() -> None:
    assert set(BARS) == set(catalog.REGISTRY)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["linear", "mlp"])
def test_workload_defaults_learn_in_one_epoch(tmp_path, name: str) -> None:
    argv = ["run", "--backend", "single", "--workload", name, "--epochs", "1", "--quiet", "--out", str(tmp_path)]
    assert cli.main([*argv, "--run-id", "r"]) == 0
    loss = pd.read_csv(tmp_path / "r" / "loss.csv")
    column, bar = BARS[name]
    last = loss[loss.split == "val"].iloc[-1][column]
    assert last < bar if column == "loss" else last > bar, f"{name}: validation {column} {last} vs {bar}"
