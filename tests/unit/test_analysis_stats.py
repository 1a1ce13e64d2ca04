"""Statistics' guards: no interval from fewer than 3 runs, no negative bound, warnings for short runs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.analysis import load, report, stats, tables, terminal
from tests.helpers import make_run

ONE_RANK = [[1.0, 0.1, 0.1]]  # warm-up then 2 timed steps of 10 samples: 20 samples ÷ wall


def _table(tmp_path, walls: dict[str, list[float]]):
    for backend, values in walls.items():
        for i, wall in enumerate(values):
            make_run(tmp_path, f"{backend}-r{i}", backend, ONE_RANK, wall=wall)
    return tables.backend_table(tables.per_run_stats(load.load_runs(tmp_path)))


def test_two_repeats_give_no_interval_and_say_why(tmp_path) -> None:
    table = _table(tmp_path, {"ddp": [0.01, 0.2], "horovod": [0.02, 0.3]}).set_index("backend")
    assert np.isnan(table.loc["ddp", "ci_low"]) and np.isnan(table.loc["ddp", "ci_high"])
    assert np.isnan(table.loc["horovod", "ratio_low"])  # no bootstrap "CI" over two values
    assert table.loc["ddp", "interval"] == "2 runs: no interval (needs ≥ 3)"
    text = terminal.format_table(table.reset_index(), 0.0)
    assert "±" not in text and "no CI" in text and "too few runs to call a difference" in text


def test_one_repeat_prints_no_degenerate_interval(tmp_path) -> None:
    text = terminal.format_table(_table(tmp_path, {"ddp": [0.2], "horovod": [0.3]}), 0.0)
    assert "± 0.0" not in text and "(0.67–0.67)" not in text
    assert "0.67 (no CI" in text


def test_throughput_bounds_are_positive_however_wild_the_repeats(tmp_path) -> None:
    # 20/s, 20/s, 2000/s: a Student-t interval on the raw values reaches far below zero.
    table = _table(tmp_path, {"ddp": [1.0, 1.0, 0.01]}).iloc[0]
    assert 0 < table.ci_low < table.samples_per_s < table.ci_high
    assert stats.log_ci([20.0, 20.0, 2000.0])[1] > 0


def test_short_runs_are_flagged_in_table_and_report(tmp_path) -> None:
    make_run(tmp_path / "short", "s", "ddp", ONE_RANK, wall=0.2)  # 2 timed steps, 0.2 s
    make_run(tmp_path / "long", "l", "ddp", [[1.0] + [0.15] * 25], wall=3.75)  # 25 timed steps, 3.75 s
    per_run = tables.per_run_stats(load.load_runs(tmp_path)).set_index("run_id")
    assert per_run.loc["s", "warning"] == "2 timed steps (< 20); timed window 0.2 s (< 2 s)"
    assert per_run.loc["l", "warning"] == "" and per_run.loc["l", "timed_steps"] == 25
    summary = report.write([tmp_path / "short"], tmp_path / "out", {"md"})
    assert "warning: ddp: 1 of 1 runs short: 2 timed steps (< 20)" in summary
    assert "2 timed steps (< 20)" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("n", [1, 2])
def test_ratio_ci_gives_no_interval_below_three(n: int) -> None:
    ratio, lo, hi = stats.ratio_ci([2.0, 2.2, 1.8][:n], [1.0, 1.1, 0.9])
    assert ratio == pytest.approx(np.exp(np.mean(np.log([2.0, 2.2, 1.8][:n])) - np.mean(np.log([1.0, 1.1, 0.9]))))
    assert np.isnan(lo) and np.isnan(hi)
