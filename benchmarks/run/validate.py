"""Checks of `distbench run`'s options that need no process group and no torch (but for --device cuda).

Called by `run` under a launcher (every rank, rank 0 says it) and by `compare`/`tune` for every job before
any starts, so the same rule refuses the same input everywhere.
"""

from __future__ import annotations

import dataclasses

import backends
from benchmarks import catalog, config
from benchmarks.config import RunConfig
from benchmarks.errors import InputError
from benchmarks.run import faults


def validate(backend: str, cfg: RunConfig) -> None:
    """Refuse bad input before any process group starts; torch is imported only for --device cuda."""
    if backend not in backends.NAMES:
        raise InputError(f"unknown backend '{backend}'; known: {', '.join(backends.NAMES)}")
    for name in ("epochs", "batch_size", "accumulate", "flush_every"):
        if getattr(cfg, name) < 1:
            raise InputError(f"{config.flag(name)} must be a positive integer, got {getattr(cfg, name)}")
    for name in ("train_size", "val_size", "steps_per_epoch", "threads"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise InputError(f"{config.flag(name)} must be a positive integer, got {value}")
    if not cfg.lr > 0:  # also refuses nan
        raise InputError(f"--lr must be a positive number, got {cfg.lr}")
    if cfg.warmup_steps < 0 or not cfg.timeout > 0:
        raise InputError("--warmup-steps must be >= 0 and --timeout > 0")
    if cfg.compute_baseline_steps < 0:
        raise InputError(f"--compute-baseline-steps must be >= 0 (0 turns it off), got {cfg.compute_baseline_steps}")
    if cfg.trace_steps < 1:
        raise InputError(f"--trace-steps must be a positive integer, got {cfg.trace_steps}")
    if cfg.workers < 0:
        raise InputError(f"--workers must be >= 0 (0 loads in the training process), got {cfg.workers}")
    if cfg.prefetch_factor < 1:
        raise InputError(f"--prefetch-factor must be a positive integer, got {cfg.prefetch_factor}")
    check_validation(cfg)
    check_step(cfg)
    try:
        catalog.parse(cfg.workload)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if not cfg.eval_only and cfg.steps_per_epoch is not None and cfg.epochs * cfg.steps_per_epoch <= cfg.warmup_steps:
        raise config.no_timed_steps(cfg, cfg.steps_per_epoch)
    if cfg.inject_fault:
        try:
            faults.Fault.parse(cfg.inject_fault)
        except ValueError as exc:
            raise InputError(str(exc)) from exc
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")


def check_step(cfg: RunConfig) -> None:
    """The step options' values (what this torch and workload can apply is checked by backends.step.check)."""
    for name, known in (("amp", config.AMP_MODES), ("compile", config.COMPILE_MODES)):
        value = getattr(cfg, name)
        if value not in known:
            listed = "; only compare takes a comma-separated list" if "," in value else ""
            raise InputError(f"{config.flag(name)} {value!r} is not one of {', '.join(known)}{listed}")
    if cfg.clip_grad_norm is not None and not cfg.clip_grad_norm > 0:  # also refuses nan
        raise InputError(
            f"--clip-grad-norm must be a positive number (the largest total norm), got {cfg.clip_grad_norm}"
        )
    if cfg.peak_tflops is not None and not cfg.peak_tflops > 0:
        raise InputError(f"--peak-tflops must be a positive number, got {cfg.peak_tflops}")


TRAINING_ONLY = {
    "accumulate": 1,
    "fp16_allreduce": False,
    "trace": False,
    "amp": "off",
    "compile": "off",
    "clip_grad_norm": None,
    "activation_checkpointing": False,
}
"""Options --eval-only cannot apply (nothing is trained or traced), with the value that means "not given"."""


def check_validation(cfg: RunConfig) -> None:
    """--val-strategy, and --eval-only with the options that go with it and those that cannot."""
    if cfg.val_strategy not in config.VAL_STRATEGIES:
        listed = "; compare takes a comma-separated list, run one" if "," in cfg.val_strategy else ""
        known = ", ".join(config.VAL_STRATEGIES)
        raise InputError(f"--val-strategy {cfg.val_strategy!r} is not one of {known}{listed}")
    if cfg.eval_repeats < 1:
        raise InputError(f"--eval-repeats must be a positive integer, got {cfg.eval_repeats}")
    if cfg.eval_train_steps < 0:
        raise InputError(
            f"--eval-train-steps must be >= 0 (0 evaluates the model as built), got {cfg.eval_train_steps}"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    if not cfg.eval_only:
        given = [n for n in ("eval_train_steps", "eval_repeats") if getattr(cfg, n) != defaults[n]]
        if given:
            raise InputError(f"{config.flag(given[0])} applies only with --eval-only; add --eval-only or leave it out")
        return
    for name, unset in TRAINING_ONLY.items():
        if getattr(cfg, name) != unset:
            raise InputError(
                f"{config.flag(name)} cannot apply with --eval-only (nothing is trained); "
                "leave it out or drop --eval-only"
            )
