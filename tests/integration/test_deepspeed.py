"""Backend deepspeed (issue 52): DeepSpeed's engine under real launchers, ZeRO stage 0-3, the same curve as DDP's
and single's, its held bytes partitioned by stage, and bad input in one line before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import agreement
from tests.helpers import BIN, REPO, mpirun, no_rank_traceback, our_lines, run_cmd, run_ok, torchrun

COMPARE = [str(BIN / "distbench"), "compare", "--quiet"]
SHORT = ["--workload", "mlp", "--epochs", "1", "--steps-per-epoch", "20", "--repeats", "1"]


def _runs(root: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in root.glob("*/run.json")}


def _agreement(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("loss, max abs difference"))


@pytest.mark.timeout(300)
def test_zero_3_trains_the_curve_ddp_and_single_train_and_holds_a_share(tmp_path: Path) -> None:
    cmd = [*COMPARE, "--backends", "ddp,deepspeed,single", "--zero-stage", "3", *SHORT, "--out", str(tmp_path)]
    done = run_ok([*cmd, "--run-id", "c"], 240)
    assert "Decision (" in done.stdout
    assert "is deprecated" not in done.stderr  # ZeRO-3's torch deprecation warnings, once per collective
    # DeepSpeed's op, built (or found built) by compare before its first job, and said in its start-up lines.
    assert "[compare 1/" in done.stderr, done.stderr[-2000:]
    head = done.stderr.split("[compare 1/")[0]
    assert "deepspeed: its shared-memory op " in head and "cached for every run on this machine" in head
    # DDP and ZeRO-3 take the same steps; single's one process sums in another order (fp32 rounding).
    said = _agreement(done.stdout)
    assert "train 0.00e+00" in said or float(said.split("train ")[1].split(",")[0]) < 1e-5, said
    runs = _runs(tmp_path / "c")
    ds = runs["deepspeed-r0"]
    assert ds["status"] == "completed" and ds["knobs"]["zero_stage"] == 3 and ds["knobs"]["schedule"] == "fsdp"
    assert ds["knobs"]["config"]["zero_optimization"]["stage"] == 3
    assert ds["knobs"]["config"]["gradient_clipping"] == 0.0  # DeepSpeed's own default clips at 1.0
    held = ds["memory"]["per_rank"][0]
    for field in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
        assert held[field] * 2 == held[f"{field}_full"], field  # a half of each on each of 2 ranks
    ddp = runs["ddp-r0"]["memory"]["per_rank"][0]
    assert ddp["param_bytes"] == held["param_bytes_full"]
    rows = pd.read_csv(tmp_path / "c" / "comparison.csv")
    assert set(rows.variant) == {"ddp@torchrun", "deepspeed@torchrun", "single"}


@pytest.mark.full_matrix
@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_every_stage_under_mpirun_agrees_with_ddp(tmp_path: Path, stage: int) -> None:
    """The transformer's gradients pass a total norm of 1.0 at step 38: DeepSpeed's default clip once bent its
    curve there."""
    long = ["--workload", "transformer", "--epochs", "1", "--steps-per-epoch", "45", "--repeats", "1"]
    cmd = [*COMPARE, "--backends", "ddp@mpirun,deepspeed@mpirun", "--zero-stage", str(stage), *long]
    done = run_ok([*cmd, "--out", str(tmp_path), "--run-id", "c"], 300)
    assert "train 0.00e+00, validation 0.00e+00" in _agreement(done.stdout)
    ds = _runs(tmp_path / "c")["deepspeed-mpirun-r0"]
    assert ds["launcher"] == "mpirun" and ds["knobs"]["zero_stage"] == stage
    held = ds["memory"]["per_rank"][0]
    assert (held["optimizer_state_bytes"] * 2 == held["optimizer_state_bytes_full"]) == (stage >= 1)
    assert (held["grad_bytes"] * 2 == held["grad_bytes_full"]) == (stage >= 2)


@pytest.mark.full_matrix
@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [0, 3])
def test_the_step_users_run_bf16_clipped_checkpointed_agrees_with_ddp(tmp_path: Path, stage: int) -> None:
    """The step options DeepSpeed takes as the others do (autocast bf16, its config's clip, checkpointed blocks):
    the curve within autocast's tolerance of DDP's, and the clip binding (DeepSpeed clips the norm over partitions)."""
    step = ["--amp", "bf16", "--clip-grad-norm", "0.01", "--activation-checkpointing"]
    cmd = [*COMPARE, "--backends", "ddp,deepspeed", "--zero-stage", str(stage), *SHORT, "--workload", "transformer"]
    done = run_ok([*cmd, *step, "--out", str(tmp_path), "--run-id", "c"], 300)
    said = _agreement(done.stdout)
    assert float(said.split("train ")[1].split(",")[0]) < agreement.AMP_TOLERANCE, said
    ds = _runs(tmp_path / "c")["deepspeed-r0"]
    assert ds["knobs"]["config"]["gradient_clipping"] == 0.01 and ds["step"]["amp"] == "bf16"
    assert ds["step"]["activation_checkpointing"], ds["step"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("launcher", "args", "said"),
    [
        ("torchrun", ["--zero-stage", "5"], "--zero-stage must be 0, 1, 2 or 3"),
        ("mpirun", ["--amp", "fp16"], "backend deepspeed does not take --amp fp16"),
        ("compare", ["--compile"], "backend deepspeed does not take --compile"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, launcher: str, args: list[str], said: str) -> None:
    run = ["run", "--backend", "deepspeed", "--workload", "mlp", "--out", str(tmp_path)]
    cmd = {
        "torchrun": [*torchrun(2), *run],
        "mpirun": [*mpirun(2), *run],
        "compare": [*COMPARE, "--backends", "ddp,deepspeed", "--workload", "mlp", "--out", str(tmp_path)],
    }[launcher]
    done = run_cmd([*cmd, *args], 100)
    assert done.returncode == (1 if launcher == "torchrun" else 2), done.stderr[-2000:]  # torchrun's own 1
    ours = our_lines(done.stdout + done.stderr)
    assert len(ours) == 1 and said in ours[0], done.stderr[-2000:]
    no_rank_traceback(done.stdout + done.stderr)
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(120)
def test_without_deepspeed_installed_the_fix_is_named(tmp_path: Path) -> None:
    (tmp_path / "shadow" / "deepspeed").mkdir(parents=True)
    (tmp_path / "shadow" / "deepspeed" / "__init__.py").write_text("raise ImportError('no deepspeed here')\n")
    cmd = [*COMPARE, "--backends", "ddp,deepspeed", *SHORT, "--out", str(tmp_path / "o")]
    done = run_cmd(cmd, 100, PYTHONPATH=f"{tmp_path / 'shadow'}:{REPO}")
    assert done.returncode == 2 and "DeepSpeed is not installed (ImportError" in done.stderr
    assert done.stderr.strip().endswith("make setup, or pip install deepspeed==0.19.8")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["compare", "mpirun"])
def test_an_op_that_cannot_build_is_one_line_with_its_log(tmp_path: Path, launcher: str) -> None:
    # A fresh extension cache and no compiler: DeepSpeed's op must build, and cannot.
    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    out = tmp_path / "o"
    cmd = {
        "compare": [*COMPARE, "--backends", "ddp,deepspeed", *SHORT, "--out", str(out)],
        "mpirun": [*mpirun(2), "run", "--backend", "deepspeed", "--workload", "mlp", "--out", str(out)],
    }[launcher]
    done = run_cmd(cmd, 150, **env)
    assert done.returncode == 2, done.stderr[-2000:]
    said = done.stdout + done.stderr
    ours = our_lines(said)
    assert len(ours) == 1 and "shared-memory op (deepspeed_shm_comm) did not build (" in ours[0], said[-2000:]
    log = Path(ours[0].split("): see ")[1].split(";")[0])
    assert "no-such-c++" in log.read_text()  # the compiler's own words, kept in the log
    assert "WARNING" not in said and not out.exists()
    no_rank_traceback(said)
