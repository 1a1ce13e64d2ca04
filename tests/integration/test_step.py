"""The step users run, under real launchers: --amp, --compile, --clip-grad-norm and --activation-checkpointing
train the same model under every backend (DDP, Horovod under both controllers, FSDP2, single), each its own
framework's way; fp16's skipped steps are counted; compile time stays out of the timed window; DDP is given
bucket_cap_mb only when asked; and what a step option cannot do is one line, exit 2, before any process group."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import agreement
from tests.helpers import CLI, horovodrun, mpirun, no_rank_traceback, our_lines, read_run, run_cmd, run_ok, torchrun

TINY = [
    "--workload",
    "transformer:dim=32,layers=2",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "8",
    "--warmup-steps",
    "2",
    "--train-size",
    "256",
    "--val-size",
    "32",
    "--compute-baseline-steps",
    "2",
    "--quiet",
]
LAUNCH = {
    "ddp": lambda: torchrun(2),
    "fsdp": lambda: torchrun(2),
    "horovod@gloo": lambda: horovodrun(2, "--gloo"),
    "horovod@mpi": lambda: horovodrun(2, "--mpi"),
    "single": lambda: CLI,
}


def run(out: Path, variant: str, run_id: str, *options: str, batch: int = 8) -> Path:
    backend = variant.split("@")[0]
    if backend == "single":
        batch *= 2  # the same global batch on one rank
    argv = [*LAUNCH[variant](), "run", "--backend", backend, *TINY, "--batch-size", str(batch), *options]
    run_ok([*argv, "--out", str(out), "--run-id", run_id], timeout=400)
    return out / run_id


def train_losses(run_dir: Path) -> pd.Series:
    loss = read_run(run_dir)["loss"]
    return loss[loss.split == "train"].set_index("step")["loss"]


def worst(a: Path, b: Path) -> float:
    return float((train_losses(a) - train_losses(b)).abs().max())


STEP = ["--amp", "fp16", "--clip-grad-norm", "0.01", "--activation-checkpointing"]


def fp16_clipped_checkpointed_runs(tmp_path: Path, variants: tuple[str, ...]) -> dict[str, Path]:
    """Each variant's run of STEP, checked against DDP's: Horovod's exactly, FSDP2's and single's (reduce-scatter,
    one rank's whole batch: other orders) within rounding; each run.json records the step."""
    runs = {v: run(tmp_path, v, v.replace("@", "-"), *STEP) for v in ("ddp", *variants)}
    for variant in variants:
        if variant.startswith("horovod"):
            assert worst(runs["ddp"], runs[variant]) == 0.0, variant  # the same order of computation: exactly
        else:
            assert worst(runs["ddp"], runs[variant]) < agreement.AMP_TOLERANCE, variant
    for variant, run_dir in runs.items():
        step = json.loads((run_dir / "run.json").read_text())["step"]
        assert step["amp"] == "fp16" and step["clip_grad_norm"] == 0.01, (variant, step)
        assert step["activation_checkpointing"] == ["blocks.0", "blocks.1"], (variant, step)
        assert step["loss_scaler"] == {"skipped_steps": 0}, (variant, step)
        assert step["model_flops_per_step"] > 0 and step["peak_tflops"] > 0, (variant, step)
    return runs


@pytest.mark.timeout(600)
def test_fp16_clipped_checkpointed_step_trains_the_same_model_under_ddp_horovod_and_fsdp2(
    tmp_path, horovod_available
) -> None:
    """Horovod clips and unscales only after synchronize(): were it to read its unreduced gradients, its curve
    would leave DDP's, whose gradients are reduced when backward returns. The clip binds: without it DDP differs.
    (Horovod's MPI controller and single: the next test, in make test-all.)"""
    runs = fp16_clipped_checkpointed_runs(tmp_path, ("horovod@gloo", "fsdp"))
    knobs = json.loads((runs["ddp"] / "run.json").read_text())["knobs"]  # no --bucket-cap-mb: DDP's own buckets
    assert (knobs["bucket_cap_given"], knobs["bucket_cap_mb"], knobs["first_bucket_mb"]) == (False, 25.0, 1.0)
    unclipped = run(tmp_path, "ddp", "ddp-unclipped", "--amp", "fp16", "--activation-checkpointing")
    assert worst(runs["ddp"], unclipped) > agreement.AMP_TOLERANCE


@pytest.mark.full_matrix
@pytest.mark.timeout(600)
def test_fp16_clipped_checkpointed_step_under_horovods_mpi_controller_and_single(tmp_path, horovod_available) -> None:
    fp16_clipped_checkpointed_runs(tmp_path, ("horovod@mpi", "single"))


@pytest.mark.timeout(900)
def test_compiled_bf16_step_agrees_and_its_compile_time_stays_out_of_the_timed_window(
    tmp_path, horovod_available
) -> None:
    options = ["--amp", "bf16", "--compile", "--clip-grad-norm", "0.3"]
    runs = {v: run(tmp_path, v, v.replace("@", "-"), *options) for v in ("ddp", "horovod@gloo", "fsdp")}
    assert worst(runs["ddp"], runs["horovod@gloo"]) == 0.0  # DDP's module compiled whole, Horovod's model
    assert worst(runs["ddp"], runs["fsdp"]) < agreement.AMP_TOLERANCE  # FSDP2's units compiled apart
    for variant, run_dir in runs.items():
        meta = json.loads((run_dir / "run.json").read_text())
        step, timing = meta["step"], read_run(run_dir)["timing"]
        assert step["compile"] == "on" and step["compile_steps"] >= 1 and step["recompiles_timed"] == 0, step
        first = timing[timing.step == 1]
        assert first.warmup.all(), variant  # the step that compiled is warm-up, whatever --warmup-steps
        timed = timing[~timing.warmup]
        assert len(timed) and timed.step_s.max() < step["compile_s"], (variant, step)
        assert meta["timed_wall_s"] < step["compile_s"], (variant, meta["timed_wall_s"], step)  # not inside it


@pytest.mark.full_matrix
@pytest.mark.timeout(900)
def test_compiled_bf16_step_under_horovods_mpi_controller_and_single(tmp_path, horovod_available) -> None:
    options = ["--amp", "bf16", "--compile", "--clip-grad-norm", "0.3", "--activation-checkpointing"]
    runs = {v: run(tmp_path, v, v.replace("@", "-"), *options) for v in ("ddp", "horovod@mpi", "single")}
    assert worst(runs["ddp"], runs["horovod@mpi"]) == 0.0
    assert worst(runs["ddp"], runs["single"]) < agreement.AMP_TOLERANCE
    for variant, run_dir in runs.items():
        step = json.loads((run_dir / "run.json").read_text())["step"]
        assert step["compile_steps"] >= 1 and step["recompiles_timed"] == 0, (variant, step)


@pytest.mark.timeout(300)
def test_fp16_skipped_steps_are_counted_alike_under_ddp_and_horovod(tmp_path, horovod_available) -> None:
    """Targets a thousand times larger overflow fp16's gradients at the scaler's first scales: every rank skips
    the same steps (Horovod unscales after synchronize, so its ranks see the same reduced gradients)."""
    options = ["--workload", "tests.integration.step_workload:overflowing", "--amp", "fp16", "--lr", "0.001"]
    runs = {v: run(tmp_path, v, v.replace("@", "-"), *options) for v in ("ddp", "horovod@gloo")}
    skipped = {
        v: json.loads((d / "run.json").read_text())["step"]["loss_scaler"]["skipped_steps"] for v, d in runs.items()
    }
    assert skipped["ddp"] >= 1 and skipped["ddp"] == skipped["horovod@gloo"], skipped
    assert worst(runs["ddp"], runs["horovod@gloo"]) == 0.0


@pytest.mark.timeout(200)
def test_ddp_given_bucket_cap_mb_caps_its_first_bucket_too(tmp_path) -> None:
    """(Not given, DDP keeps its own 1 MiB first bucket: the first test's DDP run says so.)"""
    given = json.loads((run(tmp_path, "ddp", "given", "--bucket-cap-mb", "25") / "run.json").read_text())["knobs"]
    assert (given["bucket_cap_given"], given["bucket_cap_mb"], given["first_bucket_mb"]) == (True, 25.0, 25.0)


BAD_STEP = {
    "clip": (mpirun, "ddp", ["--clip-grad-norm", "0"], "--clip-grad-norm must be a positive number", {}),
    "no blocks": (
        lambda n: horovodrun(n, "--gloo"),
        "horovod",
        ["--workload", "linear", "--activation-checkpointing"],
        "has no blocks",
        {},
    ),
    "no compiler": (torchrun, "fsdp", ["--compile"], "needs a C++ compiler", {"CXX": "/nonexistent/c++"}),
    "amp list": (mpirun, "ddp", ["--amp", "off,bf16"], "only compare takes a comma-separated list", {}),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("bad", BAD_STEP)
def test_a_step_option_that_cannot_apply_is_one_line_before_any_process_group(
    tmp_path, bad: str, horovod_available
) -> None:
    launcher, backend, args, message, env = BAD_STEP[bad]
    argv = [*launcher(2), "run", "--backend", backend, *TINY, *args, "--out", str(tmp_path)]
    proc = run_cmd(argv, timeout=130, **env)
    output = proc.stdout + proc.stderr
    lines = our_lines(output)
    assert len(lines) == 1 and message in lines[0], output
    assert proc.returncode != 0, output
    no_rank_traceback(output)  # horovodrun's own traceback when a rank exits 2 is the launcher's (docs/reliability.md)
    assert not any(tmp_path.iterdir())
