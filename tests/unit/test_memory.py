"""Peak memory per rank: the meter responds to a known allocation, summary.csv's memory columns (schema 3),
their check, and the loaders' NaN for older schemas. In-process; the meter's fallback in a fresh process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.analysis import check, load, tables
from benchmarks.run import memory
from benchmarks.run import recorder as results
from tests.helpers import config, fit, single_backend
from tests.integration.ballast_workload import BALLAST_MB

CPU = torch.device("cpu")
# The measure must see the allocation and little else: a few MiB of allocator and interpreter noise.
TOLERANCE_MB = 40


def fill(mb: int) -> None:
    """Write every page of `mb` MiB, then free it: only a high-water mark still sees it."""
    filled = torch.ones(mb * memory.MIB // 4, dtype=torch.float32)
    del filled


needs_reset = pytest.mark.skipif(not memory.reset_peak_rss(), reason="this kernel cannot reset VmHWM")


@needs_reset
def test_the_meter_sees_an_allocation_made_after_it_started() -> None:
    meter = memory.Meter(CPU)
    fill(BALLAST_MB)
    reading = meter.read()
    assert reading["peak_rss_from"] == results.PEAK_FROM_MODEL_BUILD
    assert abs(reading["training_rss_mb"] - BALLAST_MB) < TOLERANCE_MB, reading
    assert reading["peak_rss_mb"] == pytest.approx(reading["rss_before_model_mb"] + reading["training_rss_mb"])
    assert reading["cuda_max_allocated_mb"] is reading["cuda_max_reserved_mb"] is None


@needs_reset
def test_the_reset_leaves_out_a_peak_from_before_the_model() -> None:
    fill(2 * BALLAST_MB)  # a transient before the meter starts, e.g. loading the data
    reading = memory.Meter(CPU).read()
    assert reading["training_rss_mb"] < TOLERANCE_MB, reading


def _without_reset(queue: mp.Queue) -> None:
    """A fresh process (its lifetime peak is its own): the fallback, a peak before the meter, then one after."""
    fill(2 * BALLAST_MB)
    early = memory.Meter(CPU, reset=False).read()
    meter = memory.Meter(CPU, reset=False)
    fill(3 * BALLAST_MB)
    queue.put((early, meter.read()))


@pytest.mark.processes
@pytest.mark.timeout(90)
def test_without_a_reset_the_peak_is_the_lifetime_one_and_says_so() -> None:
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_without_reset, args=(queue,))
    process.start()
    early, late = queue.get(timeout=60)
    process.join(timeout=30)
    assert early["peak_rss_from"] == late["peak_rss_from"] == results.PEAK_FROM_PROCESS_START
    # Counted although it came before the meter started: what `peak_rss_from` warns of.
    assert early["training_rss_mb"] > 2 * BALLAST_MB - TOLERANCE_MB, early
    assert abs(late["training_rss_mb"] - 3 * BALLAST_MB) < TOLERANCE_MB, late


def test_on_cuda_the_peaks_come_from_a_reset_when_the_meter_starts(monkeypatch) -> None:
    """No GPU needed: torch.cuda's counters stood in for, to show what is reset when and read in MiB."""
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(f"reset {device}"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: calls.append("allocated") or 300 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: calls.append("reserved") or 512 * 2**20)
    meter = memory.Meter(torch.device("cuda", 1))
    assert calls == ["reset cuda:1"]
    reading = meter.read()
    assert (reading["cuda_max_allocated_mb"], reading["cuda_max_reserved_mb"]) == (300.0, 512.0)
    assert calls == ["reset cuda:1", "allocated", "reserved"]


# --- summary.csv --------------------------------------------------------------------------------

META = {"run_id": "r", "backend": "ddp", "world_size": 2, "workload": "mlp", "global_batch": 64}
RANKS = [
    {
        "rss_before_model_mb": 200.0,
        "peak_rss_mb": 520.0,
        "training_rss_mb": 320.0,
        "peak_rss_from": "model_build",
        "cuda_max_allocated_mb": None,
        "cuda_max_reserved_mb": None,
    },
    {
        "rss_before_model_mb": 190.0,
        "peak_rss_mb": 500.0,
        "training_rss_mb": 310.0,
        "peak_rss_from": "model_build",
        "cuda_max_allocated_mb": None,
        "cuda_max_reserved_mb": None,
    },
]


def test_summary_takes_the_range_over_ranks() -> None:
    row = results.summary_row(META, [0.01, 0.02], 128, {}, 0.05, [], RANKS)
    assert list(row) == list(results.SUMMARY_COLUMNS)
    schema_3 = results.SUMMARY_COLUMNS_OF[3]  # appended at the end of schema 2's header
    assert schema_3 == results.SUMMARY_COLUMNS_OF[2] + results.MEMORY_COLUMNS
    assert (row["peak_rss_mb_min"], row["peak_rss_mb_max"]) == (500.0, 520.0)
    assert (row["training_rss_mb_min"], row["training_rss_mb_max"]) == (310.0, 320.0)
    assert (row["rss_before_model_mb_min"], row["rss_before_model_mb_max"]) == (190.0, 200.0)
    assert row["peak_rss_from"] == "model_build"
    assert row["cuda_max_allocated_mb_max"] is row["cuda_max_reserved_mb_min"] is None
    lifetime = [RANKS[0], {**RANKS[1], "peak_rss_from": "process_start"}]  # one rank could not reset
    assert results.summary_row(META, [0.01], 64, {}, 0.05, [], lifetime)["peak_rss_from"] == "process_start"
    assert results.summary_row(META, [0.01], 64, {}, 0.05)["peak_rss_mb_max"] is None  # no reading: empty


@pytest.fixture(scope="module")
def ballast_run(tmp_path_factory) -> Path:
    """A real single-process run of the ballast workload: BALLAST_MB MiB filled in every training forward."""
    run_dir = tmp_path_factory.mktemp("ballast") / "run"
    cfg = config(
        workload="tests.integration.ballast_workload:ballast",
        epochs=1,
        steps_per_epoch=6,
        batch_size=16,
        warmup_steps=1,
        compute_baseline_steps=2,
    )
    fit(single_backend(cfg), cfg, run_dir)
    meta = json.loads((run_dir / results.RUN_JSON).read_text())  # what the harness adds to the Trainer's
    (run_dir / results.RUN_JSON).write_text(json.dumps({**meta, "launcher": "python"}))
    return run_dir


@needs_reset
def test_a_run_records_the_ballast_in_summary_and_run_json(ballast_run: Path) -> None:
    summary = pd.read_csv(ballast_run / results.SUMMARY_CSV).iloc[0]
    assert summary["training_rss_mb_max"] > BALLAST_MB - TOLERANCE_MB, summary.to_dict()
    assert pd.isna(summary["cuda_max_allocated_mb_max"])
    meta = json.loads((ballast_run / results.RUN_JSON).read_text())
    [rank0] = meta["memory"]["per_rank"]
    assert rank0["rank"] == 0 and rank0["peak_rss_mb"] == summary["peak_rss_mb_max"]
    assert not check.check_run(ballast_run)


def test_check_catches_a_memory_range_upside_down(ballast_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(ballast_run, run_dir)
    summary = pd.read_csv(run_dir / results.SUMMARY_CSV)
    summary.loc[0, "peak_rss_mb_min"] = summary.loc[0, "peak_rss_mb_max"] + 1
    summary.loc[0, "peak_rss_from"] = "yesterday"
    summary.to_csv(run_dir / results.SUMMARY_CSV, index=False)
    found = [str(p) for p in check.check_run(run_dir)]
    assert any("peak_rss_mb_min" in p for p in found) and any("yesterday" in p for p in found), found


def as_schema_2(run_dir: Path) -> None:
    summary = pd.read_csv(run_dir / results.SUMMARY_CSV)
    summary[list(results.SUMMARY_COLUMNS_OF[2])].to_csv(run_dir / results.SUMMARY_CSV, index=False)
    loss = pd.read_csv(run_dir / results.LOSS_CSV)  # schema 2's loss.csv ended at `samples`
    loss[list(loss.columns[: loss.columns.get_loc("samples") + 1])].to_csv(run_dir / results.LOSS_CSV, index=False)
    meta = json.loads((run_dir / results.RUN_JSON).read_text())
    meta.pop("memory")
    (run_dir / results.RUN_JSON).write_text(json.dumps({**meta, "schema_version": 2}))


def test_schema_2_passes_check_and_loads_with_nan_memory(ballast_run: Path, tmp_path: Path) -> None:
    old = tmp_path / "old" / "run"
    shutil.copytree(ballast_run, old)
    as_schema_2(old)
    assert not check.check_run(old)
    new = tmp_path / "new" / "run"
    shutil.copytree(ballast_run, new)
    per_run = tables.per_run_stats(load.load_runs(old, new)).set_index("run_key")
    assert set(results.MEMORY_COLUMNS) <= set(per_run.columns)
    assert per_run.loc[str(old), list(load.MEMORY_COLUMNS)].isna().all()
    assert per_run.loc[str(new), "peak_rss_mb_max"] == pd.read_csv(new / results.SUMMARY_CSV)["peak_rss_mb_max"][0]
    assert np.isnan(per_run.loc[str(new), "cuda_max_reserved_mb_max"])
