"""Loading results: unique run keys across comparisons, nested directories, no mixed ratios,
scaling against each backend's own baseline."""

from __future__ import annotations

import pytest

from benchmarks.analysis import load, report, tables, terminal
from benchmarks.cli import main
from tests.helpers import make_run

ONE_RANK, TWO_RANKS = [[1.0, 0.1, 0.1]], [[1.0, 0.1, 0.1], [1.0, 0.1, 0.1]]


def _comparison(root, walls: dict[str, float], step_s=ONE_RANK, **kw) -> None:
    for backend, wall in walls.items():
        make_run(root, f"{backend}-r0", backend, step_s, wall=wall, **kw)


def test_runs_of_two_comparisons_load_report_and_check(tmp_path, capsys) -> None:
    runs = tmp_path / "results" / "runs"
    _comparison(runs / "A", {"ddp": 0.2, "horovod": 0.3})
    _comparison(runs / "B", {"ddp": 0.25, "horovod": 0.35})  # the same run ids: ddp-r0, horovod-r0
    rs = load.load_runs(runs / "A", runs / "B")
    assert len(rs.runs) == 4 and rs.runs.run_key.is_unique
    assert set(rs.runs.run_key) == {str(runs / c / f"{b}-r0") for c in "AB" for b in ("ddp", "horovod")}
    assert set(rs.timing.run_key) == set(rs.runs.run_key) and set(rs.loss.run_key) == set(rs.runs.run_key)
    per_run = tables.per_run_stats(rs).set_index("run_key")
    assert per_run.loc[str(runs / "B" / "ddp-r0"), "samples_per_s"] == pytest.approx(20 / 0.25)
    # a tree of comparisons, a glob of them, and check, all descend
    assert len(load.load_runs(tmp_path / "results").runs) == 4
    assert len(load.load_runs(str(runs / "*")).runs) == 4
    summary = report.write([tmp_path / "results"], tmp_path / "out", {"md"})
    assert "ddp            2/0" in summary
    assert main(["check", str(tmp_path / "results")]) == 0
    assert "4 of 4 runs pass" in capsys.readouterr().out


def test_different_setups_are_never_in_one_ratio(tmp_path) -> None:
    _comparison(tmp_path / "two-ranks", {"ddp": 0.2, "horovod": 0.4}, step_s=TWO_RANKS)  # 200/s vs 100/s
    _comparison(tmp_path / "one-rank", {"horovod": 0.4, "ddp": 0.2})  # 50/s vs 100/s
    _comparison(tmp_path / "big-batch", {"ddp": 0.2}, samples=40)  # global batch 40
    table = tables.backend_table(tables.per_run_stats(load.load_runs(tmp_path)))
    by = table.set_index(["world_size", "global_batch", "backend"])
    assert by.loc[(2, 20, "horovod"), "ratio"] == pytest.approx(0.5)  # against ddp at 2 ranks only
    assert by.loc[(1, 10, "horovod"), "ratio"] == pytest.approx(0.5)  # against ddp at 1 rank, not 2
    assert by.loc[(1, 40, "ddp"), "ratio"] == 1.0  # alone in its setup: its own base
    text = terminal.format_table(table, 0.0)
    assert text.count("backend    ok/fail") == 3 and "synthetic · global batch 40 · 1 rank(s)" in text
