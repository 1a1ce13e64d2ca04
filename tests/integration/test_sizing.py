"""compare sizes its runs to the workload, plans once after the pilot, and records where each job's time outside
its timed window goes: under real launchers, with workloads of a user's own (tests/integration/small_workloads)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.suite import sizing
from tests.helpers import BIN, run_ok

OUTSIDE = ("start", "checks_and_join", "build", "warmup", "gathers", "validation", "baseline", "step_measure", "record")


@pytest.mark.timeout(400)
def test_a_budget_that_cannot_decide_says_its_one_plan_after_the_pilot_and_again_at_the_end(tmp_path) -> None:
    cmd = [
        str(BIN / "distbench"),
        "compare",
        "--workload",
        "tests.integration.small_workloads:noisy",
        "--backends",
        "ddp,horovod@gloo",
        "--window",
        "0.5",
        "--max-repeats",
        "4",
        "--out",
        str(tmp_path),
        "--run-id",
        "c",
    ]
    proc = run_ok(cmd, timeout=380)
    said = [line for line in proc.stderr.splitlines() if "cannot decide at" in line]
    assert len(said) == 1, proc.stderr  # right after the pilot, once
    plan = said[0].removeprefix("[compare] ").split("; the budget still runs")[0]
    precision_line = next(line for line in proc.stdout.splitlines() if line.startswith("Precision:"))
    assert plan in precision_line, (plan, precision_line)  # the final lines give the same plan, no other count
    assert "an estimate —" not in proc.stdout
    root = tmp_path / "c"
    record = json.loads((root / sizing.SIZING_JSON).read_text())
    assert record["timed_steps"] >= sizing.MIN_TIMED_STEPS and record["variant"] == "ddp@torchrun"
    assert "sized to the workload" in proc.stderr
    runs = pd.read_csv(root / "comparison.csv")
    for run_id in runs.run_id:
        meta = json.loads((root / run_id / "run.json").read_text())
        assert set(OUTSIDE) <= set(meta["outside"]) and all(v >= 0 for v in meta["outside"].values()), meta
    assert "outside the timed window, per job:" in proc.stdout


@pytest.mark.full_matrix
@pytest.mark.timeout(1200)
def test_a_small_workload_of_ones_own_is_sized_and_decided_within_the_default_budget(tmp_path) -> None:
    cmd = [
        str(BIN / "distbench"),
        "compare",
        "--workload",
        "tests.integration.small_workloads:gru",
        "--backends",
        "ddp,horovod@gloo",
        "--out",
        str(tmp_path),
        "--run-id",
        "c",
    ]
    run_ok(cmd, timeout=1150)
    record = json.loads((tmp_path / "c" / sizing.SIZING_JSON).read_text())
    assert record["epochs"] > 1 and record["timed_steps"] >= 100, record  # the data caps an epoch at 32 steps
    decided = json.loads((tmp_path / "c" / "decision.json").read_text())
    assert [s["status"] for s in decided["setups"]] in (["resolved"], ["equivalent"]), decided


@pytest.mark.timeout(300)
def test_fsdp2s_view_warning_is_not_repeated_and_the_gradients_agree(tmp_path) -> None:
    """The GRU's head, a Linear over a 3-D input, returns a view: FSDP2 would warn of it on every rank of every run.
    distbench makes no in-place op on it, which the loss curve equal to DDP's shows."""
    from tests.helpers import read_run, run_cmd, torchrun

    common = ["--workload", "tests.integration.small_workloads:gru", "--epochs", "1", "--steps-per-epoch", "8"]
    common += ["--warmup-steps", "2", "--quiet", "--out", str(tmp_path)]
    losses = {}
    for backend in ("fsdp", "ddp"):
        proc = run_cmd([*torchrun(2), "run", "--backend", backend, *common, "--run-id", backend], timeout=280)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "returned a view tensor" not in proc.stdout + proc.stderr
        loss = read_run(tmp_path / backend)["loss"]
        losses[backend] = loss[loss.split == "train"].set_index("step")["loss"]
    assert float((losses["fsdp"] - losses["ddp"]).abs().max()) < 1e-5
