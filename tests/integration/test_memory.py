"""Peak memory per rank under a real 2-rank torchrun DDP job: summary.csv's memory columns are there, every
rank is in run.json, and a known allocation inside each rank (the ballast workload) moves the numbers by it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.analysis import check
from benchmarks.run import recorder as results
from tests.helpers import run_ok, torchrun
from tests.integration.ballast_workload import BALLAST_MB

ARGS = [
    "run",
    "--backend",
    "ddp",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "6",
    "--warmup-steps",
    "1",
    "--batch-size",
    "16",
    "--compute-baseline-steps",
    "2",
    "--quiet",
]


@pytest.mark.timeout(300)
def test_two_ranks_record_memory_and_see_a_known_allocation(tmp_path) -> None:
    summaries = {}
    for run_id, workload in (("plain", "mlp"), ("ballast", "tests.integration.ballast_workload:ballast")):
        run_ok([*torchrun(2), *ARGS, "--workload", workload, "--out", str(tmp_path), "--run-id", run_id], timeout=180)
        run_dir = tmp_path / run_id
        assert not check.check_run(run_dir)
        summary = pd.read_csv(run_dir / results.SUMMARY_CSV)
        assert tuple(summary.columns) == results.SUMMARY_COLUMNS
        summaries[run_id] = summary.iloc[0]
        meta = json.loads((run_dir / results.RUN_JSON).read_text())
        assert meta["schema_version"] == results.SCHEMA_VERSION
        per_rank = meta["memory"]["per_rank"]
        assert [m["rank"] for m in per_rank] == [0, 1]
        assert summaries[run_id]["peak_rss_mb_max"] == max(m["peak_rss_mb"] for m in per_rank)
        assert summaries[run_id]["peak_rss_mb_min"] == min(m["peak_rss_mb"] for m in per_rank)
        assert summaries[run_id]["rss_before_model_mb_min"] > 0
        assert pd.isna(summaries[run_id]["cuda_max_allocated_mb_max"])  # CPU: the CUDA columns are empty
    plain, ballast = summaries["plain"], summaries["ballast"]
    if plain["peak_rss_from"] != results.PEAK_FROM_MODEL_BUILD:
        pytest.skip("this kernel cannot reset VmHWM: the lifetime peak includes start-up")
    # Every rank, not just one: the smallest rank's training share rises by the ballast, and by little else.
    extra = ballast["training_rss_mb_min"] - plain["training_rss_mb_max"]
    assert abs(extra - BALLAST_MB) < 40, (plain.to_dict(), ballast.to_dict())
