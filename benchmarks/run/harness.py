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

import contextlib
import dataclasses
import datetime
import os
import re
import secrets
import shutil
import socket
import sys
import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

import backends
from backends import horovod_autotune
from backends.base import Backend
from benchmarks import config, environment, launch
from benchmarks.config import RunConfig
from benchmarks.errors import InputError
from benchmarks.launch import placement
from benchmarks.run import data, faults, fingerprint, guard, workloads
from benchmarks.run import recorder as results
from benchmarks.run.trainer import Trainer


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def oversubscribed(local_world_size: int) -> bool:
    """More ranks on this host than cores: such a run measures time-slicing, not scaling."""
    return local_world_size > (os.cpu_count() or 1)


def gradient_bytes(params: Sequence[torch.nn.Parameter], cfg: RunConfig, backend_name: str) -> int:
    """Bytes each rank allreduces per optimizer step: every gradient once, in fp16 with --fp16-allreduce."""
    if backend_name in backends.ONE_PROCESS:
        return 0
    return sum(p.numel() * (2 if cfg.fp16_allreduce and p.is_floating_point() else p.element_size()) for p in params)


def new_run_id(backend: str, workload: str, world_size: int) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", workload)
    return f"{stamp}-{backend}-{safe}-w{world_size}-{secrets.token_hex(2)}"


def existing_run_dir(run_dir: Path) -> str:
    return f"run directory {run_dir} already exists; choose another --run-id or pass --overwrite"


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
            error = existing_run_dir(run_dir)
        except OSError as exc:
            error = f"cannot write to --out {cfg.out} ({exc.strerror}); choose a writable --out"
    error = backend.broadcast_object(error)
    if error:
        raise InputError(error)
    return recorder


PEER_LOST = re.compile(
    r"Connection reset|Connection closed|Broken pipe|timed? ?out|Timeout|HorovodInternalError|peer|SIGTERM",
    re.IGNORECASE,
)
"""What rank 0 sees when another rank was killed or hung: a collective's error (gloo, Horovod), its own
watchdog, or the launcher's SIGTERM sent because a rank exited."""


RECORD_WAIT_S = 20.0

LAUNCHER_PARENTS = (launch.TORCHRUN, launch.MPIRUN, launch.HOROVODRUN)
"""Launchers whose ranks are their own children (horovodrun's through a shell it watches): a rank whose
parent changes has lost its launcher. Not python (a shell may leave a run it started) nor srun."""


class RunFailed(RuntimeError):
    """A run that started failed; its error is recorded in run.json (rank 0), and this says it in one line."""

    exit_code = 1
    """A signal's stop exits 128 + the signal from the watcher thread instead (benchmarks.run.guard)."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, guard.LauncherGone):  # says why in words already
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _first_two(samples: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples 0 and 1 as one batch, collated as a DataLoader would."""
    if isinstance(samples, tuple):
        return samples[0][:2], samples[1][:2]
    return default_collate([samples[i] for i in range(min(2, len(samples)))])


def shape_hint(shape: tuple[int, ...] | str, batch: int) -> str:
    """How to turn what a loss returned into one value per sample."""
    if isinstance(shape, tuple) and len(shape) > 1 and shape[0] == batch:
        dims = "dim=1" if len(shape) == 2 else f"dim={tuple(range(1, len(shape)))}"
        return f"reduce over the dimensions after the first, e.g. .mean({dims})"
    return "return it unreduced, e.g. F.cross_entropy(out, target, reduction='none')"


def check_workload(workload: workloads.Workload, name: str) -> None:
    """Catch a malformed workload up front, in one line.

    A loss reduced to a mean would still train, on a gradient divided by the batch size, so the shape
    of the loss on two samples is checked here rather than trusted.
    """

    def problem(text: str) -> InputError:
        return InputError(f"workload '{name}': {text}")

    for split in ("train", "val"):
        samples = getattr(workload, split)
        if isinstance(samples, tuple):
            if not (len(samples) == 2 and all(isinstance(t, torch.Tensor) for t in samples)):
                raise problem(f"{split} must be a tuple (inputs, targets) of tensors or a map-style Dataset")
            if len(samples[0]) != len(samples[1]) or len(samples[0]) == 0:
                raise problem(
                    f"{split} has {len(samples[0])} inputs and {len(samples[1])} targets; both must be equal and > 0"
                )
            continue
        if not isinstance(samples, Dataset) or isinstance(samples, IterableDataset) or not hasattr(samples, "__len__"):
            raise problem(
                f"{split} is {type(samples).__name__}; give a tuple (inputs, targets) of tensors or a map-style "
                "torch.utils.data.Dataset with __len__ and __getitem__"
            )
        try:
            count, item = len(samples), samples[0] if len(samples) else None
        except Exception as exc:
            raise problem(f"reading {split}[0] failed: {_describe(exc)}") from exc
        if count == 0:
            raise problem(f"{split} is an empty Dataset")
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise problem(
                f"{split}[0] is {type(item).__name__}; a Dataset's item i must be the pair (input, target) of sample i"
            )
    try:
        model = workload.build_model()
        if not isinstance(model, torch.nn.Module):
            raise problem(f"build_model() returned {type(model).__name__}, not a torch.nn.Module")
        x, y = _first_two(workload.train)
        model.eval()  # a throwaway copy: no BatchNorm statistics of the real model move
        with torch.no_grad():
            out = model(x)
            checks = {"loss": workload.loss(out, y)}
            if workload.correct is not None:
                checks["correct"] = workload.correct(out, y)
    except InputError:
        raise
    except Exception as exc:
        raise problem(f"a forward pass and loss on the first training samples failed: {_describe(exc)}") from exc
    for fn, value in checks.items():
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        if shape != (len(x),):
            raise problem(
                f"{fn}(out, target) must give one value per sample (shape ({len(x)},) for 2 samples), got {shape}; "
                + shape_hint(shape, len(x))
            )
    if workload.optimizer is not None:  # its own optimizer: built on the throwaway model, so a bad one is bad input
        try:
            optimizer = workload.optimizer(model, 0.01)
        except Exception as exc:
            raise problem(f"optimizer(model, lr) failed: {_describe(exc)}") from exc
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise problem(f"optimizer(model, lr) returned {type(optimizer).__name__}, not a torch.optim.Optimizer")


def load_checked_workload(cfg: RunConfig, world_size: int, options: Any = None) -> workloads.Workload:
    """The workload, or an InputError when it cannot be built, is malformed, or gives a rank no timed step."""
    try:
        workload = workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    check_workload(workload, cfg.workload)
    train_size = data.size(workload.train)
    shard = train_size // world_size
    if shard < cfg.batch_size * cfg.accumulate:
        raise InputError(
            f"--batch-size {cfg.batch_size} × --accumulate {cfg.accumulate} is larger than each rank's share "
            f"of the {train_size} training samples ({shard} on {world_size} ranks); "
            "lower --batch-size or raise --train-size"
        )
    steps = shard // cfg.batch_size // cfg.accumulate  # what sharding.train_batches gives each rank
    steps = min(steps, cfg.steps_per_epoch or steps)
    if cfg.epochs * steps <= cfg.warmup_steps and not cfg.eval_only:  # --eval-only times no training step
        raise config.no_timed_steps(cfg, steps)
    if getattr(options, "autotune", False) and not cfg.eval_only:  # Horovod's autotuner searches in the warm-up
        horovod_autotune.check_steps(cfg.warmup_steps, cfg.epochs * steps, os.environ, horovod_autotune.gpu_build())
    return workload


def run(
    backend_name: str,
    cfg: RunConfig,
    options: Any,
    given: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    explicit: Collection[str] = frozenset(),
) -> Path | None:
    """Run one benchmark inside whatever launched this process; rank 0 returns the run directory.

    `given` is every option the user passed (other backends' too), recorded in run.json `config` next to
    the values in effect; rank 0 prints `notes` once the input has passed every check. A failure after
    start-up is recorded in run.json, said in one line by rank 0 (even when a signal or the watchdog ends
    it), and raised as RunFailed. `explicit` names the options given on the command line: an exported
    variable that one of them also sets is adopted only when it was not (benchmarks.environment.adopt).
    """
    user_env = environment.recorded_variables(os.environ)  # as the user gave it: nothing of ours is set yet
    cfg = workloads.resolve(cfg)
    info = launch.detect()
    backend_cls = backends.get(backend_name)
    launch.check_supported(backend_name, backend_cls.launchers, info)
    cfg, options, adopted = environment.adopt_for_run(
        cfg, options, explicit, os.environ, info.launcher, info.local_world_size
    )
    notes = [*notes, *environment.adoption_notes(adopted)]
    placement.apply(cfg.bind, info.local_rank, info.local_world_size)
    workload = load_checked_workload(cfg, info.world_size, options)
    backend_cls.check_model(workload.build_model, options)  # e.g. an FSDP unit policy that names nothing
    data_print = fingerprint.of_data(workload.train, workload.val)  # compared across ranks once they have joined
    workload, weight_prints = fingerprint.recording(workload)
    backend_cls.check_available()
    if cfg.run_id and not cfg.overwrite and (Path(cfg.out) / cfg.run_id).exists():
        # Caught here, before any rank joins a job, rather than only by rank 0 after start-up.
        raise InputError(existing_run_dir(Path(cfg.out) / cfg.run_id))
    fault = faults.Fault.parse(cfg.inject_fault) if cfg.inject_fault else None
    threads = cfg.threads or launch.default_threads(info.local_world_size)
    torch.set_num_threads(threads)
    if info.rank == 0:
        for note in notes:
            print(note, file=sys.stderr, flush=True)
    started = _now()
    backend = backend_cls(cfg, options, info)
    recorder: results.Recorder | None = None
    run_dir: Path | None = None

    # Held while a failure is written: the signal watcher exits the process right after its own (skipped)
    # record, which must not cut short the main thread's write of run.json (an fsync can take seconds on a
    # busy disk). Bounded all the same: a failure must be written even if the lock is never released.
    recording = threading.Lock()

    def record_failure(error: str) -> None:
        held = recording.acquire(timeout=RECORD_WAIT_S)
        try:
            if recorder is not None and recorder.meta["status"] == "running":
                notes = [n for n in guard.read_failure_notes(recorder.run_dir) if n["rank"] != backend.rank]
                if notes:
                    root = notes[0]
                elif PEER_LOST.search(error):  # a rank killed or hung leaves no note: rank 0 only saw it go
                    root = {"rank": None, "error": f"another rank died or stopped answering (rank 0 saw: {error})"}
                else:
                    root = {"rank": backend.rank, "error": error}
                recorder.finish("failed", end_time=_now(), error=root["error"], failed_rank=root["rank"],
                                rank0_error=error)  # fmt: skip
            elif run_dir is not None and backend.rank != 0:
                guard.write_failure_note(run_dir, backend.rank, error)
        finally:
            if held:
                recording.release()

    said = threading.Lock()  # the main thread, the SIGTERM watcher and the watchdog may all fail the run

    def fail(error: str) -> str:
        """Record the failure; rank 0 says it once, naming the root cause's rank and the run directory."""
        record_failure(error)
        meta = recorder.meta if recorder is not None else {"error": error}
        rank = f" on rank {meta['failed_rank']}" if meta.get("failed_rank") is not None else ""
        where = f"; details in {recorder.run_dir / 'run.json'}" if recorder is not None else ""
        # The recorder's lock may be held elsewhere when a signal comes: its meta then lacks the error.
        message = f"run failed{rank}: {meta.get('error') or error}{where}"
        if backend.rank == 0 and said.acquire(blocking=False):
            with contextlib.suppress(OSError):  # a launcher killed outright took the pipe with it
                print(f"distbench: error: {message}", file=sys.stderr, flush=True)
        return message

    def stop_on_signal(why: str) -> None:
        fail(why)
        if recorder is not None:  # the process exits next: no row may be half-appended when it does
            recorder.lock.acquire(timeout=RECORD_WAIT_S)
        elif run_dir is not None:  # exiting first would let mpirun SIGKILL rank 0 before it records
            guard.wait_for_record(run_dir / results.RUN_JSON)

    guard.install_signal_watcher(stop_on_signal)
    # Under a launcher, the parent is the launcher: one killed outright cannot stop its ranks any more.
    parent = os.getppid() if info.launcher in LAUNCHER_PARENTS else None
    watchdog = guard.Watchdog(cfg.timeout, fail, parent=parent)  # its grace lets collectives' timeouts fire first
    try:
        backend.init()
    except (InputError, launch.WrongLauncherError):
        watchdog.stop()
        raise
    except Exception as exc:
        watchdog.stop()
        raise RunFailed(fail(f"the {backend_name} backend could not start: {_describe(exc)}")) from exc
    watchdog.beat()
    try:
        run_id = backend.broadcast_object(cfg.run_id or new_run_id(backend_name, cfg.workload, info.world_size))
        hosts = backend.all_gather_object({"host": socket.gethostname(), "node_rank": info.node_rank})
        ranks = backend.all_gather_object(
            {"placement": placement.of_rank(backend.device.type, backend.device.index), "environment": user_env}
        )
        fingerprint.check_data(data_print, backend.all_gather_object, cfg.workload)  # bad input: no run directory
        meta = {
            "run_id": run_id, "backend": backend_name, "launcher": info.launcher,
            "launcher_detail": info.detail, "world_size": info.world_size,
            "local_world_size": info.local_world_size, "workload": cfg.workload,
            "oversubscribed": oversubscribed(info.local_world_size), "cpus": os.cpu_count(),
            "global_batch": cfg.batch_size * cfg.accumulate * info.world_size,
            "train_size": data.size(workload.train), "val_size": data.size(workload.val),
            "workload_args": workload.args,
            "config": {**(given or {}), **dataclasses.asdict(cfg), **dataclasses.asdict(options)},
            "workload_source": workloads.source(cfg.workload), "knobs": {}, "threads": threads,
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "placement": placement.record(cfg.bind, [r["placement"] for r in ranks]),
            "environment": {**environment.by_rank([r["environment"] for r in ranks]), "adopted": adopted},
            "optimizer": {"name": cfg.optimizer, "lr": cfg.lr},  # every hyper-parameter once it is built
            "versions": environment.versions(),
            "hosts": hosts, "command": sys.argv, "start_time": started,
            "host": socket.gethostname(), "pid": os.getpid(),
        }  # fmt: skip
        if info.rank == 0 and meta["oversubscribed"]:
            print(f"distbench: warning: {info.local_world_size} ranks on {os.cpu_count()} cores: this measures "
                  "time-slicing, not scaling", file=sys.stderr, flush=True)  # fmt: skip
        recorder = _open_recorder(backend, cfg, meta)
        run_dir = Path(cfg.out) / run_id  # this job's from here on: failure notes may go into it
        trainer = Trainer(backend, workload, cfg, recorder, fault, watchdog)
        weights = fingerprint.weights_record(backend.all_gather_object(weight_prints[-1]))
        if backend.rank == 0 and not weights["initial_weights_agree"]:
            print("distbench: warning: build_model() gave the ranks different initial weights (harmless: every "
                  "rank starts from rank 0's, broadcast); see run.json fingerprint", file=sys.stderr)  # fmt: skip
        if recorder is not None:
            recorder.meta["fingerprint"] = {**data_print, **weights}
            recorder.meta["model_float_buffers"] = fingerprint.float_buffers(trainer.raw_model)
            recorder.meta["knobs"] = backend.describe()
            recorder.meta["optimizer"] = trainer.optimizer_meta
            params = [p for p in trainer.raw_model.parameters() if p.requires_grad]
            recorder.meta["model_parameters"] = sum(p.numel() for p in params)
            recorder.meta["gradient_bytes_per_step"] = gradient_bytes(params, cfg, backend_name)
        trainer.fit()
        if recorder is not None:
            recorder.meta["knobs"].update(backend.settled(recorder.run_dir))
        if watchdog.orphaned():  # between the watchdog's looks: still not a run anybody is waiting for
            raise guard.LauncherGone(parent)
        if recorder is not None:
            recorder.summary(trainer.timed_wall_s, trainer.compute_step_s)
            with recording:  # a signal now waits for the write, and finds the run completed
                recorder.finish("completed", end_time=_now(), timed_wall_s=trainer.timed_wall_s)
            return recorder.run_dir
        return None
    except BaseException as exc:
        if isinstance(exc, (InputError, results.ResultsWriteError)) or not isinstance(exc, Exception):
            if isinstance(exc, InputError):
                if backend.rank == 0:  # said now: shutting the backend down may wait on the other ranks
                    print(f"distbench: error: {exc}", file=sys.stderr, flush=True)
                exc.said = True
            else:
                record_failure(_describe(exc))
            raise  # bad input and a full disk have their own one line; SystemExit keeps its code
        raise RunFailed(fail(_describe(exc))) from exc
    finally:
        watchdog.beat()  # shutting down may wait on peers too; give it a full timeout
        backend.shutdown()
        watchdog.stop()
