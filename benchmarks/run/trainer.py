"""The training loop every backend shares: timed steps with no collective inside, gathers between
steps, exact validation. `harness.run` builds one and calls `fit()`."""

from __future__ import annotations

import time
from typing import Any

import torch

from backends.base import Backend
from benchmarks.config import RunConfig
from benchmarks.run import faults, guard, progress, sharding, workloads
from benchmarks.run import recorder as results


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
        self.raw_model = workload.build_model().to(self.device)
        optimizer = torch.optim.SGD(self.raw_model.parameters(), lr=cfg.lr, momentum=0.9)
        self.model, self.optimizer = backend.prepare(self.raw_model, optimizer)
        self.pending: list[dict[str, Any]] = []
        self.global_step = 0
        self.timed_wall_s = 0.0
        self.progress: progress.tqdm | progress.LineProgress | None = None

    def _beat(self) -> None:
        if self.watchdog is not None:
            self.watchdog.beat()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def steps_in_epoch(self, epoch: int) -> list[list[list[int]]]:
        """This rank's optimizer steps for an epoch, each a list of `accumulate` micro-batches."""
        cfg, backend = self.cfg, self.backend
        micro = sharding.train_batches(
            len(self.workload.train[0]), cfg.batch_size, backend.rank, backend.world_size, epoch, cfg.seed
        )
        k = cfg.accumulate
        steps = [micro[i : i + k] for i in range(0, len(micro) - k + 1, k)]
        return steps[: cfg.steps_per_epoch] if cfg.steps_per_epoch is not None else steps

    def train_step(self, micro_batches: list[list[int]], epoch: int) -> dict[str, Any]:
        """One optimizer step, timed phase by phase; nothing here talks to other ranks."""
        x_all, y_all = self.workload.train
        k = len(micro_batches)
        data_s = forward_s = backward_s = 0.0
        kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        start = time.perf_counter()
        for i, batch in enumerate(micro_batches):
            t0 = time.perf_counter()
            index = torch.tensor(batch)
            x, y = x_all[index].to(self.device), y_all[index].to(self.device)
            self._sync()
            t1 = time.perf_counter()
            with self.backend.accumulation(self.model, last_micro_batch=i == k - 1):
                out = self.model(x)
                per_sample = self.workload.loss(out, y)
                loss = per_sample.mean() / k
                self._sync()
                t2 = time.perf_counter()
                loss.backward()
                self._sync()
                t3 = time.perf_counter()
            data_s, forward_s, backward_s = data_s + t1 - t0, forward_s + t2 - t1, backward_s + t3 - t2
            kept.append((per_sample.detach(), out.detach(), y))
        t4 = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad()  # set_to_none, the default; Horovod takes no argument
        self._sync()
        end = time.perf_counter()
        # Off the clock: reading losses forces a device sync, so it comes after the step is timed.
        correct = self.workload.correct
        return {
            "epoch": epoch, "step": self.global_step, "warmup": self.global_step <= self.cfg.warmup_steps,
            "samples": sum(len(b) for b in micro_batches), "data_s": data_s, "forward_s": forward_s,
            "backward_s": backward_s, "optimizer_s": end - t4, "step_s": end - start,
            "loss_sum": sum(float(p.double().sum()) for p, _, _ in kept),
            "correct_sum": sum(float(correct(o, t).double().sum()) for _, o, t in kept) if correct else None,
        }  # fmt: skip

    def flush(self) -> None:
        """Gather buffered rows to rank 0 (a collective, so never called inside a timed step)."""
        gathered = self.backend.all_gather_object([self.pending, self.backend.rank])
        self.pending = []
        if self.recorder is None:
            return
        meta = self.recorder.meta
        common = {"run_id": meta["run_id"], "backend": meta["backend"], "world_size": meta["world_size"]}
        timing, by_step = [], {}
        for rows, rank in gathered:
            for row in rows:
                timing.append({**common, "rank": rank, **{c: row[c] for c in results.TIMING_COLUMNS if c in row}})
                acc = by_step.setdefault(
                    row["step"],
                    {
                        "epoch": row["epoch"],
                        "loss": 0.0,
                        "correct": 0.0,
                        "samples": 0,
                        "has_acc": row["correct_sum"] is not None,
                    },
                )
                acc["loss"] += row["loss_sum"]
                acc["correct"] += row["correct_sum"] or 0.0
                acc["samples"] += row["samples"]
        timing.sort(key=lambda r: (r["step"], r["rank"]))
        losses = [
            {**common, "epoch": a["epoch"], "step": step, "split": "train", "loss": a["loss"] / a["samples"],
             "accuracy": a["correct"] / a["samples"] if a["has_acc"] else None, "samples": a["samples"]}
            for step, a in sorted(by_step.items())
        ]  # fmt: skip
        self.recorder.timing(timing)
        self.recorder.loss(losses)
        if self.progress is not None and losses:
            self.progress.set_postfix(loss=f"{losses[-1]['loss']:.4f}")

    @torch.no_grad()
    def validate(self, epoch: int) -> dict[str, Any]:
        """Exact distributed validation: every sample once; sums and counts reduced, not averages."""
        x_all, y_all = self.workload.val
        mine = sharding.val_indices(len(x_all), self.backend.rank, self.backend.world_size)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct sum, count
        self.raw_model.eval()  # the unwrapped model: DDP's forward would broadcast buffers
        for batch in sharding.chunks(mine, self.cfg.batch_size):
            index = torch.tensor(batch, dtype=torch.long)
            x, y = x_all[index].to(self.device), y_all[index].to(self.device)
            out = self.raw_model(x)
            totals[0] += self.workload.loss(out, y).double().sum()
            if self.workload.correct is not None:
                totals[1] += self.workload.correct(out, y).double().sum()
            totals[2] += len(batch)
            self._beat()
        self.raw_model.train()
        loss_sum, correct_sum, count = self.backend.all_reduce(totals, "sum").tolist()
        meta = self.recorder.meta if self.recorder else {}
        return {
            "run_id": meta.get("run_id"), "backend": meta.get("backend"), "world_size": meta.get("world_size"),
            "epoch": epoch, "step": self.global_step, "split": "val", "loss": loss_sum / count,
            "accuracy": correct_sum / count if self.workload.correct is not None else None,
            "samples": int(count),
        }  # fmt: skip

    def fit(self) -> None:
        cfg = self.cfg
        plan = [self.steps_in_epoch(epoch) for epoch in range(cfg.epochs)]
        self.progress = progress.progress(
            sum(map(len, plan)), f"{self.backend.name} {self.workload.name}",
            enabled=not cfg.quiet and self.backend.rank == 0,
        )  # fmt: skip
        for epoch, steps in enumerate(plan, start=1):
            window_start: float | None = None
            flush_s = 0.0
            for step in steps:
                self.global_step += 1
                if self.fault is not None:
                    self.fault.maybe_fire(self.global_step, self.backend.rank)
                if window_start is None and self.global_step > cfg.warmup_steps:
                    self.backend.barrier()  # all ranks enter the timed window together
                    window_start = time.perf_counter()
                self.pending.append(self.train_step(step, epoch))
                self._beat()
                self.progress.update()
                if len(self.pending) >= cfg.flush_every:
                    t0 = time.perf_counter()
                    self.flush()
                    flush_s += time.perf_counter() - t0
            if window_start is not None:
                self.backend.barrier()
                self.timed_wall_s += time.perf_counter() - window_start - flush_s
            self.flush()
            self._beat()
            val = self.validate(epoch)
            if self.recorder is not None:
                self.recorder.loss([val])
        self.progress.close()
