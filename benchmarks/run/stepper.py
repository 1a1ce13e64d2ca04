"""What one training step trains and how it is stepped, and what a run records of its step options
(run.json `step`): the compile warm-up, fp16's skipped steps, the model FLOPs and the peak that MFU is against.

The recipe itself is the backend's (`Backend.backward`, `optimizer_step`, `compile`) or, for a copy outside any
framework, a plain `backends.step.Recipe`; the trainer calls whichever `Trained.via` holds and never asks which.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from backends import step
from benchmarks.config import RunConfig
from benchmarks.run.workloads import Workload


@dataclass
class Trained:
    """A model a step trains: the module the backend's contexts take (`model`: DDP's wrapper, FSDP2's root), the
    one called (`call`: compiled under --compile), its optimizer and loss scaler, and whose recipe steps it."""

    model: nn.Module
    optimizer: Any
    via: step.Recipe
    """The backend, or a plain step.Recipe for a copy outside it."""
    call: nn.Module
    scaler: torch.amp.GradScaler | None
    skipped: int = 0
    """Steps fp16's scaler skipped (non-finite gradients: the scale went down)."""
    _scale: float | None = None

    def note_scale(self) -> None:
        """After a step, off the clock: count it skipped when the scaler lowered its scale."""
        if self.scaler is None:
            return
        scale = self.scaler.get_scale()
        if self._scale is not None and scale < self._scale:
            self.skipped += 1
        self._scale = scale


def trained(model: nn.Module, optimizer: Any, via: step.Recipe, cfg: RunConfig, like: Trained | None = None) -> Trained:
    """`model` and its optimizer as `via` steps them; `like`: a copy's scaler starts where training's is (the
    compute baseline then skips no step training would not)."""
    call = via.compile(model) if cfg.compile == "on" else model
    scaler = via.grad_scaler(model)
    if scaler is not None and like is not None and like.scaler is not None:
        scaler.load_state_dict(like.scaler.state_dict())
    # The scale before any step (its initial value, read without a device sync), so a first step skipped counts.
    return Trained(model, optimizer, via, call, scaler, _scale=scaler.get_scale() if scaler is not None else None)


class Warmup:
    """Under --compile the warm-up lasts until a step compiles nothing on any rank (at least --warmup-steps), so
    no timed step compiles; the steps that did, and their time, are recorded apart."""

    def __init__(self, cfg: RunConfig, agree: Callable[[int], int]) -> None:
        self.on, self.agree = cfg.compile == "on", agree
        self.compiling = self.on
        self.compile_s = 0.0
        self.compile_steps = 0
        self.in_window = 0
        """Steps that compiled inside a timed window (a recompile: a shape or guard that changed)."""
        self.before = 0

    def settled(self) -> bool:
        return not self.compiling

    def start(self) -> None:
        self.before = step.compile_events() if self.on else 0

    def finish(self, step_s: float, timed: bool) -> None:
        """After a step: what it compiled; before the window opens, every rank learns whether any compiled
        (a collective, off the clock)."""
        if not self.on:
            return
        compiled = step.compile_events() != self.before
        if timed:
            self.in_window += compiled
            return
        if compiled:
            self.compile_s += step_s
            self.compile_steps += 1
        self.compiling = bool(self.agree(int(compiled)))

    def record(self) -> dict[str, Any]:
        return {"compile_s": self.compile_s, "compile_steps": self.compile_steps, "recompiles_timed": self.in_window}


OPTIMIZERS = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr),  # PyTorch's betas, eps, weight decay
}


def make_optimizer(model: nn.Module, cfg: RunConfig, workload: Workload | None = None) -> torch.optim.Optimizer:
    """The optimizer every backend wraps (and the compute baseline uses bare): the workload's own when it
    brings one, otherwise --optimizer's."""
    if workload is not None and workload.optimizer is not None:
        optimizer = workload.optimizer(model, cfg.lr)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"the workload's optimizer(model, lr) returned {type(optimizer).__name__}")
        return optimizer
    return OPTIMIZERS[cfg.optimizer](model.parameters(), cfg.lr)


def describe_optimizer(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """run.json `optimizer`: the class and every hyper-parameter it was built with."""
    plain = (bool, int, float, str, type(None))
    hyper = {k: list(v) if isinstance(v, tuple) else v for k, v in optimizer.defaults.items()}
    return {"name": type(optimizer).__name__, **{k: v for k, v in hyper.items() if isinstance(v, (*plain, list))}}


def tokens_per_sample(x: torch.Tensor) -> int | None:
    """A token workload's sequence length (integer inputs); None for any other input."""
    return int(x[0].numel()) if not x.is_floating_point() and x.dim() >= 2 else None


def model_flops(build_model: Callable[[], nn.Module], loss: Callable[..., torch.Tensor], x: Any, y: Any) -> int:
    """Model FLOPs of one micro-batch's forward and backward (torch's FlopCounterMode), on a fresh model on the
    meta device, so nothing is computed; activation checkpointing's recomputation is not model FLOPs."""
    model = step.structure(build_model)
    if any(p.device.type == "meta" for p in model.parameters()):
        x, y = x.to("meta"), y.to("meta")
    else:  # built on a real device after all: counted there, once
        model = model.to(x.device)
    with step.counting_flops() as total:
        loss(model(x), y).mean().backward()
    return int(total())


def measure(
    cfg: RunConfig,
    backend: Any,
    training: Trained,
    warmup: Warmup,
    checkpointed: list[str],
    workload: Workload,
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, Any]:
    """run.json `step`: every rank's compile warm-up, the model FLOPs of the micro-batch (x, y), and this
    machine's matmul peak, measured by every rank at once (collectives: never in a timed step)."""
    flops = model_flops(workload.build_model, workload.loss, x, y)
    warmups = backend.all_gather_object(warmup.record())
    backend.barrier()
    peak = 0.0 if cfg.peak_tflops else step.matmul_peak_tflops(step.dtype_of(cfg), backend.device)
    return record(cfg, warmups, training, checkpointed, flops, tokens_per_sample(x), backend.all_gather_object(peak))


def record(
    cfg: RunConfig,
    warmups: list[dict[str, Any]],
    training: Trained,
    checkpointed: list[str],
    flops: int,
    tokens: int | None,
    peaks: list[float],
) -> dict[str, Any]:
    """run.json `step`: the options as applied and what they cost (docs/results.md)."""
    return {
        "amp": cfg.amp,
        "compile": cfg.compile,
        "clip_grad_norm": cfg.clip_grad_norm,
        "activation_checkpointing": checkpointed,
        "compile_s": max(w["compile_s"] for w in warmups),
        "compile_steps": max(w["compile_steps"] for w in warmups),
        "recompiles_timed": max(w["recompiles_timed"] for w in warmups),
        "loss_scaler": None if training.scaler is None else {"skipped_steps": training.skipped},
        "model_flops_per_step": flops * cfg.accumulate,
        "tokens_per_sample": tokens,
        "peak_tflops": cfg.peak_tflops or statistics.median(peaks),
        "peak_source": "--peak-tflops"
        if cfg.peak_tflops
        else f"measured: {str(step.dtype_of(cfg)).removeprefix('torch.')} 1024² matmul, every rank at once, median",
        "peak_tflops_per_rank": peaks,
    }
