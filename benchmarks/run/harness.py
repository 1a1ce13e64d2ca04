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
import time
import traceback
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch

import backends
from backends import step
from backends.base import Backend
from benchmarks import environment, files, launch
from benchmarks.config import RunConfig
from benchmarks.errors import InputError
from benchmarks.launch import emulated, network, placement
from benchmarks.run import faults, fingerprint, guard, workloads
from benchmarks.run import recorder as results
from benchmarks.run.trainer import Trainer


def _process_start() -> float:
    """When this process was created (epoch seconds): its interpreter start and imports count from there."""
    import psutil

    return float(psutil.Process().create_time())


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
            error = (
                f"cannot write to --out {cfg.out} ({files.unwritable_reason(cfg.out, exc)}); choose a writable --out"
            )
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
    if str(exc):
        return f"{type(exc).__name__}: {exc}"
    # A bare exception (an assert in a framework) says nothing of itself: where it was raised does.
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    return type(exc).__name__ + "".join(f" (at {f.filename}:{f.lineno})" for f in last)


class _Failure:
    """How a failure after start-up is recorded and said, by whichever of the main thread, the signal watcher
    and the watchdog meets it first; the run sets `recorder` and `run_dir` as it gets them."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.recorder: results.Recorder | None = None
        self.run_dir: Path | None = None
        # Held while a failure is written: the signal watcher exits the process right after its own (skipped)
        # record, which must not cut short the main thread's write of run.json (an fsync can take seconds on a
        # busy disk). Bounded all the same: a failure must be written even if the lock is never released.
        self.recording = threading.Lock()
        self.said = threading.Lock()  # the main thread, the SIGTERM watcher and the watchdog may all fail the run

    def record(self, error: str) -> None:
        if self.recorder is not None and self.recorder.meta["status"] == "running":
            guard.mark_recording(self.recorder.run_dir)  # the other ranks wait for the write it announces
        held = self.recording.acquire(timeout=RECORD_WAIT_S)
        try:
            recorder = self.recorder
            if recorder is not None and recorder.meta["status"] == "running":
                notes = [n for n in guard.read_failure_notes(recorder.run_dir) if n["rank"] != self.rank]
                if notes:
                    root = notes[0]
                elif PEER_LOST.search(error):  # a rank killed or hung leaves no note: rank 0 only saw it go
                    root = {"rank": None, "error": f"another rank died or stopped answering (rank 0 saw: {error})"}
                else:
                    root = {"rank": self.rank, "error": error}
                recorder.finish(
                    "failed", end_time=_now(), error=root["error"], failed_rank=root["rank"], rank0_error=error
                )
            elif self.run_dir is not None and self.rank != 0:
                guard.write_failure_note(self.run_dir, self.rank, error)
        finally:
            if held:
                self.recording.release()

    def fail(self, error: str) -> str:
        """Record the failure; rank 0 says it once, naming the root cause's rank and the run directory."""
        self.record(error)
        recorder = self.recorder
        meta = recorder.meta if recorder is not None else {"error": error}
        rank = f" on rank {meta['failed_rank']}" if meta.get("failed_rank") is not None else ""
        where = f"; details in {recorder.run_dir / 'run.json'}" if recorder is not None else ""
        # The recorder's lock may be held elsewhere when a signal comes: its meta then lacks the error.
        message = f"run failed{rank}: {meta.get('error') or error}{where}"
        if self.rank == 0 and self.said.acquire(blocking=False):
            with contextlib.suppress(OSError):  # a launcher killed outright took the pipe with it
                print(f"distbench: error: {message}", file=sys.stderr, flush=True)
        return message

    def stop_on_signal(self, why: str) -> None:
        self.fail(why)
        if self.recorder is not None:  # the process exits next: no row may be half-appended when it does
            self.recorder.lock.acquire(timeout=RECORD_WAIT_S)
        elif self.run_dir is not None:  # exiting first would let mpirun SIGKILL rank 0 before it records
            guard.wait_for_record(self.run_dir / results.RUN_JSON)


def _start_backend(backend: Backend, backend_name: str, failure: _Failure, watchdog: guard.Watchdog) -> None:
    """Join the job: bad input is raised as it is, any other error as RunFailed, recorded and said."""
    try:
        backend.init()
    except (InputError, launch.WrongLauncherError):
        watchdog.stop()
        raise
    except Exception as exc:
        watchdog.stop()
        raise RunFailed(failure.fail(f"the {backend_name} backend could not start: {_describe(exc)}")) from exc
    watchdog.beat()


def _meta(
    run_id: str,
    backend_name: str,
    info: launch.LaunchInfo,
    ready: workloads.ResolvedWorkload,
    options: Any,
    given: dict[str, Any] | None,
    ranks: list[dict[str, Any]],
    hosts: list[Any],
    adopted: dict[str, dict[str, Any]],
    threads: int,
    started: str,
) -> dict[str, Any]:
    """run.json as the run starts; what the model and the backend settle on is added once it is built."""
    cfg = ready.cfg
    return {
        "run_id": run_id,
        "backend": backend_name,
        "launcher": info.launcher,
        "launcher_detail": info.detail,
        "world_size": info.world_size,
        "local_world_size": info.local_world_size,
        "workload": cfg.workload,
        "oversubscribed": placement.oversubscribed(info.local_world_size),
        "cpus": os.cpu_count(),
        "global_batch": cfg.batch_size * cfg.accumulate * info.world_size,
        "train_size": ready.train_size,
        "val_size": ready.val_size,
        "workload_args": ready.workload.args,
        "config": {**(given or {}), **dataclasses.asdict(cfg), **dataclasses.asdict(options)},
        "workload_source": ready.source,
        "knobs": {},
        "threads": threads,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "placement": placement.record(cfg.bind, [r["placement"] for r in ranks]),
        "environment": {**environment.by_rank([r["environment"] for r in ranks]), "adopted": adopted},
        "optimizer": {"name": cfg.optimizer, "lr": cfg.lr},  # every hyper-parameter once it is built
        "versions": environment.versions(),
        "hosts": hosts,
        "network": network.record(hosts),
        "command": sys.argv,
        "start_time": started,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _record_model(
    recorder: results.Recorder, trainer: Trainer, backend: Backend, backend_name: str, fingerprints: dict[str, Any]
) -> None:
    """What run.json says of the model as built and of the backend's settings, before the first step."""
    recorder.meta["fingerprint"] = fingerprints
    recorder.meta["model_float_buffers"] = fingerprint.float_buffers(trainer.raw_model)
    recorder.meta["knobs"] = backend.describe()
    recorder.meta["optimizer"] = trainer.optimizer_meta
    params = [p for p in trainer.raw_model.parameters() if p.requires_grad]
    recorder.meta["model_parameters"] = sum(p.numel() for p in params)
    recorder.meta["gradient_bytes_per_step"] = gradient_bytes(params, trainer.cfg, backend_name)


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
    entered = time.perf_counter()
    started_s = time.time() - _process_start()  # the interpreter and the imports, since the launcher forked us
    user_env = environment.recorded_variables(os.environ)  # as the user gave it: nothing of ours is set yet
    info = launch.detect()
    backend_cls = backends.get(backend_name)
    launch.check_supported(backend_name, backend_cls.launchers, info)
    cfg, options, adopted = environment.adopt_for_run(
        cfg, options, explicit, os.environ, info.launcher, info.local_world_size
    )
    placement.apply(cfg.bind, info.local_rank, info.local_world_size)
    ready = workloads.prepare(cfg, info.world_size, autotune=getattr(options, "autotune", False))
    cfg = ready.cfg
    backend_cls.check_model(ready.workload.build_model, options)  # e.g. an FSDP unit policy that names nothing
    checked = backend_cls.check_run(cfg, options)  # e.g. a step option DeepSpeed would take its own way
    if checked and os.environ.get(environment.RUN_CHECK_SAID) != "1":
        notes = [*notes, f"distbench: {checked}"]
    step.check(cfg, cfg.device, ready.workload.build_model)  # e.g. no C++ compiler for --compile
    data_print = fingerprint.of_data(ready.workload.train, ready.workload.val)  # compared once the ranks join
    workload, weight_prints = fingerprint.recording(ready.workload)
    backend_cls.check_available()
    if cfg.run_id and not cfg.overwrite and (Path(cfg.out) / cfg.run_id).exists():
        # Caught here, before any rank joins a job, rather than only by rank 0 after start-up.
        raise InputError(existing_run_dir(Path(cfg.out) / cfg.run_id))
    fault = faults.Fault.parse(cfg.inject_fault) if cfg.inject_fault else None
    threads = cfg.threads or launch.default_threads(info.local_world_size)
    torch.set_num_threads(threads)
    if info.rank == 0:
        for note in [*notes, *environment.adoption_notes(adopted)]:
            print(note, file=sys.stderr, flush=True)
    started = _now()
    backend = backend_cls(cfg, options, info)
    failure = _Failure(backend.rank)
    guard.install_signal_watcher(failure.stop_on_signal)
    # Under a launcher, the parent is the launcher: one killed outright cannot stop its ranks any more. The
    # watchdog's grace lets collectives' timeouts fire first.
    parent = os.getppid() if info.launcher in LAUNCHER_PARENTS else None
    watchdog = guard.Watchdog(cfg.timeout, failure.fail, parent=parent)
    _start_backend(backend, backend_name, failure, watchdog)
    try:
        run_id = backend.broadcast_object(cfg.run_id or new_run_id(backend_name, cfg.workload, info.world_size))
        hosts = backend.all_gather_object(network.this_host(info.node_rank))
        ranks = backend.all_gather_object(
            {"placement": placement.of_rank(backend.device.type, backend.device.index), "environment": user_env}
        )
        fingerprint.check_data(data_print, backend.all_gather_object, cfg.workload)  # bad input: no run directory
        meta = _meta(run_id, backend_name, info, ready, options, given, ranks, hosts, adopted, threads, started)
        if info.rank == 0 and meta["oversubscribed"]:
            shared = " (shared with another emulated host)" if (emulated.current() or {}).get("shared_cpus") else ""
            print(
                f"distbench: warning: {info.local_world_size} ranks on {len(placement.available())} cores{shared}: "
                "this measures time-slicing, not scaling",
                file=sys.stderr,
                flush=True,
            )
        recorder = failure.recorder = _open_recorder(backend, cfg, meta)
        failure.run_dir = Path(cfg.out) / run_id  # this job's from here on: failure notes may go into it
        joined = time.perf_counter()
        trainer = Trainer(backend, workload, cfg, recorder, fault, watchdog)
        weights = fingerprint.weights_record(backend.all_gather_object(weight_prints[-1]))
        if backend.rank == 0 and not weights["initial_weights_agree"]:
            print(
                "distbench: warning: build_model() gave the ranks different initial weights (harmless: every "
                "rank starts from rank 0's, broadcast); see run.json fingerprint",
                file=sys.stderr,
            )
        if recorder is not None:
            _record_model(recorder, trainer, backend, backend_name, {**data_print, **weights})
        built = time.perf_counter()
        trainer.fit()
        fitted = time.perf_counter()
        if recorder is not None:
            recorder.meta["knobs"].update(backend.settled(recorder.run_dir))
        if watchdog.orphaned():  # between the watchdog's looks: still not a run anybody is waiting for
            raise guard.LauncherGone(parent)
        if recorder is not None:
            if trainer.baseline is not None:
                recorder.meta["compute_baseline"] = trainer.baseline
            if trainer.step_record is not None:
                recorder.meta["step"] = trainer.step_record
            recorder.summary(trainer.timed_wall_s, trainer.compute_step_s)
            parts = {"start": started_s, "checks_and_join": joined - entered, "build": built - joined}
            recorder.meta["outside"] = {**parts, **trainer.outside.parts, "record": time.perf_counter() - fitted}
            with failure.recording:  # a signal now waits for the write, and finds the run completed
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
                failure.record(_describe(exc))
            raise  # bad input and a full disk have their own one line; SystemExit keeps its code
        raise RunFailed(failure.fail(_describe(exc))) from exc
    finally:
        watchdog.beat()  # shutting down may wait on peers too; give it a full timeout
        backend.shutdown()
        watchdog.stop()
