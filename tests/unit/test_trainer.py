"""The Trainer in-process: the timed window, collectives kept off the timed path, one model validated,
the epoch given to the sampler, run.json written atomically. Real backends: SingleBackend, and DDP on a
2-rank gloo group started with torch.multiprocessing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

from backends.ddp import DDPBackend
from backends.single import SingleBackend
from benchmarks.config import DDPConfig, NoOptions, RunConfig
from benchmarks.launch import PYTHON, TORCHRUN, LaunchInfo, rendezvous
from benchmarks.run import recorder as results
from benchmarks.run import workloads
from benchmarks.run.ready import READY_STEPS
from benchmarks.run.trainer import BASELINE_WARMUP_STEPS, VALIDATION_BUFFERS, Trainer
from tests.helpers import config, fit, reference_train_losses, single_backend

WINDOWS = [(10, 1), (10, 2), (3, 4), (0, 3)]  # (--warmup-steps, --flush-every)


def window_config(warmup: int, flush_every: int) -> RunConfig:
    """Two epochs of 8 steps: the window opens in epoch 1 (or 2) after some warm-up gathers."""
    return config(
        workload="mlp", epochs=2, steps_per_epoch=8, batch_size=8, warmup_steps=warmup, flush_every=flush_every
    )


def assert_window_holds_the_timed_steps(run_dir: Path, straddle: float = 0.0) -> None:
    """wall_s ≥ each rank's timed step_s summed, and ≥ the sum over timed steps of the slowest rank's step_s.

    The second holds only up to `straddle` on several ranks: a rank delayed just after a gradient
    reduction makes its own step and the others' next step (waiting in that reduction) both slow, so one
    delay counts in two steps' maxima.
    """
    timing = pd.read_csv(run_dir / "timing.csv")
    timed = timing[~timing["warmup"]]
    wall_s = pd.read_csv(run_dir / "summary.csv")["wall_s"].iloc[0]
    per_rank = timed.groupby("rank")["step_s"].sum()
    assert len(per_rank) == timing["rank"].nunique() and per_rank.min() > 0
    assert wall_s >= per_rank.max(), f"{run_dir.name}: wall_s {wall_s:.6f} < a rank's steps {per_rank.max():.6f}"
    slowest = timed.groupby("step")["step_s"].max().sum()
    assert wall_s >= slowest * (1 - straddle), f"{run_dir.name}: wall_s {wall_s:.6f} < slowest steps {slowest:.6f}"


# --- the timed window ----------------------------------------------------------------------------


@pytest.mark.parametrize(("warmup", "flush_every"), WINDOWS)
def test_warmup_gathers_do_not_shrink_the_timed_window(tmp_path, warmup: int, flush_every: int) -> None:
    cfg = window_config(warmup, flush_every)
    fit(single_backend(cfg), cfg, tmp_path / "run")
    assert_window_holds_the_timed_steps(tmp_path / "run")


# --- no collective inside a step ------------------------------------------------------------------


class RecordingBackend(SingleBackend):
    """The real single-process backend, noting when each collective is called."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: list[tuple[str, float]] = []

    def _note(self, name: str) -> None:
        self.calls.append((name, time.perf_counter()))

    def all_reduce(self, tensor: torch.Tensor, op: Any = "sum") -> torch.Tensor:
        self._note("all_reduce")
        return super().all_reduce(tensor, op)

    def all_gather_object(self, obj: Any) -> list[Any]:
        self._note("all_gather_object")
        return super().all_gather_object(obj)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        self._note("broadcast_object")
        return super().broadcast_object(obj, src)

    def barrier(self) -> None:
        self._note("barrier")
        super().barrier()


class StepClock(Trainer):
    """The real Trainer, noting when each optimizer step starts and ends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[float, float]] = []

    def train_step(self, micro_batches: list[list[int]], epoch: int, bare: Any = None, *rest: Any) -> dict[str, Any]:
        start = time.perf_counter()
        row = super().train_step(micro_batches, epoch, bare, *rest)
        self.steps.append((start, time.perf_counter()))
        return row


def test_no_collective_inside_a_step_and_none_per_step(tmp_path) -> None:
    counts = []
    for steps in (4, 8):
        cfg = config(
            workload="mlp", epochs=2, steps_per_epoch=steps, batch_size=8, warmup_steps=1, flush_every=100, accumulate=2
        )
        backend = RecordingBackend(cfg, NoOptions(), LaunchInfo(launcher=PYTHON))
        backend.init()
        trainer = fit(backend, cfg, tmp_path / f"s{steps}", trainer_cls=StepClock)
        assert len(trainer.steps) == 2 * steps + BASELINE_WARMUP_STEPS + cfg.compute_baseline_steps + READY_STEPS
        inside = [(name, t) for name, t in backend.calls for a, b in trainer.steps if a <= t <= b]
        assert not inside, f"collectives inside a timed step: {inside}"
        counts.append(len(backend.calls))
    # Collectives come per flush, epoch and validation; twice the steps must not add any.
    assert counts[0] == counts[1] > 0


# --- the epoch reaches the sampler ----------------------------------------------------------------


def test_each_epoch_trains_on_its_own_shuffle(tmp_path) -> None:
    cfg = config(workload="mlp", epochs=3, steps_per_epoch=4, batch_size=32, seed=3)
    fit(single_backend(cfg), cfg, tmp_path / "run")
    loss = pd.read_csv(tmp_path / "run" / "loss.csv")
    train = loss[loss["split"] == "train"]
    assert train["epoch"].tolist() == [1] * 4 + [2] * 4 + [3] * 4
    assert train["loss"].to_numpy() == pytest.approx(reference_train_losses(cfg), abs=1e-5)


# --- run.json is replaced whole or not at all -----------------------------------------------------


class Unwritable:
    def __str__(self) -> str:
        raise RuntimeError("cannot be written")


def test_a_failed_run_json_write_keeps_the_old_file_and_no_temp_file(tmp_path) -> None:
    path = tmp_path / results.RUN_JSON
    results.write_json_atomic(path, {"status": "running"})
    with pytest.raises(RuntimeError, match="cannot be written"):
        # Keys are sorted: "a" is written before "z" fails, so the write fails half-way.
        results.write_json_atomic(path, {"a": "x" * 10_000, "z": Unwritable()})
    assert json.loads(path.read_text()) == {"status": "running"}
    assert [p.name for p in tmp_path.iterdir()] == [results.RUN_JSON]


# --- 2 ranks: DDP on a real gloo group ----------------------------------------------------------


class BeforeValidation(Trainer):
    """Keeps each rank's own state as it was just before validation made the buffers equal."""

    def validate(self, epoch: int) -> dict[str, Any]:
        self.before = {k: v.clone() for k, v in self.raw_model.state_dict().items()}
        return super().validate(epoch)


def _two_ranks(rank: int, port: int, out: Path) -> None:
    """One rank of a 2-rank gloo group: the window combinations, then BatchNorm validation on cnn."""
    torch.set_num_threads(1)
    info = LaunchInfo(
        launcher=TORCHRUN,
        rank=rank,
        local_rank=rank,
        world_size=2,
        local_world_size=2,
        master_addr="127.0.0.1",
        master_port=port,
    )
    base = RunConfig(timeout=60)
    found: dict[str, Any] = {}
    backend = DDPBackend(base, DDPConfig(), info)
    backend.init()
    try:
        for warmup, flush_every in WINDOWS:
            cfg = window_config(warmup, flush_every)
            fit(backend, cfg, out / f"w{warmup}f{flush_every}" if rank == 0 else None)
        for sync in (False, True):
            backend.options = DDPConfig(broadcast_buffers=sync)
            cfg = config(workload="cnn", epochs=1, steps_per_epoch=4, batch_size=8, train_size=128, val_size=50)
            trainer = fit(backend, cfg, out / f"cnn-sync{sync}" if rank == 0 else None, BeforeValidation)
            assert isinstance(trainer, BeforeValidation)
            after = {k: v.clone() for k, v in trainer.raw_model.state_dict().items()}
            found[f"cnn-sync{sync}"] = {"before": trainer.before, "after": after}
    finally:
        backend.shutdown()
    torch.save(found, out / f"rank{rank}.pt")
    # As a completed rank does: gloo's threads outlive the group and can abort interpreter teardown.
    rendezvous.exit_process(0)


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("two-ranks")
    mp.start_processes(_two_ranks, args=(rendezvous.free_port(), out), nprocs=2, start_method="spawn")
    return out, [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("warmup", "flush_every"), WINDOWS)
def test_two_rank_window_holds_the_slowest_ranks_steps(two_rank_runs, warmup: int, flush_every: int) -> None:
    assert_window_holds_the_timed_steps(two_rank_runs[0] / f"w{warmup}f{flush_every}", straddle=0.25)


@torch.no_grad()
def evaluate(cfg: RunConfig, state: dict[str, torch.Tensor]) -> float:
    """Single-process validation loss of one model over the whole validation set."""
    workload = workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    model = workload.build_model()
    model.load_state_dict(state)
    model.eval()
    x, y = workload.val
    return float(workload.loss(model(x), y).double().mean())


@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [False, True])
def test_two_rank_validation_is_the_averaged_model(two_rank_runs, sync: bool) -> None:
    """BatchNorm statistics differ per rank; 2-rank validation must equal one process evaluating their mean."""
    out, states = two_rank_runs
    name = f"cnn-sync{sync}"
    before = [states[0][name]["before"], states[1][name]["before"]]
    ranks = [states[0][name]["after"], states[1][name]["after"]]
    # The ranks really did hold different statistics, so equal results are not equal by accident.
    assert not torch.equal(before[0]["1.running_mean"], before[1]["1.running_mean"])
    averaged = {k: (before[0][k] + before[1][k]) / 2 if v.is_floating_point() else v for k, v in before[0].items()}
    cfg = config(workload="cnn", epochs=1, steps_per_epoch=4, batch_size=8, train_size=128, val_size=50)
    loss = pd.read_csv(out / name / "loss.csv")
    val = loss[loss["split"] == "val"].iloc[-1]
    assert val["samples"] == 50
    assert val["loss"] == pytest.approx(evaluate(cfg, averaged), rel=1e-6)
    for key, value in ranks[0].items():  # every rank carries on with the model it validated: the mean
        assert torch.equal(value, ranks[1][key]), key
        assert torch.allclose(value.double(), averaged[key].double(), rtol=1e-6, atol=1e-7), key
    assert json.loads((out / name / "run.json").read_text())["validation_buffers"] == VALIDATION_BUFFERS
