"""Phase timing of one train step: the host clock on CPU, CUDA events on a GPU.

A GPU training loop relies on the host running ahead, queuing the next kernels while the GPU works. A
host synchronisation between phases would drain that queue at every boundary and time a slower loop
than the user runs. So on CUDA each boundary records an event on the current stream, the step ends with
one synchronisation, and the phases are read from event pairs after it. The step's own time stays on
the host clock on both paths: it is what the timed window and throughput are made of.

Phases tile the step: each boundary closes the phase named there and opens the next, so the phases of a
step add up to its time.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch


class PhaseTimer(Protocol):
    def start(self) -> None:
        """The step begins now."""

    def lap(self, phase: str) -> None:
        """The time since the previous boundary (or the start) belongs to `phase`."""

    def finish(self) -> tuple[dict[str, float], float]:
        """End the step: seconds per phase (summed over its laps) and the step's seconds."""


class HostTimer:
    """perf_counter at every boundary; nothing waits (on CPU every phase has finished when it returns)."""

    def start(self) -> None:
        self.begin = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now

    def finish(self) -> tuple[dict[str, float], float]:
        return self.phases, self.last - self.begin


class EventSource(Protocol):
    """What the CUDA timer needs from torch.cuda; a test passes a fake."""

    def event(self) -> Any:
        """A timing event with `record()` (on the current stream) and `elapsed_time(end)` in milliseconds."""

    def synchronize(self) -> None: ...


class TorchCudaEvents:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def synchronize(self) -> None:
        # The whole device, not the last event: Horovod's and NCCL's own streams are finished too.
        torch.cuda.synchronize(self.device)


class CudaTimer:
    """An event per boundary, one synchronisation per step in `finish`, elapsed times read after it.

    Events are reused from step to step (the previous step has synchronised): creating them is host
    work inside the step.
    """

    def __init__(self, source: EventSource) -> None:
        self.source = source
        self.pool: list[Any] = []
        self.marks: list[tuple[str, Any]] = []

    def _record(self) -> Any:
        index = len(self.marks)
        if index == len(self.pool):
            self.pool.append(self.source.event())
        event = self.pool[index]
        event.record()
        return event

    def start(self) -> None:
        self.marks = []
        self.begin = time.perf_counter()
        self.marks.append(("", self._record()))

    def lap(self, phase: str) -> None:
        self.marks.append((phase, self._record()))

    def finish(self) -> tuple[dict[str, float], float]:
        self.source.synchronize()
        step_s = time.perf_counter() - self.begin
        phases: dict[str, float] = {}
        for (_, before), (phase, after) in itertools.pairwise(self.marks):
            phases[phase] = phases.get(phase, 0.0) + before.elapsed_time(after) / 1000.0
        return phases, step_s


def timer_for(device: torch.device) -> PhaseTimer:
    return CudaTimer(TorchCudaEvents(device)) if device.type == "cuda" else HostTimer()


class Outside:
    """The seconds a run spends outside its timed windows, by part (run.json `outside`, docs/results.md), so that
    a compare can say what each launch costs beyond what it measures."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds

    @contextlib.contextmanager
    def timing(self, part: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.add(part, time.perf_counter() - begin)
