"""Reports: statistics against hand-computed values, bootstrap coverage, report files, the notebook."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.analysis import load, report, stats, tables, terminal
from tests.helpers import REPO, make_run


def test_per_run_statistics_match_hand_computed_values(tmp_path) -> None:
    # Two ranks, 5 steps, the first is warm-up. Slowest rank per timed step: 0.2, 0.4, 0.3, 0.5.
    make_run(tmp_path, "a", "ddp", [[9.0, 0.2, 0.1, 0.3, 0.5], [9.0, 0.1, 0.4, 0.2, 0.1]], wall=2.0)
    row = tables.per_run_stats(load.load_runs(tmp_path)).iloc[0]
    assert row.samples_per_s == pytest.approx(4 * 2 * 10 / 2.0)  # timed samples of both ranks ÷ wall
    assert row.step_p50_s == pytest.approx(0.35)  # median of 0.2, 0.3, 0.4, 0.5
    assert row.step_p90_s == pytest.approx(0.47)  # linear interpolation: 0.4 + 0.7 × 0.1
    assert row.step_p99_s == pytest.approx(0.497)
    assert row.rank_skew == pytest.approx(1.1 / 0.8)  # rank 0 sums 1.1 s, rank 1 0.8 s


def test_log_ci_matches_student_t_on_logs() -> None:
    centre, lo, hi = stats.log_ci([np.e, np.e**2, np.e**3])  # logs 1, 2, 3
    half = 4.302652729911275 / np.sqrt(3)  # t(0.975, 2) × s/√n with s = 1
    assert (centre, lo, hi) == pytest.approx((np.e**2, np.exp(2.0 - half), np.exp(2.0 + half)))


def _repeats(tmp_path: Path, walls: dict[str, list[float]]) -> report.RunSet:
    for backend, values in walls.items():
        for i, wall in enumerate(values):
            make_run(tmp_path, f"{backend}-r{i}", backend, [[1.0, 0.1, 0.1]], wall=wall)
    return load.load_runs(tmp_path)


def test_clear_difference_is_called(tmp_path) -> None:
    # 2 timed steps × 10 samples: throughput 20/wall. ddp 100/s-ish, horovod 150/s-ish.
    rs = _repeats(tmp_path, {"ddp": [0.2, 0.2 / 1.02, 0.2 / 0.98], "horovod": [0.2 / 1.5, 0.2 / 1.52, 0.2 / 1.48]})
    table = tables.backend_table(tables.per_run_stats(rs)).set_index("backend")
    assert table.loc["ddp", "samples_per_s"] == pytest.approx(100.0, rel=1e-3)  # the geometric mean
    assert table.loc["horovod", "ratio"] == pytest.approx(1.5, rel=1e-3)
    assert table.loc["horovod", "ratio_low"] > 1.0
    text = terminal.format_table(table.reset_index(), 0.0)
    assert "horovod is 1.50× ddp" in text


def test_no_difference_is_called(tmp_path) -> None:
    rs = _repeats(tmp_path, {"ddp": [0.2, 0.2 / 1.1, 0.2 / 0.9], "horovod": [0.2 / 1.01, 0.2 / 0.95, 0.2 / 1.08]})
    table = tables.backend_table(tables.per_run_stats(rs))
    assert "no significant difference between horovod and ddp" in terminal.format_table(table, 0.0)


@pytest.mark.parametrize("n", [3, 12])
def test_ratio_ci_covers_the_true_ratio(n: int) -> None:
    rng = np.random.default_rng(n)
    covered = 0
    trials = 400
    for _ in range(trials):
        a, b = 200 * rng.lognormal(0, 0.1, n), 100 * rng.lognormal(0, 0.2, n)  # true ratio of geometric means 2
        _, lo, hi = stats.ratio_ci(a, b)
        covered += lo <= 2.0 <= hi
    assert 0.92 <= covered / trials <= 0.98, covered / trials


def test_scaling_measures_each_variant_against_its_own_one_rank_runs_and_single(tmp_path) -> None:
    one, two = [[1.0, 0.1, 0.1]], [[1.0, 0.1, 0.1], [1.0, 0.1, 0.1]]  # 20 and 40 timed samples
    make_run(tmp_path, "s1", "single", one, wall=0.1)  # 200/s: the single-process baseline, never a variant's own
    make_run(tmp_path, "d1", "ddp", one, wall=0.2)  # 100/s
    make_run(tmp_path, "d2", "ddp", two, wall=40 / 180)  # 180/s
    make_run(tmp_path, "h1", "horovod", one, wall=0.4)  # 50/s
    make_run(tmp_path, "h2", "horovod", two, wall=40 / 95)  # 95/s
    table = tables.scaling(tables.per_run_stats(load.load_runs(tmp_path))).set_index(["backend", "world_size"])
    assert table.loc[("ddp", 2), "speedup"] == pytest.approx(1.8)
    assert table.loc[("ddp", 2), "efficiency"] == pytest.approx(0.9)  # 180 / (2 × 100)
    assert table.loc[("ddp", 2), "vs_single"] == pytest.approx(180 / (2 * 200))
    assert table.loc[("horovod", 2), "speedup"] == pytest.approx(1.9)
    assert table.loc[("horovod", 1), "efficiency"] == pytest.approx(1.0)
    assert "single" not in table.index.get_level_values("backend")  # a baseline, not a curve
    assert "no interval" in table.loc[("ddp", 2), "note"]  # one run each: a speed-up without a CI
    assert set(table.variant) == {"ddp@torchrun", "horovod@torchrun"}  # make_run's launcher


def test_loss_agreement(tmp_path) -> None:
    make_run(tmp_path, "a", "ddp", [[1.0, 0.1, 0.1]], wall=1.0, losses=[1.0, 0.8, 0.6])
    make_run(tmp_path, "b", "horovod", [[1.0, 0.1, 0.1]], wall=1.0, losses=[1.0, 0.85, 0.6])
    assert tables.loss_agreement(load.load_runs(tmp_path)).train == pytest.approx(0.05)


def test_unknown_schema_version_is_refused(tmp_path) -> None:
    run = make_run(tmp_path, "a", "ddp", [[1.0, 0.1]], wall=1.0)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "schema_version": 99}))
    with pytest.raises(load.SchemaError, match="schema_version 99"):
        load.load_runs(tmp_path)


def test_report_files_embed_their_images(tmp_path) -> None:
    _repeats(tmp_path / "runs", {"ddp": [0.2, 0.21], "horovod": [0.3, 0.31]})
    summary = report.write([tmp_path / "runs"], tmp_path / "out", {"md", "html"})
    assert "ddp" in summary and "horovod" in summary
    pngs = sorted((tmp_path / "out").glob("*.png"))
    assert {p.stem for p in pngs} >= {"throughput", "step_times", "loss_curves", "phases"}
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(pngs)
    for png in pngs:
        assert base64.b64encode(png.read_bytes()).decode()[:200] in html
    md = (tmp_path / "out" / "report.md").read_text()
    assert all(f"]({p.name})" in md for p in pngs)


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_report_command_on_the_reference_comparison(tmp_path) -> None:
    from tests.helpers import BIN, run_ok

    proc = run_ok(
        [
            str(BIN / "distbench"),
            "report",
            str(REPO / "results/reference/2026-12-01-cpu-2core"),
            "--out",
            str(tmp_path),
            "--format",
            "html",
        ]
    )
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path)
    assert "samples/s" in proc.stdout and (tmp_path / "report.html").is_file()
    assert not (tmp_path / "report.md").exists()


def test_scaling_plot_ticks_are_whole_world_sizes() -> None:
    import pandas as pd

    from benchmarks.analysis import figures

    table = pd.DataFrame(
        {
            "variant": ["ddp@torchrun"] * 3,
            "world_size": [1, 2, 4],
            "efficiency": [1.0, 0.9, 0.7],
            "samples_per_s": [100.0, 180.0, 280.0],
            "oversubscribed": [False, False, True],
        }
    )
    fig = figures.scaling_figure(table)
    for ax in fig.axes:  # throughput and efficiency
        assert list(ax.get_xticks()) == [1, 2, 4]  # matplotlib alone would tick 1.0, 1.5, 2.0, …
    hollow = [line for line in fig.axes[1].lines if line.get_markerfacecolor() == "white"]
    assert [list(line.get_xdata()) for line in hollow] == [[4]]  # the oversubscribed point is marked
