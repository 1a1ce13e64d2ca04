"""The shared harness: the same train/validate loop for every backend.

Launch commands (from the repository root, inside `.venv`):

    torchrun --standalone --nproc-per-node 2 -m benchmarks.cli run --backend ddp --workload mlp
    horovodrun -np 2 --gloo python -m benchmarks.cli run --backend horovod --workload mlp
    mpirun -np 2 --oversubscribe python -m benchmarks.cli run --backend ddp --workload mlp
    python -m benchmarks.cli run --backend single --workload mlp --batch-size 64

Each step is timed on every rank with no collective inside the timed path: per-rank timings and
losses are buffered and gathered to rank 0 every `--flush-every` steps and at epoch end.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

import backends
from backends.base import Backend
from benchmarks import environment, faults, guard, launch, progress, results, sharding, workloads
from benchmarks.config import DDPConfig, HorovodConfig, InputError, RunConfig


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def default_threads(local_world_size: int) -> int:
    """Cores ÷ local ranks, at least 1: the same rule under every launcher."""
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))


def new_run_id(backend: str, workload: str, world_size: int) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", workload)
    return f"{stamp}-{backend}-{safe}-w{world_size}-{secrets.token_hex(2)}"


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


def _open_recorder(backend: Backend, cfg: RunConfig, meta: dict[str, Any]) -> results.Recorder | None:
    """Rank 0 creates the run directory; every rank learns whether that worked, so none hangs."""
    recorder, error = None, None
    run_dir = Path(cfg.out) / meta["run_id"]
    if backend.rank == 0:
        try:
            if cfg.overwrite and run_dir.exists():
                shutil.rmtree(run_dir)
            recorder = results.Recorder(run_dir, meta)
        except FileExistsError:
            error = f"run directory {run_dir} already exists; choose another --run-id or pass --overwrite"
        except OSError as exc:
            error = f"cannot write to --out {cfg.out} ({exc.strerror}); choose a writable --out"
    error = backend.broadcast_object(error)
    if error:
        raise InputError(error)
    return recorder


def load_checked_workload(cfg: RunConfig, world_size: int) -> workloads.Workload:
    """The workload, or an InputError when it cannot be built or gives a rank no full batch."""
    try:
        workload = workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    shard = len(workload.train[0]) // world_size
    if shard < cfg.batch_size * cfg.accumulate:
        raise InputError(
            f"--batch-size {cfg.batch_size} × --accumulate {cfg.accumulate} is larger than each rank's share "
            f"of the {len(workload.train[0])} training samples ({shard} on {world_size} ranks); "
            "lower --batch-size or raise --train-size"
        )
    return workload


def run(backend_name: str, cfg: RunConfig, ddp: DDPConfig, hvd: HorovodConfig) -> Path | None:
    """Run one benchmark inside whatever launched this process; rank 0 returns the run directory."""
    info = launch.detect()
    backend_cls = backends.get(backend_name)
    launch.check_supported(backend_name, backend_cls.launchers, info)
    workload = load_checked_workload(cfg, info.world_size)
    backend_cls.check_available()
    fault = faults.Fault.parse(cfg.inject_fault) if cfg.inject_fault else None
    threads = cfg.threads or default_threads(info.local_world_size)
    torch.set_num_threads(threads)
    started = _now()
    backend = backend_cls(cfg, ddp, hvd, info)
    recorder: results.Recorder | None = None
    run_dir: Path | None = None

    def record_failure(error: str) -> None:
        if recorder is not None and recorder.meta["status"] == "running":
            notes = [n for n in guard.read_failure_notes(recorder.run_dir) if n["rank"] != backend.rank]
            root = notes[0] if notes else {"rank": backend.rank, "error": error}
            recorder.finish("failed", end_time=_now(), error=root["error"], failed_rank=root["rank"],
                            rank0_error=error)  # fmt: skip
        elif run_dir is not None and backend.rank != 0:
            guard.write_failure_note(run_dir, backend.rank, error)

    guard.install_sigterm_watcher(lambda: record_failure("terminated by SIGTERM (a launcher stopping the job)"))
    watchdog = guard.Watchdog(cfg.timeout, record_failure)  # its grace lets collectives' own timeouts fire first
    backend.init()
    watchdog.beat()
    try:
        run_id = backend.broadcast_object(cfg.run_id or new_run_id(backend_name, cfg.workload, info.world_size))
        run_dir = Path(cfg.out) / run_id
        hosts = backend.all_gather_object({"host": socket.gethostname(), "node_rank": info.node_rank})
        meta = {
            "run_id": run_id, "backend": backend_name, "launcher": info.launcher,
            "launcher_detail": info.detail, "world_size": info.world_size,
            "local_world_size": info.local_world_size, "workload": cfg.workload,
            "global_batch": cfg.batch_size * cfg.accumulate * info.world_size,
            "train_size": len(workload.train[0]), "val_size": len(workload.val[0]),
            "config": dataclasses.asdict(cfg), "knobs": {}, "threads": threads,
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "optimizer": {"name": "SGD", "lr": cfg.lr, "momentum": 0.9},
            "versions": environment.versions(),
            "hosts": hosts, "command": sys.argv, "start_time": started,
            "host": socket.gethostname(), "pid": os.getpid(),
        }  # fmt: skip
        recorder = _open_recorder(backend, cfg, meta)
        trainer = Trainer(backend, workload, cfg, recorder, fault, watchdog)
        if recorder is not None:
            recorder.meta["knobs"] = backend.describe()
        trainer.fit()
        if recorder is not None:
            recorder.summary(trainer.timed_wall_s)
            recorder.finish("completed", end_time=_now(), timed_wall_s=trainer.timed_wall_s)
            return recorder.run_dir
        return None
    except BaseException as exc:
        if not isinstance(exc, InputError):
            record_failure(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        raise
    finally:
        watchdog.beat()  # shutting down may wait on peers too; give it a full timeout
        backend.shutdown()
        watchdog.stop()
