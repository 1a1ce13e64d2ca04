"""Step timing without a GPU: the CUDA-event path driven by a fake event source (one synchronisation per
step, phases from event pairs read after it), the host path unchanged, and the allreduce sweep's timed
loop free of host synchronisation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from backends.single import SingleBackend
from benchmarks.config import AllreduceConfig, NoOptions, RunConfig
from benchmarks.launch import PYTHON, LaunchInfo
from benchmarks.run import collectives, phases, workloads
from benchmarks.run.collective_impls import Collective, fill_pattern
from benchmarks.run.trainer import Trainer

PHASES = ("data", "forward", "backward", "optimizer")


class FakeEvents:
    """A stream whose clock moves 2**i ms at the i-th record of a step, so every sum of laps is unique."""

    def __init__(self) -> None:
        self.syncs = 0
        self.created = 0
        self.records_since_sync = 0
        self.clock_ms = 0.0
        self.log: list[str] = []

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.syncs += 1
        self.records_since_sync = 0
        self.log.append("sync")


class FakeEvent:
    def __init__(self, source: FakeEvents) -> None:
        self.source = source
        self.at_ms: float | None = None
        self.synced_at = -1

    def record(self) -> None:
        source = self.source
        source.clock_ms += 2.0**source.records_since_sync if source.records_since_sync else 0.0
        source.records_since_sync += 1
        self.at_ms, self.synced_at = source.clock_ms, source.syncs
        source.log.append("record")

    def elapsed_time(self, end: FakeEvent) -> float:
        # What torch refuses too: reading an event the host has not synchronised past.
        assert self.source.syncs > end.synced_at, "elapsed_time read before the step's synchronisation"
        assert self.at_ms is not None and end.at_ms is not None
        return end.at_ms - self.at_ms


def expected_laps(k: int) -> dict[str, float]:
    """Seconds per phase for k micro-batches: record i (i >= 1) closes the i-th lap, of 2**i ms."""
    names = [name for _ in range(k) for name in PHASES[:3]] + ["optimizer"]
    out: dict[str, float] = {}
    for i, name in enumerate(names, start=1):
        out[name] = out.get(name, 0.0) + 2.0**i / 1000
    return out


def test_the_cuda_timer_synchronises_once_and_reads_event_pairs_after_it() -> None:
    source = FakeEvents()
    timer = phases.CudaTimer(source)
    for step in range(3):
        timer.start()
        for name in PHASES:
            timer.lap(name)
        assert source.syncs == step  # nothing waited while the step was queued
        laps, step_s = timer.finish()
        assert source.syncs == step + 1
        assert laps == pytest.approx({"data": 0.002, "forward": 0.004, "backward": 0.008, "optimizer": 0.016})
        assert step_s > 0  # the host clock, through the synchronisation
    assert source.created == 5  # events reused from step to step


def test_the_host_timer_tiles_the_step_and_never_waits() -> None:
    timer = phases.HostTimer()
    timer.start()
    for name in ("data", "forward", "data", "forward", "optimizer"):
        timer.lap(name)
    laps, step_s = timer.finish()
    assert set(laps) == {"data", "forward", "optimizer"}
    assert sum(laps.values()) == pytest.approx(step_s, abs=1e-12)
    assert isinstance(phases.timer_for(torch.device("cpu")), phases.HostTimer)
    assert isinstance(phases.timer_for(torch.device("cuda", 0)), phases.CudaTimer)  # builds no event yet


def trainer(accumulate: int = 1, **fields: Any) -> Trainer:
    small = {"train_size": 256, "val_size": 64, "quiet": True, "batch_size": 8}
    cfg = workloads.resolve(RunConfig(workload="mlp", accumulate=accumulate, **small, **fields))
    backend = SingleBackend(cfg, NoOptions(), LaunchInfo(launcher=PYTHON))
    backend.init()
    return Trainer(backend, workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size), cfg, None)


@pytest.mark.parametrize("accumulate", [1, 3])
def test_a_train_step_on_the_event_path_synchronises_exactly_once(monkeypatch, accumulate: int) -> None:
    def no_host_sync(*args: Any) -> None:
        raise AssertionError("torch.cuda.synchronize called inside a train step")

    monkeypatch.setattr(torch.cuda, "synchronize", no_host_sync)
    t = trainer(accumulate)
    source = FakeEvents()
    t.timer = phases.CudaTimer(source)
    steps = t.steps_in_epoch(0)[:4]
    for n, step in enumerate(steps, start=1):
        source.log.clear()
        row = t.train_step(step, 1)
        assert source.syncs == n
        assert source.log == ["record"] * (3 * accumulate + 2) + ["sync"]  # the one sync ends the step
        laps = expected_laps(accumulate)
        assert {p: row[f"{p}_s"] for p in PHASES} == pytest.approx(laps)
        assert row["step_s"] > 0 and isinstance(row["loss_sum"], float)


def test_on_cuda_the_loss_sums_wait_for_the_flush_and_come_out_the_same(monkeypatch) -> None:
    """A CUDA trainer leaves the step's loss sums on the device (reading them would be a second host sync);
    `flush` adds them up exactly as the CPU path does at once."""
    cpu, gpu = trainer(2), trainer(2)
    gpu.device = torch.device("cuda", 0)  # only what _total looks at; the tensors stay on the CPU
    gpu.timer = phases.CudaTimer(FakeEvents())
    gathered: list[Any] = []
    monkeypatch.setattr(gpu.backend, "all_gather_object", lambda obj: gathered.append(obj) or [obj])
    for step in cpu.steps_in_epoch(0)[:3]:
        want = cpu.train_step(step, 1)
        got = gpu.train_step(step, 1)
        assert isinstance(got["loss_sum"], list) and isinstance(got["correct_sum"], list)
        gpu.pending.append(got)
        cpu.pending.append(want)
    gpu.flush()
    rows = gathered[0][0]
    assert [r["loss_sum"] for r in rows] == [r["loss_sum"] for r in cpu.pending]  # bit for bit
    assert [r["correct_sum"] for r in rows] == [r["correct_sum"] for r in cpu.pending]


# --- the allreduce sweep's timed loop ---------------------------------------------------------------


class LoggingCollective(Collective):
    """One rank, numpy buffers: logs every call the sweep makes."""

    name = "logging"

    def __init__(self, opts: AllreduceConfig) -> None:
        super().__init__(LaunchInfo(launcher=PYTHON), opts)
        self.log: list[str] = []

    def buffer(self, elements: int) -> Any:
        return np.zeros(elements, dtype=np.float32)

    def fill(self, buf: Any, rank: int) -> None:
        fill_pattern(buf, rank)

    def host(self, buf: Any) -> np.ndarray:
        return buf

    def allreduce(self, buf: Any, size_bytes: int) -> Any:
        return lambda: self.log.append("allreduce")  # one rank: the sum is the buffer itself

    def synchronize(self) -> None:
        self.log.append("synchronize")

    def barrier(self) -> None:
        self.log.append("barrier")

    def allgather(self, obj: Any) -> list[Any]:
        self.log.append("allgather")
        return [obj]


class Beat:
    def beat(self) -> None: ...


def test_the_timed_loop_queues_calls_with_one_sync_before_the_clock_and_one_after() -> None:
    opts = AllreduceConfig(impl="torch", sizes=[64, 4096], iters=7, warmup=2, quiet=True)
    impl = LoggingCollective(opts)
    collectives.sweep(impl, opts, None, Beat())  # type: ignore[arg-type]
    for _ in opts.sizes:
        start = impl.log.index("barrier")
        assert impl.log[start : start + 10] == ["barrier", "synchronize", *["allreduce"] * 7, "synchronize"]
        impl.log = impl.log[start + 10 :]
