"""Checks of `distbench run`'s options that need no process group and no torch (but for --device cuda).

Called by `run` under a launcher (every rank, rank 0 says it) and by `compare`/`tune` for every job before
any starts, so the same rule refuses the same input everywhere.
"""

from __future__ import annotations

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
    try:
        catalog.parse(cfg.workload)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if cfg.steps_per_epoch is not None and cfg.epochs * cfg.steps_per_epoch <= cfg.warmup_steps:
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
