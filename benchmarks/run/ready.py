"""The gradient-ready schedule: when, within backward, each parameter's gradient is ready, and its size.

`distbench project` simulates each framework's communication against it (DDP's buckets, Horovod's cycles,
FSDP2's units), so it is measured once per run, on the compute baseline's bare model (no communication and
no backend hook) and in steps of their own after the baseline's timed ones: the hooks and clock reads it
adds are in no recorded number. Every rank runs the steps, so the cores are as busy as in training; rank 0's
schedule is the one recorded (run.json `compute_baseline.ready`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

READY_STEPS = 3
"""Steps whose backward is clocked; each parameter's median offset is recorded."""

Step = Callable[[Callable[[], None], Callable[[], None]], None]
"""Runs one optimizer step, calling the first argument just before its last backward and the second just
after it (earlier micro-batches of an accumulating step send nothing, so only the last one is clocked)."""


class _Clock:
    """Timestamps on the host (CPU) or as CUDA events read after the step (no synchronisation inside it)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000 if self.cuda else end - start


def measure(model: nn.Module, step: Step, device: torch.device, steps: int = READY_STEPS) -> dict[str, Any]:
    """Clock `steps` steps: each parameter's gradient-ready offset from the start of the last backward."""
    clock = _Clock(device)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    marks: dict[str, Any] = {}
    bounds: dict[str, Any] = {}
    armed = [False]

    def hook_for(name: str) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if armed[0]:
                marks[name] = clock.now()

        return hook

    def begin() -> None:
        armed[0] = True
        bounds["start"] = clock.now()

    def end() -> None:
        bounds["end"] = clock.now()
        armed[0] = False

    handles = [p.register_post_accumulate_grad_hook(hook_for(name)) for name, p in named]
    offsets: dict[str, list[float]] = {name: [] for name, _ in named}
    backward: list[float] = []
    try:
        for _ in range(steps):
            marks.clear()
            step(begin, end)
            if clock.cuda:
                torch.cuda.synchronize(device)
            backward.append(clock.seconds(bounds["start"], bounds["end"]))
            for name, mark in marks.items():
                offsets[name].append(clock.seconds(bounds["start"], mark))
    finally:
        for handle in handles:
            handle.remove()
    return {
        "steps": steps,
        "backward_s": statistics.median(backward),
        "params": [
            {
                "name": name,
                "bytes": p.numel() * p.element_size(),
                "ready_s": statistics.median(offsets[name]) if offsets[name] else None,
            }
            for name, p in named
        ],
    }
