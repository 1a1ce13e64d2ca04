"""Peak memory per rank over training: what `distbench run` puts beside its speed.

A `Meter` is started just before the model is built and read once training and validation are over
(before the compute baseline and trace steps, which build or run extra copies). Each rank reads its own
process; the trainer gathers the readings to rank 0 after the last timed window, never inside it.

On CPU the number is the process's resident set (RSS): its high-water mark over training and its value
just before the model was built, so the training's own share (model, the backend's wrappers and buffers,
gradients, optimizer state, activations) is their difference. Linux resets the high-water mark (VmHWM)
when "5" is written to /proc/self/clear_refs; where that fails, the only peak is getrusage's ru_maxrss,
the maximum since the process started, which may then be a peak from before the model was built
(`peak_rss_from` says which). DataLoader worker processes are not counted: they are other processes.

On CUDA, `torch.cuda.max_memory_allocated` (tensors) and `max_memory_reserved` (the caching allocator's
pool, what the device actually gave up) from a reset when the meter starts.

Beside the peaks, what the training state takes, counted tensor by tensor (`held_bytes`): the bytes of the
parameters, gradients and optimizer state this rank holds (its shards under FSDP2: a DTensor's local part)
and their full sizes. On CPU, where RSS hides a sharding under everything else resident, these show it.
"""

from __future__ import annotations

import re
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.run.recorder import PEAK_FROM_MODEL_BUILD, PEAK_FROM_PROCESS_START

MIB = 2**20
STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_mib(field: str) -> float | None:
    """A kB field of /proc/self/status (VmRSS, VmHWM) in MiB; None where there is no such file."""
    try:
        found = re.search(rf"^{field}:\s+(\d+)\s+kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 / MIB if found else None


def lifetime_peak_rss_mib() -> float:
    """getrusage's ru_maxrss: the process's peak RSS since it started (kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak * 1024 / MIB


def rss_mib() -> float:
    """The resident set now; without /proc, the lifetime peak stands in (an upper bound)."""
    now = _status_mib("VmRSS")
    return now if now is not None else lifetime_peak_rss_mib()


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel or platform does not allow it."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _status_mib("VmHWM") is not None


HELD_FIELDS = ("param_bytes", "grad_bytes", "optimizer_state_bytes")
"""run.json `memory.per_rank`'s bytes held by this rank; each has its `_full` twin, the model's whole size."""


def _local_and_full(tensor: torch.Tensor) -> tuple[int, int]:
    # A DTensor's numel() is the whole tensor's; to_local() is this rank's shard, as stored (padding left out).
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size(), tensor.numel() * tensor.element_size()


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes of the training state this rank holds and their full sizes, counted from the tensors themselves.

    Gradients: those of the trainable parameters as they stand after a step's backward (the parameters'
    layout: a shard under FSDP2, whole under DDP and Horovod), counted from the parameters since the step
    frees them (zero_grad) before this is read. DDP's gradient buckets and Horovod's fusion buffer are the
    backends' own and not counted here (peak RSS and CUDA peak hold them). Optimizer state: every tensor in
    `optimizer.state` (momentum; AdamW's moments and step count)."""
    counts = dict.fromkeys([*HELD_FIELDS, *(f"{f}_full" for f in HELD_FIELDS)], 0)

    def add(field: str, tensor: torch.Tensor) -> None:
        local, full = _local_and_full(tensor)
        counts[field] += local
        counts[f"{field}_full"] += full

    for param in model.parameters():
        add("param_bytes", param)
        if param.requires_grad:
            add("grad_bytes", param)
    for state in optimizer.state.values() if optimizer is not None else ():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                add("optimizer_state_bytes", value)
    return counts


class Meter:
    """One rank's memory over training: start it just before the model is built, `read()` after training."""

    def __init__(self, device: torch.device, reset: bool = True) -> None:
        self.device = device
        self.peak_rss_from = PEAK_FROM_MODEL_BUILD if reset and reset_peak_rss() else PEAK_FROM_PROCESS_START
        self.rss_before_model_mb = rss_mib()
        self.tracked: tuple[nn.Module, torch.optim.Optimizer | None] | None = None
        self.own: Callable[[], dict[str, int] | None] = lambda: None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def peak_rss_mb(self) -> float:
        since_reset = _status_mib("VmHWM") if self.peak_rss_from == PEAK_FROM_MODEL_BUILD else None
        return since_reset if since_reset is not None else lifetime_peak_rss_mib()

    def track(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        own: Callable[[], dict[str, int] | None] | None = None,
    ) -> None:
        """The (unwrapped) model and the optimizer whose held bytes `read` adds; `own`, the framework's own count
        where it keeps the state elsewhere (Backend.held_state)."""
        self.tracked = (model, optimizer)
        if own is not None:
            self.own = own

    def read(self) -> dict[str, Any]:
        """This rank's numbers in MiB (run.json `memory.per_rank`; summary.csv takes their range over ranks),
        and with a tracked model the bytes it holds (`held_bytes`)."""
        peak = self.peak_rss_mb()
        cuda = self.device.type == "cuda"
        held = self.own() or (held_bytes(*self.tracked) if self.tracked is not None else {})
        return {
            **held,
            "rss_before_model_mb": self.rss_before_model_mb,
            "peak_rss_mb": peak,
            "training_rss_mb": peak - self.rss_before_model_mb,
            "peak_rss_from": self.peak_rss_from,
            "cuda_max_allocated_mb": torch.cuda.max_memory_allocated(self.device) / MIB if cuda else None,
            "cuda_max_reserved_mb": torch.cuda.max_memory_reserved(self.device) / MIB if cuda else None,
        }
