"""The report: validation compared across backends and a difference explained by the knob behind it; a report that
opens with the decision, says what was compared and where a failed backend's error is."""

from __future__ import annotations

import pytest

from benchmarks.analysis import context, load, report, tables, terminal
from tests.helpers import DDP, HOROVOD, ONE_RANK, make_run


def test_validation_difference_is_shown_and_the_knob_named(tmp_path) -> None:
    # Train curves identical, validation not: BatchNorm buffers broadcast by DDP but not by Horovod.
    make_run(tmp_path, "ddp-r0", "ddp", ONE_RANK, wall=1.0, losses=[1.0, 0.8, 0.6], val=[0.7], meta=DDP)
    make_run(tmp_path, "horovod-r0", "horovod", ONE_RANK, wall=1.0, losses=[1.0, 0.8, 0.6], val=[0.75], meta=HOROVOD)
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert agreement.train == 0.0 and agreement.val == pytest.approx(0.05)
    assert "broadcast_buffers" in agreement.explanation and "--no-broadcast-buffers" in agreement.explanation
    text = terminal.format_table(tables.backend_table(tables.per_run_stats(load.load_runs(tmp_path))), agreement)
    assert "train 0.00e+00, validation 5.00e-02" in text and "--no-broadcast-buffers for parity" in text


def test_equal_validation_needs_no_explanation(tmp_path) -> None:
    make_run(tmp_path, "ddp-r0", "ddp", ONE_RANK, wall=1.0, val=[0.7], meta=DDP)
    make_run(tmp_path, "horovod-r0", "horovod", ONE_RANK, wall=1.0, val=[0.7], meta=HOROVOD)
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert (agreement.train, agreement.val, agreement.explanation) == (0.0, 0.0, "")


def test_report_opens_with_the_decision_then_what_was_compared(tmp_path) -> None:
    make_run(tmp_path / "c", "ddp-r0", "ddp", ONE_RANK, wall=1.0, meta=DDP)
    make_run(tmp_path / "c", "horovod-r0", "horovod", ONE_RANK, wall=1.0, meta=HOROVOD)
    summary = report.write([tmp_path / "c"], tmp_path / "out", {"md", "html"})
    head = "Decision (unresolved): synthetic, global batch 10, 1 ranks: ddp@torchrun ahead on these runs, not resolved"
    assert summary.startswith(head)
    compared = "compared: synthetic (1234 parameters), global batch 10 (10 per rank × accumulate 1)"
    assert summary.index(compared) < summary.index("backend ")  # then what was compared, then the table
    md = (tmp_path / "out" / "report.md").read_text()
    order = (
        "## Decision",
        "## Summary",
        "## Per backend",
        "## What was compared",
        "## Backends",
        "## Knobs",
        "## Per run",
    )
    assert [md.index(title) for title in order] == sorted(md.index(title) for title in order)
    assert (tmp_path / "out" / "decision.json").is_file()
    knobs = md[md.index("## Knobs and options") : md.index("## Per run")]
    for line in (
        "| knob broadcast-buffers | True | False |",
        "| knob bucket-cap-mb | 25 | — |",
        "| knob fusion-threshold-mb | — | 128 |",
    ):
        assert line in knobs
    assert "--lr" not in knobs and "--out" not in knobs  # equal options, and where runs were written, are not knobs
    backends = md[md.index("## Backends") : md.index("## Knobs")]
    assert "| launcher | torchrun | horovodrun |" in backends and "| controller | — | gloo |" in backends
    assert "| horovod | — | 0.28 |" in backends
    assert "What was compared" in (tmp_path / "out" / "report.html").read_text()


def test_failed_backend_points_at_its_run_json_error(tmp_path) -> None:
    make_run(tmp_path, "ddp-r0", "ddp", ONE_RANK, wall=1.0)
    failed = make_run(tmp_path, "horovod-r0", "horovod", ONE_RANK, wall=1.0, status="failed")
    summary = report.write([tmp_path], tmp_path / "out", {"md"})
    line = next(li for li in summary.splitlines() if li.startswith("horovod"))
    assert "0/1" in line and f"FAILED: {failed}/run.json: horovod exploded" in line
    assert "--include-failed" not in summary


def test_runs_of_one_variant_with_different_knobs_are_flagged_not_pooled_silently(tmp_path) -> None:
    """A tune directory holds one variant at several settings: report says its interval would pool them."""
    for i, bucket in enumerate((1.0, 1.0, 25.0)):
        meta = {
            **DDP,
            "knobs": {**DDP["knobs"], "bucket_cap_mb": bucket},
            "config": {**DDP["config"], "bucket_cap_mb": bucket},
        }
        make_run(tmp_path, f"ddp-p{i}", "ddp", ONE_RANK, wall=1.0, meta=meta)
    (warning,) = context.pooled_settings(load.load_runs(tmp_path))
    assert warning.startswith("warning: ddp@torchrun (synthetic") and "differ in --bucket-cap-mb," in warning
    same = tmp_path / "same"
    for i in range(2):
        make_run(same, f"ddp-r{i}", "ddp", ONE_RANK, wall=1.0, meta=DDP)
    assert context.pooled_settings(load.load_runs(same)) == []
