"""Plain helpers shared by the tests: the real launchers' commands, runs in-process, constructed run directories.

pytest's hooks and fixtures live in tests/conftest.py; everything a test module needs from elsewhere is here,
so that no test module imports another.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from torch.utils.data import DistributedSampler

from backends.single import SingleBackend
from benchmarks.config import NoOptions, RunConfig
from benchmarks.launch import PYTHON, TORCHRUN, LaunchInfo
from benchmarks.run import recorder as results
from benchmarks.run import sharding, workloads
from benchmarks.run.trainer import Trainer

# --- launchers and commands ------------------------------------------------------------------------

BIN = Path(sys.executable).parent  # the virtual environment's bin/: python, torchrun, horovodrun, distbench
REPO = Path(__file__).resolve().parent.parent  # the repository root
CLI = [str(BIN / "python"), "-m", "benchmarks.cli"]  # distbench's command line, as a rank runs it


def launcher_env(**extra: str) -> dict[str, str]:
    """This environment with the venv's bin/ first on PATH, the repository importable, and Open MPI allowed root."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    # Open MPI refuses root unless told; CI runs as root.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    env.update(extra)
    return env


def torchrun(nproc: int, *extra: str) -> list[str]:
    """The command prefix that starts `nproc` ranks of distbench under torchrun --standalone."""
    return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", *extra, "-m", "benchmarks.cli"]


def horovodrun(nproc: int, controller: str = "--gloo") -> list[str]:
    """The command prefix that starts `nproc` ranks of distbench under horovodrun with `controller`."""
    return [str(BIN / "horovodrun"), "-np", str(nproc), controller, *CLI]


def mpirun(nproc: int) -> list[str]:
    """The command prefix that starts `nproc` ranks of distbench under Open MPI's mpirun."""
    return ["mpirun", "-np", str(nproc), "--oversubscribe", "--allow-run-as-root", *CLI]


def run_cmd(cmd: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command from the repository root with the launcher environment (plus `env`), capturing output."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=launcher_env(**env))


def run_ok(cmd: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; on failure show its output in the assertion."""
    proc = run_cmd(cmd, timeout, **env)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


def cli_here(args: list[str]) -> subprocess.CompletedProcess[str]:
    """`distbench ARGS` called in this process (no launch: check, report, --help), as run_cmd returns it; a
    fresh interpreter would spend seconds importing what this one has imported already."""
    from benchmarks import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except SystemExit as exc:  # argparse's --help and usage errors
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["distbench", *args], code, out.getvalue(), err.getvalue())


def read_run(run_dir: Path) -> dict[str, pd.DataFrame]:
    """A run directory's timing.csv, loss.csv and summary.csv, by name."""
    return {name: pd.read_csv(run_dir / f"{name}.csv") for name in ("timing", "loss", "summary")}


# --- bad input under a launcher --------------------------------------------------------------------

# A short linear run's options for `distbench run`, failing fast (--timeout 20).
BAD_INPUT_RUN = [
    "--workload",
    "linear",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "6",
    "--warmup-steps",
    "1",
    "--quiet",
    "--flush-every",
    "2",
    "--timeout",
    "20",
]
# launcher → (command prefix, backend, the exit code that launcher passes on for ranks exiting 2)
BAD_INPUT_LAUNCHERS = {
    "torchrun": (lambda: torchrun(2), "ddp", 1),
    "horovodrun": (lambda: horovodrun(2, "--gloo"), "horovod", 1),
    "mpirun": (lambda: mpirun(2), "ddp", 2),
}


def one_in_make_test(values: list[str], kept: str) -> list:
    """`values` as pytest parameters, all but `kept` marked `full_matrix`: a second instance of a behaviour
    (another launcher for the same refusal) is left to `make test-all` (docs/development.md, two tiers)."""
    assert kept in values
    return [v if v == kept else pytest.param(v, marks=pytest.mark.full_matrix) for v in values]


def our_lines(output: str) -> list[str]:
    """The lines of `output` that are distbench's own error lines (horovodrun's "[N]<stderr>:" prefix kept)."""
    return [line for line in output.splitlines() if "distbench: error:" in line]


def no_rank_traceback(output: str) -> None:
    """A launcher may print a traceback of its own; none may come from a rank running distbench."""
    assert f'File "{REPO / "benchmarks"}' not in output and f'File "{REPO / "backends"}' not in output, output
    assert not re.search(r"\[rank\d+\]:\s*Traceback|Terminated: terminated by SIGTERM", output), output


# --- workloads -------------------------------------------------------------------------------------

# (what to read from the last validation row, the bar it must clear): chance is 10 % for the 10-class
# sets and ~0.2 % for the transformer's 512 tokens; linear starts near MSE 7 with noise floor 0.01.
BARS = {"linear": ("loss", 0.1), "mlp": ("accuracy", 0.5), "cnn": ("accuracy", 0.3), "transformer": ("accuracy", 0.1)}
# A GPT-2 of 2 layers, 64 wide, on 256 tokens: the smallest `hf:` workload.
TINY_GPT2 = "hf:GPT2Config:n_layer=2,n_embd=64,n_head=2,vocab_size=256,context=16"

# --- the Trainer in-process ------------------------------------------------------------------------

SMALL = {"train_size": 256, "val_size": 64, "quiet": True}  # config()'s defaults: a small, quiet run


def config(**fields: Any) -> RunConfig:
    """A resolved RunConfig of a small, quiet run (256 training and 64 validation samples) with `fields`."""
    return workloads.resolve(RunConfig(**{**SMALL, **fields}))


def open_recorder(run_dir: Path, cfg: RunConfig, world_size: int) -> results.Recorder:
    """A run directory whose run.json `distbench check` accepts (a DDP run under torchrun, as it says)."""
    meta = {
        "run_id": run_dir.name,
        "backend": "ddp",
        "launcher": TORCHRUN,
        "world_size": world_size,
        "workload": cfg.workload,
        "global_batch": cfg.batch_size * world_size,
    }
    return results.Recorder(run_dir, meta)


def fit(backend: Any, cfg: RunConfig, run_dir: Path | None, trainer_cls: type[Trainer] = Trainer) -> Trainer:
    """What the harness does with a backend: build a Trainer, fit, write summary.csv and run.json."""
    workload = workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    recorder = open_recorder(run_dir, cfg, backend.world_size) if run_dir is not None else None
    trainer = trainer_cls(backend, workload, cfg, recorder)
    trainer.fit()
    if recorder is not None:
        recorder.summary(trainer.timed_wall_s, trainer.compute_step_s)
        recorder.finish("completed")
    return trainer


def single_backend(cfg: RunConfig) -> SingleBackend:
    """The single-process backend for `cfg`, initialised, as `distbench run --backend single` has it."""
    backend = SingleBackend(cfg, NoOptions(), LaunchInfo(launcher=PYTHON))
    backend.init()
    return backend


def reference_train_losses(cfg: RunConfig) -> list[float]:
    """A plain single-process loop (DistributedSampler with set_epoch, SGD momentum 0.9): each step's loss."""
    workload = workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    sharding.seed_everything(cfg.seed)
    model = workload.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    x, y = workload.train
    losses = []
    for epoch in range(cfg.epochs):
        sampler = DistributedSampler(range(len(x)), num_replicas=1, rank=0, shuffle=True, seed=cfg.seed)
        sampler.set_epoch(epoch)
        order = list(sampler)
        for step in range(cfg.steps_per_epoch or len(x) // cfg.batch_size):
            index = torch.tensor(order[step * cfg.batch_size : (step + 1) * cfg.batch_size])
            loss = workload.loss(model(x[index]), y[index]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


# --- constructed run directories -------------------------------------------------------------------


def make_run(
    root: Path,
    run_id: str,
    backend: str,
    step_s: list[list[float]],
    wall: float,
    losses: list[float] | None = None,
    samples: int = 10,
    warmup: int = 1,
    val: list[float] | None = None,
    meta: dict | None = None,
    status: str = "completed",
) -> Path:
    """A real run directory: step_s[rank][i] is rank's time for step i+1; the first `warmup` are warm-up.

    `val` adds one validation row per value (at the last step); `meta` adds or overrides run.json keys.
    """
    world = len(step_s)
    meta = {
        "run_id": run_id,
        "backend": backend,
        "launcher": "torchrun",
        "world_size": world,
        "workload": "synthetic",
        "global_batch": samples * world,
        "threads": 1,
        **(meta or {}),
    }
    rec = results.Recorder(root / run_id, meta)
    timing = [
        {
            "run_id": run_id,
            "backend": backend,
            "world_size": world,
            "rank": r,
            "epoch": 1,
            "step": i + 1,
            "warmup": i < warmup,
            "samples": samples,
            "data_s": 0.0,
            "forward_s": t / 2,
            "backward_s": t / 2,
            "optimizer_s": 0.0,
            "step_s": t,
        }
        for i in range(len(step_s[0]))
        for r, times in enumerate(step_s)
        for t in [times[i]]
    ]
    loss = [
        {
            "run_id": run_id,
            "backend": backend,
            "world_size": world,
            "epoch": 1,
            "step": i + 1,
            "split": "train",
            "loss": v,
            "accuracy": None,
            "samples": samples * world,
        }
        for i, v in enumerate(losses or [1.0] * len(step_s[0]))
    ]
    loss += [
        {
            "run_id": run_id,
            "backend": backend,
            "world_size": world,
            "epoch": 1,
            "step": len(step_s[0]),
            "split": "val",
            "loss": v,
            "accuracy": 0.5,
            "samples": 100,
            "val_pass": 1,
            "val_s": 0.01,
            "val_samples_per_s": 100 / 0.01,
            "val_exact_loss": v,
        }
        for v in val or []
    ]
    rec.timing(timing)
    rec.loss(loss)
    if status == "completed":
        rec.summary(wall)
        rec.finish("completed", timed_wall_s=wall)
    else:
        rec.finish(status, error=f"{backend} exploded", failed_rank=0)
    return root / run_id


# The timed steps of one rank: a warm-up step then 2 timed steps.
ONE_RANK = [[1.0, 0.1, 0.1]]
CONFIG = {"batch_size": 10, "accumulate": 1, "warmup_steps": 1, "lr": 0.1}  # run.json's config, shared by both
# run.json's keys of a DDP run and of a Horovod run of the same model and config (for make_run's `meta`).
DDP = {
    "knobs": {"broadcast_buffers": True, "bucket_cap_mb": 25.0, "dist_backend": "gloo"},
    "versions": {"torch": "2.13", "python": "3.10"},
    "model_parameters": 1234,
    "config": {**CONFIG, "out": "x", "run_id": "y"},
}
HOROVOD = {
    "knobs": {"broadcast_buffers": False, "fusion_threshold_mb": 128.0, "controller": "gloo"},
    "versions": {"torch": "2.13", "python": "3.10", "horovod": "0.28"},
    "model_parameters": 1234,
    "launcher": "horovodrun",
    "launcher_detail": "gloo",
    "config": {**CONFIG, "out": "z", "run_id": "w"},
}

# --- `distbench tune`'s keep rule --------------------------------------------------------------------

DEFAULT = [100.0, 104.0, 96.0, 100.0]  # samples/s of the default's final runs
WITHIN_NOISE = [103.0, 112.0, 98.0, 108.0]  # gain 1.05×, interval about 0.96–1.15: includes 1
BEYOND_NOISE = [115.0, 118.0, 112.0, 116.0]  # gain 1.15×, interval about 1.10–1.21: wholly above 1
