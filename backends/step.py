"""The step options (--amp, --compile, --clip-grad-norm, --activation-checkpointing) as every backend shares them,
and the plain recipe of a step: what a model with no framework around it (single, the compute baseline's copy)
does. Where a framework must do a part its own way, its backend overrides `Backend.backward`,
`Backend.optimizer_step`, `Backend.clip` or `Backend.compile`, which default to these.

Also what a run measures of the step off the clock: the model FLOPs of one micro-batch and this machine's
matmul peak, for MFU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils import checkpoint

from benchmarks.config import RunConfig
from benchmarks.errors import InputError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BLOCK_CONTAINERS = (nn.ModuleList, nn.Sequential)
RECOMPILE_LIMIT = 64
"""Graphs dynamo may compile of one code object before failing (compile_fn)."""
CHECKPOINTED = "_distbench_checkpointed"
"""Set on a block whose forward recomputes in backward, so that applying the option twice (a copy) is a no-op."""


def dtype_of(cfg: RunConfig) -> torch.dtype:
    """The dtype the step computes its matmuls in: autocast's, else float32."""
    return AMP_DTYPES.get(cfg.amp, torch.float32)


def autocast(cfg: RunConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """--amp around forward and loss (and validation's forward): parameters stay fp32."""
    if cfg.amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP_DTYPES[cfg.amp])


def grad_scaler(cfg: RunConfig, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (bf16 has fp32's range and needs none)."""
    return torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None


def outer_blocks(model: nn.Module, composite: bool = False) -> list[str]:
    """The children with parameters of the outermost nn.ModuleList/nn.Sequential containers, in model order (a
    transformer's layers, not also their MLP's Sequential). `composite`: only those with children of their own
    (a residual block, not a single Linear)."""
    modules = list(model.named_modules())
    found = [
        f"{name}.{child_name}" if name else child_name
        for name, module in modules
        if isinstance(module, BLOCK_CONTAINERS)
        for child_name, child in module.named_children()
        if any(True for _ in child.parameters()) and (not composite or any(True for _ in child.children()))
    ]
    return [name for name in found if not any(name.startswith(other + ".") for other in found)]


def checkpoint_blocks(model: nn.Module) -> list[str]:
    """--activation-checkpointing: each block's forward recomputed in backward. The forward is replaced on the
    instance, so module names, state_dict keys and a backend's wrapping (FSDP2's units) stay as they were."""
    names = outer_blocks(model, composite=True)
    for name in names:
        block = model.get_submodule(name)
        if getattr(block, CHECKPOINTED, False):
            continue
        block.forward = functools.partial(checkpoint.checkpoint, block.forward, use_reentrant=False)
        setattr(block, CHECKPOINTED, True)
    return names


def apply(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The step options that change the model itself, before any backend wraps it."""
    if cfg.activation_checkpointing:
        checkpoint_blocks(model)
    return model


def compile_fn(fn: Any, graphs: int = 0) -> Any:
    """torch.compile as every backend applies it: static shapes (one graph per shape; the automatic dynamic
    shapes a second shape would bring compile other kernels, and some fail), and an error, never a silent eager
    fallback, where dynamo would give up after its recompile limit. The limit counts graphs per code object: FSDP2's
    units (and the compute baseline's copies) share a class's forward, or checkpoint's under
    --activation-checkpointing, one graph per unit, shape and train/eval, so it is raised to at least `graphs`."""
    import torch._dynamo

    torch._dynamo.config.fail_on_recompile_limit_hit = True
    limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT, graphs)
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4 * limit)
    return torch.compile(fn, dynamic=False)


def compiled(model: nn.Module) -> nn.Module:
    """A plain model compiled whole (inductor): DDP's module, Horovod's model, single's, a baseline's copy."""
    return compile_fn(model)  # type: ignore[no-any-return]


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward()


def clip(parameters: Iterable[nn.Parameter], max_norm: float) -> None:
    torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    clip_to: Callable[[], None] | None,
) -> None:
    """Unscale (fp16), clip (`clip_to`, the backend's way), step and update the scale; a scaler skips a step
    whose gradients are not finite."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip_to is not None:
        clip_to()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


class Recipe:
    """How a step trains a model: backward, unscaling, clipping, the optimizer step, compile, the loss scaler.
    This is the plain way, with no reduction anywhere (single, the compute baseline's copies); a Backend is a Recipe
    whose framework overrides the parts it does its own way, and the trainer calls these and never asks which."""

    def __init__(self, run: RunConfig, device: torch.device) -> None:
        self.run, self.device = run, device

    def compile(self, model: nn.Module) -> nn.Module:
        """--compile: the module the trainer calls, compiled as the framework documents it; `model` is what
        `prepare` returned. Default: compiled whole (DDP's module, Horovod's and single's plain model)."""
        return compiled(model)

    def grad_scaler(self, model: nn.Module) -> torch.amp.GradScaler | None:
        """--amp fp16's loss scaler for `model` (None otherwise): one whose found-inf every rank that shares the
        model's gradients agrees on."""
        return grad_scaler(self.run, self.device)

    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
        """One micro-batch's backward (inside `accumulation`); the loss scaled first under fp16."""
        backward(loss, scaler)

    def clip(self, model: nn.Module, max_norm: float) -> None:
        """Clip the gradients, already reduced, to `max_norm` by their total norm over the whole model."""
        clip(model.parameters(), max_norm)

    def optimizer_step(self, model: nn.Module, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        """After the last micro-batch's backward: unscale, clip (--clip-grad-norm), step, zero the gradients.
        Default: the gradients are reduced once backward returns (DDP), or are this rank's own, so they are read
        at once."""
        max_norm = self.run.clip_grad_norm
        optimizer_step(optimizer, scaler, None if max_norm is None else lambda: self.clip(model, max_norm))
        optimizer.zero_grad()  # set_to_none, the default; Horovod takes no argument

    @contextlib.contextmanager
    def accumulation(self, model: nn.Module, last_micro_batch: bool) -> Iterator[None]:
        """Context for one backward pass; gradients are reduced only after the last micro-batch."""
        yield


def structure(build_model: Callable[[], nn.Module]) -> nn.Module:
    """The workload's model built on the meta device, where that works: its structure at no memory or compute
    (a factory that insists on a real device builds it there). It draws nothing from training's RNG."""
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                return build_model()
        except Exception:  # a factory that insists on a real device
            return build_model()


def check(cfg: RunConfig, device_type: str, build_model: Callable[[], nn.Module]) -> None:
    """Refuse a step option this torch, machine or workload cannot apply, before any process group."""
    if cfg.amp != "off":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device_type, dtype=AMP_DTYPES[cfg.amp]):
                pass
        if caught or not torch.amp.is_autocast_available(device_type):
            raise InputError(
                f"--amp {cfg.amp}: this torch ({torch.__version__}) has no {cfg.amp} autocast on {device_type}; "
                "choose another --amp or a newer torch"
            )
    if cfg.compile == "on" and device_type == "cpu" and not cxx_compiler():
        raise InputError(
            f"--compile on CPU needs a C++ compiler for inductor: {os.environ.get('CXX') or 'g++'} was not found; "
            "install one (apt-get install g++), point CXX at one, or leave --compile out"
        )
    if cfg.activation_checkpointing:
        if not outer_blocks(structure(build_model), composite=True):
            raise InputError(
                f"--activation-checkpointing: {cfg.workload} has no blocks (children with modules of their own in an "
                "nn.ModuleList or nn.Sequential) to recompute; leave the option out or choose a workload with "
                "blocks (transformer, cnn, hf:…)"
            )


def cxx_compiler() -> str | None:
    """The compiler inductor will call on CPU: $CXX where set, else g++ (torch._inductor.config.cpp.cxx)."""
    return shutil.which(os.environ.get("CXX") or "g++")


def compile_events() -> int:
    """How many frames dynamo has compiled and graphs inductor has built in this process so far: a step that
    moves it compiled (or recompiled) something."""
    return (
        counters["frames"]["total"]
        + counters["aot_autograd"]["total"]
        + counters["inductor"]["fxgraph_cache_miss"]
        + counters["inductor"]["fxgraph_cache_hit"]
    )


@contextlib.contextmanager
def counting_flops() -> Iterator[Callable[[], int]]:
    from torch.utils.flop_counter import FlopCounterMode

    mode = FlopCounterMode(display=False)
    with mode:
        yield mode.get_total_flops


def matmul_peak_tflops(dtype: torch.dtype, device: torch.device, seconds: float = 0.15, n: int = 1024) -> float:
    """This rank's sustained square-matmul rate in `dtype` at its present threads, TFLOP/s: the peak MFU is
    against when none is given. Every rank measures at once, so the cores are shared as in training."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        a @ b
    sync()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        calls += 1
        if device.type == "cuda" and calls % 16:
            continue
        sync()
    sync()
    return 2 * n**3 * calls / (time.perf_counter() - start) / 1e12
