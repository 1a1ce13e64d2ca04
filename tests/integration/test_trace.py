"""`run --trace` and the compute baseline under real launchers: Horovod's timeline parses into per-step
time, DDP's torch.profiler trace holds its gloo allreduces, and the breakdown adds up."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import check, timeline
from benchmarks.run import recorder as results
from tests.helpers import horovodrun, run_ok, torchrun

ARGS = ["run", "--workload", "mlp", "--epochs", "1", "--steps-per-epoch", "25", "--quiet"]
ARGS += ["--trace", "--trace-steps", "3"]


def traced(tmp_path: Path, launcher: list[str], backend: str) -> tuple[dict, pd.Series]:
    run_ok([*launcher, *ARGS, "--backend", backend, "--out", str(tmp_path), "--run-id", backend], timeout=180)
    run_dir = tmp_path / backend
    assert not check.check_run(run_dir)
    summary = pd.read_csv(run_dir / results.SUMMARY_CSV).iloc[0]
    # Gradient communication can only add time: the breakdown is not negative beyond noise.
    assert summary["compute_s"] > 0
    assert summary["exposed_comm_s"] > -0.25 * summary["step_p50_s"], summary.to_dict()
    meta = json.loads((run_dir / results.RUN_JSON).read_text())
    assert meta["trace"]["steps"] == 3 and meta["gradient_bytes_per_step"] == 4 * meta["model_parameters"]
    return meta, summary


@pytest.mark.timeout(240)
def test_horovod_trace_is_a_timeline_with_time_per_step(tmp_path, horovod_available) -> None:
    meta, _ = traced(tmp_path, horovodrun(2), "horovod")
    assert meta["trace"]["files"] == ["trace/horovod_timeline.json"]
    per_step = timeline.summarize(tmp_path / "horovod" / meta["trace"]["files"][0], steps=3)
    assert per_step["communication"] > 0 and per_step["negotiation"] > 0
    assert per_step["allreduce"] >= per_step["communication"]


@pytest.mark.timeout(240)
def test_ddp_trace_is_a_chrome_trace_of_its_allreduces(tmp_path) -> None:
    meta, _ = traced(tmp_path, torchrun(2), "ddp")
    assert meta["trace"]["files"] == ["trace/torch_profiler_rank0.json"]
    events = json.loads((tmp_path / "ddp" / meta["trace"]["files"][0]).read_text())["traceEvents"]
    allreduces = [e for e in events if e.get("name") == "gloo:all_reduce"]
    assert len(allreduces) >= 3  # at least one per traced step
