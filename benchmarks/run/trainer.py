"""The training loop every backend shares: timed steps with no collective inside, gathers between
steps, exact validation; and --eval-only's few untimed steps before timed validations (`evaluate_only`).
`harness.run` builds one and calls `fit()`; the trainer calls `validation`, never the reverse."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from backends import step as step_options
from backends.base import Backend
from benchmarks.config import RunConfig
from benchmarks.run import (
    data,
    faults,
    guard,
    memory,
    phases,
    progress,
    ready,
    sharding,
    stepper,
    validation,
    workloads,
)
from benchmarks.run import recorder as results
from benchmarks.run.stepper import describe_optimizer, make_optimizer
from benchmarks.run.validation import VALIDATION_BUFFERS

__all__ = ["VALIDATION_BUFFERS", "Trainer", "describe_optimizer", "make_optimizer"]


BASELINE_WARMUP_STEPS = 2
"""Untimed steps before the compute baseline: its fresh optimizer allocates momentum buffers once."""
BASELINE_COMPILE_STEPS = 8
"""Under --compile, up to this many more untimed steps, until one compiles nothing (the copy compiles anew)."""
BASELINE_PHASES = ("step_s", "data_s", "forward_s", "backward_s", "optimizer_s")
"""run.json `compute_baseline`: the median of each over the baseline's steps, each step its slowest rank's."""


class Trainer:
    """Trains and validates one workload on one backend; rank 0 records."""

    def __init__(
        self,
        backend: Backend,
        workload: workloads.Workload,
        cfg: RunConfig,
        recorder: results.Recorder | None,
        fault: faults.Fault | None = None,
        watchdog: guard.Watchdog | None = None,
    ) -> None:
        self.backend, self.workload, self.cfg, self.recorder = backend, workload, cfg, recorder
        self.fault, self.watchdog = fault, watchdog
        self.device = backend.device
        sharding.seed_everything(cfg.seed)
        self.memory = memory.Meter(self.device)  # before the model: training's own share is peak − this
        model = workload.build_model().to(self.device)
        self.checkpointed = step_options.checkpoint_blocks(model) if cfg.activation_checkpointing else []
        self.raw_model = backend.shard(model)  # FSDP2: the optimizer gets shards
        optimizer = make_optimizer(self.raw_model, cfg, workload)
        self.optimizer_meta = describe_optimizer(optimizer)
        self.training = stepper.trained(*backend.prepare(self.raw_model, optimizer), backend, cfg)
        self.memory.track(self.raw_model, self.training.optimizer, backend.held_state)
        self.autocast = step_options.autocast(cfg, self.device)
        self.warmup = stepper.Warmup(cfg, lambda mine: int(self._agree_max(mine)))
        self.train_feed = data.TrainFeed(workload.train, cfg, backend.rank, backend.world_size, self.device)
        self.validation = validation.Validation(backend, workload, cfg, self._beat)
        self.pending: list[dict[str, Any]] = []
        self.outside = phases.Outside()
        """Seconds outside the timed windows, by part (run.json `outside`; the harness adds its own parts)."""
        self.timer = phases.timer_for(self.device)
        """Times each step's phases: CUDA events on a GPU (one synchronisation per step), perf_counter on CPU."""
        self.global_step = 0
        self.timed_wall_s = 0.0
        self.compute_step_s: list[float] = []
        """The slowest rank's time of each compute-baseline step (empty when it is off)."""
        self.baseline: dict[str, Any] | None = None
        """run.json `compute_baseline`: its phases and the gradient-ready schedule (None when it is off)."""
        self._bare: stepper.Trained | None = None
        self._baseline_rows: list[list[float]] = []
        self.progress: progress.tqdm | progress.LineProgress | None = None
        self.step_record: dict[str, Any] | None = None
        """run.json `step` (measure_step), once trained."""
        if recorder is not None:
            recorder.meta["validation_buffers"] = VALIDATION_BUFFERS

    def _beat(self) -> None:
        if self.watchdog is not None:
            self.watchdog.beat()

    def steps_in_epoch(self, epoch: int) -> list[list[list[int]]]:
        """This rank's optimizer steps for an epoch, each a list of `accumulate` micro-batches."""
        cfg, backend = self.cfg, self.backend
        micro = sharding.train_batches(
            data.size(self.workload.train), cfg.batch_size, backend.rank, backend.world_size, epoch, cfg.seed
        )
        k = cfg.accumulate
        steps = [micro[i : i + k] for i in range(0, len(micro) - k + 1, k)]
        return steps[: cfg.steps_per_epoch] if cfg.steps_per_epoch is not None else steps

    def train_step(
        self,
        micro_batches: list[list[int]],
        epoch: int,
        bare: stepper.Trained | None = None,
        around_last_backward: tuple[Callable[[], None], Callable[[], None]] | None = None,
    ) -> dict[str, Any]:
        """One optimizer step, timed phase by phase; nothing here talks to other ranks but the framework's own
        gradient reduction. Backward and the optimizer step are the backend's (`Trained.via`).

        `bare`: a copy to step instead (the compute baseline), outside the backend or inside it alone.
        `around_last_backward`: called just before and just after the last micro-batch's backward (the
        gradient-ready schedule's clock).
        """
        trains = bare or self.training
        k = len(micro_batches)
        kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        timer = self.timer
        timer.start()
        for i, batch in enumerate(micro_batches):
            x, y = self.train_feed.fetch(batch)  # waiting for a DataLoader counts here, in data_s
            timer.lap("data")
            last = i == k - 1
            with trains.via.accumulation(trains.model, last):
                with self.autocast:
                    out = trains.call(x)
                    per_sample = self.workload.loss(out, y)
                loss = per_sample.mean() / k
                timer.lap("forward")
                if last and around_last_backward is not None:
                    around_last_backward[0]()
                trains.via.backward(loss, trains.scaler)
                if last and around_last_backward is not None:
                    around_last_backward[1]()
                timer.lap("backward")
            kept.append((per_sample.detach(), out.detach(), y))
        trains.via.optimizer_step(trains.model, trains.optimizer, trains.scaler)  # unscale, clip, step, zero
        timer.lap("optimizer")
        phase, step_s = timer.finish()  # on CUDA the step's one host synchronisation
        trains.note_scale()
        # Off the clock. On CUDA the sums stay on the device until `flush`: reading them here would be
        # a second host synchronisation per step, and the host could no longer run ahead into the next.
        correct = self.workload.correct
        return {
            "epoch": epoch,
            "step": self.global_step,
            "warmup": self.global_step <= self.cfg.warmup_steps,
            "samples": sum(len(b) for b in micro_batches),
            "data_s": phase["data"],
            "forward_s": phase["forward"],
            "backward_s": phase["backward"],
            "optimizer_s": phase["optimizer"],
            "step_s": step_s,
            "loss_sum": self._total([p.double().sum() for p, _, _ in kept]),
            "correct_sum": self._total([correct(o, t).double().sum() for _, o, t in kept]) if correct else None,
        }

    def _total(self, sums: list[torch.Tensor]) -> float | list[torch.Tensor]:
        """The float now on CPU; on CUDA the device tensors, which `flush` adds up the same way."""
        return sums if self.device.type == "cuda" else sum(float(s) for s in sums)

    def flush(self) -> float:
        """Gather buffered rows to rank 0 (collectives, so never called inside a timed step).

        Returns the seconds spent once every rank had arrived: the part the timed window leaves out.
        Waiting for the slowest rank to end its step stays in the window, since that is step time.
        """
        self.backend.barrier()
        start = time.perf_counter()
        for row in self.pending:  # CUDA: the device sums train_step left unread
            for key in ("loss_sum", "correct_sum"):
                if isinstance(row[key], list):
                    row[key] = sum(float(s) for s in row[key])
        gathered = self.backend.all_gather_object([self.pending, self.backend.rank])
        self.pending = []
        if self.recorder is not None:
            self._record(gathered, self.recorder)
        # All ranks leave together: otherwise the others' next step would wait for rank 0's writing inside
        # a gradient reduction, and that time, taken out of the window, would count in their step_s.
        self.backend.barrier()
        return time.perf_counter() - start

    def _record(self, gathered: list[Any], recorder: results.Recorder) -> None:
        """Rank 0: write the gathered rows to timing.csv and loss.csv."""
        losses = recorder.gathered(gathered)
        if self.progress is not None and losses:
            self.progress.set_postfix_str(progress.loss_words(losses[-1]))

    def validate(self, epoch: int) -> dict[str, Any]:
        """One timed validation under --val-strategy (benchmarks.run.validation); its loss.csv row."""
        return self.validation.run(self.raw_model, epoch, self.global_step, self.recorder)

    def _agree_max(self, mine: float) -> float:
        """The largest of the ranks' values (a collective: never inside a timed step)."""
        return float(self.backend.all_reduce(torch.tensor([mine], dtype=torch.float64, device=self.device), "max"))

    def _longest_window(self, seconds: float) -> float:
        """The longest of the ranks' timed windows (gathers left out), each on its own clock.

        Every rank's timed steps then fit inside it; rank 0's alone would not hold another rank's steps
        when rank 0 is descheduled while leaving a gather and the others are already stepping.
        """
        return self._agree_max(seconds)

    def compute_baseline(self, plan: list[list[list[list[int]]]], chunk: int | None = None) -> list[float]:
        """Time --compute-baseline-steps steps of this rank's own batches with no gradient communication.

        A copy of the model with a bare optimizer of the same kind does the same forward, backward and
        update per step as training, and every rank runs at once, so the cores are as busy as in training;
        only the backend's communication is left out (`Backend.baseline_copy`). With `chunk`
        (--compute-baseline-spread: 0-based, after that epoch's validation) it times that epoch's share and
        returns nothing; the last call, without it, times what is left, the gradient-ready schedule, and
        returns the slowest rank's time of each step (gathered then).
        """
        n = self.cfg.compute_baseline_steps
        if n == 0:
            return []
        epochs = len(plan)
        share = n if chunk is None else n * (chunk + 1) // epochs - n * chunk // epochs
        if chunk is None and self.cfg.compute_baseline_spread:
            share = n - len(self._baseline_rows)
        # Mid-training a loader's batches are replayed only while the baseline runs; the next epoch reopens it.
        self.train_feed.replaying = True
        if self._bare is None:  # a copy: training's weights and optimizer state stay as they are
            # A sharded copy (FSDP2 over this rank alone) steps inside its backend; a plain one outside any.
            via = step_options.Recipe(self.cfg, self.device) if self.backend.baseline_is_plain else self.backend
            self._bare = self._copy(self.backend.baseline_copy, via)
        steps = [step for epoch in plan for step in epoch]
        self.backend.barrier()
        done = 0
        while done < BASELINE_WARMUP_STEPS + BASELINE_COMPILE_STEPS:  # untimed: until a step compiles nothing
            before = step_options.compile_events()
            self.train_step(steps[done % len(steps)], 0, self._bare)
            done += 1
            self._beat()
            if done >= BASELINE_WARMUP_STEPS and step_options.compile_events() == before:
                break
        for i in range(done, done + share):
            row = self.train_step(steps[i % len(steps)], 0, self._bare)
            self._baseline_rows.append([row[k] for k in BASELINE_PHASES])
            self._beat()
        if chunk is not None:
            self.train_feed.replaying = False
            return []
        taken = [done + share]  # the steps after the timed ones, in turn
        # Steps of its own, after the timed ones, on a model whose parameters take their gradients in backward.
        if not self.backend.baseline_is_plain:
            self._bare = None  # its timed steps are done: two full copies at once would double the baseline's memory
        clocked_on = self._bare or self._copy(self.backend.full_copy, step_options.Recipe(self.cfg, self.device))

        def clocked(begin: Callable[[], None], end: Callable[[], None]) -> None:
            self.train_step(steps[taken[0] % len(steps)], 0, clocked_on, (begin, end))
            taken[0] += 1
            self._beat()

        schedule = ready.measure(clocked_on.model, clocked, self.device)
        gathered = self.backend.all_gather_object(self._baseline_rows)
        slowest = [max(rows, key=lambda r: r[0]) for rows in zip(*gathered, strict=True)]
        self.baseline = {
            "steps": n,
            **{k: statistics.median(r[i] for r in slowest) for i, k in enumerate(BASELINE_PHASES)},
            "ready": schedule,
            "copy": "plain" if self.backend.baseline_is_plain else f"{self.backend.name} over this rank alone",
        }
        return [r[0] for r in slowest]

    def measure_step(self, plan: list[list[list[list[int]]]]) -> dict[str, Any]:
        """run.json `step`, off the clock once training is over (stepper.measure)."""
        self.train_feed.replaying = True
        x, y = self.train_feed.fetch(plan[0][0][0])
        return stepper.measure(
            self.cfg, self.backend, self.training, self.warmup, self.checkpointed, self.workload, x, y
        )

    def _copy(self, how: Callable[[nn.Module, Callable[[], nn.Module]], nn.Module], via: Any) -> stepper.Trained:
        """A copy of the model made by the backend's `how`, with a bare optimizer of training's kind, stepped as
        training is (the same step options) by `via`."""
        model = step_options.apply(how(self.raw_model, self.workload.build_model), self.cfg)
        return stepper.trained(model, make_optimizer(model, self.cfg, self.workload), via, self.cfg, self.training)

    def trace(self, plan: list[list[list[list[int]]]], directory: Path | None) -> dict[str, Any]:
        """Train --trace-steps more steps under the backend's tracer; rank 0 writes into `directory`.

        They come after the last validation and the compute baseline, so no recorded number includes
        the tracer's overhead.
        """
        steps = [step for epoch in plan for step in epoch]
        self.train_feed.replaying = True
        self.backend.barrier()
        with self.backend.trace(directory) as found:
            for i in range(self.cfg.trace_steps):
                self.global_step += 1
                self.train_step(steps[i % len(steps)], len(plan))
                self._beat()
        self.backend.barrier()
        return {"steps": self.cfg.trace_steps, **found}

    def fit(self) -> None:
        cfg = self.cfg
        if cfg.eval_only:
            return self.evaluate_only()
        plan = [self.steps_in_epoch(epoch) for epoch in range(cfg.epochs)]
        self.progress = progress.progress(
            sum(map(len, plan)),
            f"{self.backend.name} {self.workload.name}",
            enabled=not cfg.quiet and self.backend.rank == 0,
        )
        for epoch, steps in enumerate(plan, start=1):
            epoch_start = time.perf_counter()
            self.train_feed.start_epoch(epoch - 1)  # a DataLoader's workers start here, before the window
            window_start: float | None = None
            flush_s = 0.0
            for step in steps:
                self.global_step += 1
                if self.fault is not None:
                    self.fault.maybe_fire(self.global_step, self.backend.rank)
                if window_start is None and self.global_step > cfg.warmup_steps and self.warmup.settled():
                    self.backend.barrier()  # all ranks enter the timed window together
                    window_start = time.perf_counter()
                    self.outside.add("warmup", window_start - epoch_start)
                self.warmup.start()
                row = self.train_step(step, epoch)
                row["warmup"] = window_start is None  # --compile: the warm-up lasts until nothing compiles
                self.warmup.finish(row["step_s"], timed=window_start is not None)
                self.pending.append(row)
                self._beat()
                self.progress.update()
                if len(self.pending) >= cfg.flush_every:
                    spent = self.flush()
                    if window_start is not None:  # a warm-up gather happened before the window opened
                        flush_s += spent
            closed = time.perf_counter()
            if window_start is not None:
                self.backend.barrier()
                self.timed_wall_s += self._longest_window(time.perf_counter() - window_start - flush_s)
            else:  # no window this epoch: all of it was warm-up
                self.outside.add("warmup", closed - epoch_start)
            self.flush()
            self.outside.add("gathers", time.perf_counter() - closed + flush_s)
            self._beat()
            with self.outside.timing("validation"):
                val = self.validate(epoch)
            if self.recorder is not None:
                self.recorder.loss([val])
            if cfg.compute_baseline_spread and epoch < len(plan):
                with self.outside.timing("baseline"):
                    self.compute_baseline(plan, epoch - 1)
        self.progress.close()
        peaks = self.backend.all_gather_object(self.memory.read())  # training is over: off the timed path
        if self.recorder is not None:
            self.recorder.memory(peaks)
        with self.outside.timing("baseline"):
            self.compute_step_s = self.compute_baseline(plan)
        with self.outside.timing("step_measure"):
            self.step_record = self.measure_step(plan)
        if cfg.trace:
            directory = self.recorder.run_dir / "trace" if self.recorder is not None else None
            with self.outside.timing("trace"):
                traced = self.trace(plan, directory)
            if self.recorder is not None:
                self.recorder.meta["trace"] = traced
        self.train_feed.close()
        self.validation.close()
        # Leave together. With DDP the gloo process group outlives destroy_process_group (DDP keeps it and
        # its threads until exit) and, under mpirun, MPI_Finalize makes every rank exit at the same moment;
        # no rank may then still be inside the last collective while a peer tears its sockets down.
        self.backend.barrier()

    def evaluate_only(self) -> None:
        """`--eval-only`: --eval-train-steps untimed training steps (none recorded), then --eval-repeats timed
        validations of the model, recorded as epoch 0's `val` rows with `val_pass` 1 … R."""
        cfg, backend, recorder = self.cfg, self.backend, self.recorder
        epoch, trained = 0, 0
        while trained < cfg.eval_train_steps:  # whole epochs' orders, as fit would give them, cut at K steps
            steps = self.steps_in_epoch(epoch)[: cfg.eval_train_steps - trained]
            self.train_feed.start_epoch(epoch)
            for step in steps:
                self.global_step += 1
                self.train_step(step, epoch + 1)
                self._beat()
            trained, epoch = trained + len(steps), epoch + 1
        if recorder is not None:
            recorder.meta["eval_only"] = {"train_steps": cfg.eval_train_steps, "repeats": cfg.eval_repeats}
        backend.barrier()
        for repeat in range(1, cfg.eval_repeats + 1):
            row = self.validation.run(self.raw_model, 0, self.global_step, recorder, repeat)
            if recorder is not None:
                recorder.loss([row])
        peaks = backend.all_gather_object(self.memory.read())
        if recorder is not None:
            recorder.memory(peaks)
        self.train_feed.close()
        self.validation.close()
        backend.barrier()  # leave together, as fit does
