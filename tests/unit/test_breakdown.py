"""Where a step's time goes: the compute baseline, summary.csv's breakdown columns and their check,
and the Horovod timeline reader. In-process, on the real single-process backend."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks.analysis import check, timeline
from benchmarks.run import harness
from benchmarks.run import recorder as results
from tests.helpers import config, fit, single_backend

META = {"run_id": "r", "backend": "ddp", "world_size": 2, "workload": "mlp", "global_batch": 64}


def test_breakdown_columns_by_hand() -> None:
    # Medians: one slow step of each kind does not move them.
    row = results.summary_row(META, [0.010, 0.020, 0.030, 0.900], 256, {}, 1.0, [0.004, 0.006, 0.008, 0.500])
    assert row["step_p50_s"] == pytest.approx(0.025)
    assert row["compute_s"] == pytest.approx(0.007)
    assert row["exposed_comm_s"] == pytest.approx(0.018)
    assert row["exposed_comm_share"] == pytest.approx(0.72)
    assert list(row) == list(results.SUMMARY_COLUMNS)


def test_without_a_baseline_the_breakdown_is_empty_not_zero() -> None:
    row = results.summary_row(META, [0.010, 0.030], 128, {}, 0.05, [])
    assert row["step_p50_s"] == pytest.approx(0.020)
    assert row["compute_s"] is row["exposed_comm_s"] is row["exposed_comm_share"] is None


def single_run_in(run_dir: Path) -> Path:
    """A real single-process run of 30 timed steps with a 20-step compute baseline."""
    cfg = config(
        workload="mlp", epochs=1, steps_per_epoch=35, batch_size=16, train_size=1024, compute_baseline_steps=20
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the harness sets it: idle intra-op threads spinning on a busy machine are noise
    try:
        fit(single_backend(cfg), cfg, run_dir)
    finally:
        torch.set_num_threads(threads)
    meta = json.loads((run_dir / results.RUN_JSON).read_text())  # what the harness adds to the Trainer's
    (run_dir / results.RUN_JSON).write_text(json.dumps({**meta, "launcher": "python"}))
    return run_dir


@pytest.fixture(scope="module")
def single_run(tmp_path_factory) -> Path:
    return single_run_in(tmp_path_factory.mktemp("single") / "run")


def test_single_exposes_no_communication(single_run: Path) -> None:
    """`single` has no gradient communication: its backend reduces nothing (its collectives are the identity, no
    process group), it sends no gradient bytes, its baseline is a plain copy, and the breakdown is the step less
    that compute. Asserted without
    a timing: a share of exposed time near 0 is noise-bound (it failed 2 of 8 fast-tier runs on a busy machine)."""
    backend = single_backend(config())
    tensor = torch.ones(3)
    assert backend.all_reduce(tensor) is tensor and backend.all_gather_object("x") == ["x"]
    assert backend.baseline_is_plain  # its compute baseline is the same model, stepped the same way
    assert harness.gradient_bytes([torch.nn.Parameter(torch.ones(4))], config(), "single") == 0
    row = pd.read_csv(single_run / results.SUMMARY_CSV).iloc[0]
    assert row["compute_s"] > 0 and row["step_p50_s"] > 0
    assert row["exposed_comm_s"] == pytest.approx(row["step_p50_s"] - row["compute_s"])
    assert not check.check_run(single_run)


def test_check_catches_a_breakdown_that_does_not_add_up(single_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(single_run, run_dir)
    summary = pd.read_csv(run_dir / results.SUMMARY_CSV)
    summary.loc[0, "exposed_comm_s"] += 0.001
    summary.to_csv(run_dir / results.SUMMARY_CSV, index=False)
    assert any("exposed_comm_s is not step_p50_s − compute_s" in str(p) for p in check.check_run(run_dir))


def test_a_schema_1_run_still_passes_check(single_run: Path, tmp_path: Path) -> None:
    """Runs written before the breakdown existed keep passing: their header is version 1's."""
    run_dir = tmp_path / "run"
    shutil.copytree(single_run, run_dir)
    summary = pd.read_csv(run_dir / results.SUMMARY_CSV)
    summary[list(results.SUMMARY_COLUMNS_OF[1])].to_csv(run_dir / results.SUMMARY_CSV, index=False)
    loss = pd.read_csv(run_dir / results.LOSS_CSV)  # and loss.csv ends at `samples` before schema 4
    loss[list(results.LOSS_COLUMNS_OF[1])].to_csv(run_dir / results.LOSS_CSV, index=False)
    meta = json.loads((run_dir / results.RUN_JSON).read_text())
    (run_dir / results.RUN_JSON).write_text(json.dumps({**meta, "schema_version": 1}))
    assert not check.check_run(run_dir)
    meta["schema_version"] = 2  # the same file claimed as version 2 lacks columns
    (run_dir / results.RUN_JSON).write_text(json.dumps(meta))
    assert any("header differs" in str(p) for p in check.check_run(run_dir))


def _events(*spans: tuple[int, str, int, int]) -> list[dict]:
    events = []
    for pid, name, begin, end in spans:
        events += [{"ph": "B", "name": name, "ts": begin, "pid": pid}, {"ph": "E", "ts": end, "pid": pid}]
    return events


def test_timeline_measures_wall_time_not_a_sum_over_fused_tensors(tmp_path: Path) -> None:
    # Two tensors fused into one allreduce: negotiation 0–100 and 50–150 µs; both queued until 200;
    # one ALLREDUCE 200–1200 holding GLOO_ALLREDUCE 300–1100 for both.
    events = []
    for pid, negotiate_start in ((1, 0), (2, 50)):
        events += _events((pid, "NEGOTIATE_ALLREDUCE", negotiate_start, negotiate_start + 100))
        events += [{"ph": "B", "name": "ALLREDUCE", "ts": 200, "pid": pid}]
        events += _events((pid, "MEMCPY_IN_FUSION_BUFFER", 200, 300), (pid, "GLOO_ALLREDUCE", 300, 1100))
        events += [{"ph": "E", "ts": 1200, "pid": pid}]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events))
    per_step = timeline.summarize(path, steps=2)
    assert per_step == pytest.approx(
        {"negotiation": 0.075, "queue": 0.05, "memcpy": 0.05, "communication": 0.4, "allreduce": 0.5}
    )
    # Horovod leaves the file open while it writes: a cut-off file is read up to its last whole event.
    path.write_text(json.dumps(events)[:-1] + ',\n{"ph": "B", "na')
    assert timeline.summarize(path, steps=2)["communication"] == pytest.approx(0.4)
