"""Rank side of `distbench allreduce`: one implementation's sweep of one collective over message sizes.

Every implementation sits behind `Collective`: an in-place SUM allreduce of a buffer (torch: also the
reduce-scatter and all-gather FSDP2 uses), a barrier and an object all-gather. Per size: warm-up, a
barrier, the timed loop (nothing in it but the collective measured), then, outside it, a correctness
check and one all-gather of each rank's mean time and verdict, so rank 0 can write the size's row before
the next size's barrier. Rank 0 writes `allreduce.csv` and `run.json` (`kind: allreduce`, whichever the
collective). No pandas, scipy or matplotlib here, and torch only once a sweep starts: the analysis side
imports the formulas and the schema from this module.

On CUDA the timed loop only queues calls: no host synchronisation inside it, one after its last call (the
host clock must see the device finish), and one just before the clock starts, so nothing queued earlier
is timed. A call that blocks the host by itself (Horovod's allreduce_ waits for its handle) is the
library's own cost and is measured as such.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import math
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import files, launch
from benchmarks.config import AllreduceConfig, format_size
from benchmarks.errors import InputError
from benchmarks.launch import network
from benchmarks.run import guard
from benchmarks.run.collective_impls import (
    EXPECTED,
    IMPLEMENTATIONS,
    NUMPY_DTYPES,
    PERIOD,
    Collective,
    check,
    fill_pattern,
    fill_shard,
)
from benchmarks.run.progress import progress
from benchmarks.run.recorder import RUN_JSON, write_json_atomic

KIND = "allreduce"
SCHEMA_VERSION = 4
"""2: the `collective` column and run.json key (schema 1 runs are allreduce, and still pass the check);
3: the `cpu_mean_s` and `caller_cpu_mean_s` columns; 4: `idle_cpu_per_s`."""
CSV_NAME = "allreduce.csv"
COLUMNS = (
    "run_id",
    "impl",
    "collective",
    "launcher",
    "controller",
    "world_size",
    "device",
    "dtype",
    "size_bytes",
    "elements",
    "warmup",
    "iterations",
    "time_mean_s",
    "time_min_s",
    "time_max_s",
    "algbw_gbps",
    "busbw_gbps",
    "correct",
)
CPU_COLUMNS = ("cpu_mean_s", "caller_cpu_mean_s")
"""Schema 3's: the process's CPU seconds per call and the calling thread's."""
IDLE_COLUMN = "idle_cpu_per_s"
"""Schema 4's: CPU seconds per second the process's other threads used with no call in flight."""
COLUMNS = (*COLUMNS, *CPU_COLUMNS, IDLE_COLUMN)
SCHEMA_COLUMNS = {
    1: tuple(c for c in COLUMNS if c not in ("collective", *CPU_COLUMNS, IDLE_COLUMN)),
    2: tuple(c for c in COLUMNS if c not in (*CPU_COLUMNS, IDLE_COLUMN)),
    3: tuple(c for c in COLUMNS if c != IDLE_COLUMN),
    4: COLUMNS,
}
"""Each schema's header."""
WARMUP_BYTES = 64 << 20
TARGET_S = 0.5
MIN_ITERS, MAX_ITERS = 5, 100_000
IDLE_WINDOW_S = 0.1
"""How long each size's idle window is: the caller sleeps, the framework's threads do what they do unasked."""
IDLE_SETTLE_S = 0.02
"""Slept before the idle window: the barrier just passed may still be answered by a background thread."""


def warmup_count(size_bytes: int) -> int:
    """Untimed iterations before a size: 64 MiB's worth, 1 to 10 (a large message is warm after one)."""
    return max(1, min(10, WARMUP_BYTES // size_bytes))


def iteration_count(per_call_s: float) -> int:
    """Timed iterations for a size whose warm-up took `per_call_s` per call: about TARGET_S of timed loop.

    A fixed count per size cannot suit both mpi4py's 2 µs and Horovod's 1 ms small messages on a shared
    2-core machine: a window of a few hundred microseconds is at the mercy of one preemption, so every
    size gets about half a second (5 to 100 000 iterations).
    """
    return max(MIN_ITERS, min(MAX_ITERS, math.ceil(TARGET_S / max(per_call_s, 1e-9))))


def bus_factor(world_size: int, collective: str = "allreduce") -> float:
    """nccl-tests' correction: 2(n−1)/n for allreduce, (n−1)/n for reduce-scatter and all-gather (each is
    one half of a ring allreduce), with S the whole buffer: what one rank moves over each link, per S."""
    return (2 if collective == "allreduce" else 1) * (world_size - 1) / world_size


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth S / t in GB/s (10⁹ bytes per second), as nccl-tests defines it."""
    return size_bytes / seconds / 1e9


def busbw_gbps(size_bytes: int, seconds: float, world_size: int, collective: str = "allreduce") -> float:
    """Bus bandwidth S / t × `bus_factor` in GB/s: comparable with link bandwidth whatever the world size."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(world_size, collective)


def sweep_sizes(sizes: list[int], collective: str, world_size: int, width: int) -> list[int]:
    """The sizes a sweep measures. Reduce-scatter and all-gather split the buffer into one equal shard per
    rank, so, as nccl-tests does, a size is rounded down to whole elements per rank; one under a single
    element per rank is left out (and a size rounded onto another counts once)."""
    if collective == "allreduce":
        return list(sizes)
    unit = world_size * width
    return list(dict.fromkeys(s // unit * unit for s in sizes if s >= unit))


class WrongResult(RuntimeError):
    """An output held a value that is not the exact result: the run fails, no bandwidth is claimed."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _append(path: Path, rows: list[dict[str, Any]], header: bool = False) -> None:
    """Whole lines, flushed to disk, so a killed run leaves the sizes it finished readable."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="raise", lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    with open(path, "a", newline="") as handle:
        handle.write(buffer.getvalue())
        handle.flush()
        os.fsync(handle.fileno())


def size_row(
    meta: dict[str, Any],
    size: int,
    warmup: int,
    iters: int,
    per_rank: list[float],
    correct: bool,
    cpu_per_rank: list[tuple[float, float, float]],
) -> dict:
    """The CSV row of one size from each rank's mean time and CPU times (its process's, its calling
    thread's); a wrong result gets no time or bandwidth."""
    mean = sum(per_rank) / len(per_rank)
    keys = ("run_id", "impl", "collective", "launcher", "controller", "world_size", "device", "dtype")
    row = {k: meta.get(k, "allreduce") if k == "collective" else meta[k] for k in keys}
    width = np.dtype(NUMPY_DTYPES[meta["dtype"]]).itemsize
    row.update(size_bytes=size, elements=size // width, warmup=warmup, iterations=iters, correct=correct)
    if correct:
        busbw = busbw_gbps(size, mean, meta["world_size"], row["collective"])
        row.update(
            time_mean_s=mean,
            time_min_s=min(per_rank),
            time_max_s=max(per_rank),
            algbw_gbps=algbw_gbps(size, mean),
            busbw_gbps=busbw,
        )
        means = (sum(column) / len(column) for column in zip(*cpu_per_rank, strict=True))
        row.update(zip((*CPU_COLUMNS, IDLE_COLUMN), means, strict=True))
    return row


def idle_cpu_per_s() -> float:
    """CPU seconds per second the process's threads other than this one use while it sleeps: Horovod's background
    loop cycles (and may spin in MPI) with nothing to send. Training pays it during compute too, so the compute
    baseline already holds it (docs/benchmarks.md: what the projection does with it, and why)."""
    time.sleep(IDLE_SETTLE_S)
    t0, c0, own0 = time.perf_counter(), time.process_time(), time.thread_time()
    time.sleep(IDLE_WINDOW_S)
    return max(0.0, ((time.process_time() - c0) - (time.thread_time() - own0)) / (time.perf_counter() - t0))


def sweep(
    impl: Collective,
    opts: AllreduceConfig,
    meta: dict[str, Any] | None,
    watchdog: guard.Watchdog,
    sizes: list[int] | None = None,
) -> None:
    """Every size (`sizes`, default opts.sizes) in turn; rank 0 (`meta` given) appends each size's row.
    Raises WrongResult on all ranks."""
    what = opts.collective
    width = np.dtype(NUMPY_DTYPES[opts.dtype]).itemsize
    sizes = opts.sizes if sizes is None else sizes
    bar = progress(len(sizes), f"{what} {impl.name}", enabled=meta is not None and not opts.quiet)
    for n, size in enumerate(sizes):
        warm = warmup_count(size) if opts.warmup is None else opts.warmup
        bar.set_postfix(size=format_size(size))
        inp, buf = impl.buffers(what, size // width)
        call = impl.call(what, inp, buf, size)
        calls = []
        for _ in range(warm):
            t0 = time.perf_counter()
            call()
            impl.synchronize()
            calls.append(time.perf_counter() - t0)
        # The median call, not the mean: a first call's set-up (Horovod negotiating a new name) is no guide.
        # Every rank must run the same count, hence the slowest rank's estimate.
        iters = opts.iters or iteration_count(max(impl.allgather(sorted(calls)[len(calls) // 2])))
        impl.barrier()
        impl.synchronize()  # CUDA: an NCCL barrier's own kernel may still be queued; CPU: nothing
        idle = idle_cpu_per_s()
        # CPU time, the process's (every thread's) and the calling thread's: the difference is what the
        # collective's own threads (gloo's, Horovod's background loop) take, and would take from a backward
        # sharing their cores; the caller only waits (Horovod's wait spins, which training does after backward).
        t0, c0, own0 = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(iters):
            call()
        impl.synchronize()
        mean_s = (time.perf_counter() - t0) / iters
        cpu_s = ((time.process_time() - c0) / iters, (time.thread_time() - own0) / iters, idle)
        watchdog.beat()
        if what == "allreduce":  # the two-argument fill a test's stand-in implementation has
            impl.fill(inp, impl.rank)
        else:
            impl.fill(inp, impl.rank, fill_shard if what == "all_gather" else fill_pattern)
        call()
        impl.synchronize()
        if opts.inject_wrong_result and n == 0 and impl.rank == impl.world_size - 1:
            impl.perturb(buf)
        wrong = check(what, impl.host(buf), impl.rank, impl.world_size)
        error = None if wrong is None else "element {} is {:g}, expected {:g}".format(*wrong)
        gathered = impl.allgather((mean_s, error, cpu_s))
        del inp, buf, call
        bad = [(r, e) for r, (_, e, _) in enumerate(gathered) if e is not None]
        if meta is not None:
            row = size_row(meta, size, warm, iters, [t for t, *_ in gathered], not bad, [c for *_, c in gathered])
            _append(Path(meta["run_dir"]) / CSV_NAME, [row])
        bar.update(1)
        watchdog.beat()
        if bad:
            rank, error = bad[0]
            where = f"{format_size(size)} ({opts.dtype}) on rank {rank}"
            raise WrongResult(f"wrong {what} result at {where}: {error} ({EXPECTED[what].format(impl.world_size)})")
    bar.close()


def _write_meta(meta: dict[str, Any]) -> None:
    """run.json from rank 0's record (`run_dir` is where it goes, not part of it)."""
    write_json_atomic(Path(meta["run_dir"]) / RUN_JSON, {k: v for k, v in meta.items() if k != "run_dir"})


def _open_run_dir(impl: Collective, opts: AllreduceConfig, meta: dict[str, Any]) -> Path | None:
    """Rank 0 creates the run directory; every rank learns whether that worked, so none waits forever."""
    run_dir, error = Path(opts.out) / meta["run_id"], None
    if impl.rank == 0:
        try:
            if opts.overwrite and run_dir.exists():
                import shutil

                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True, exist_ok=False)
            meta["run_dir"] = str(run_dir)
            _write_meta(meta)
            _append(run_dir / CSV_NAME, [], header=True)
        except FileExistsError:
            error = f"run directory {run_dir} already exists; choose another --run-id or pass --overwrite"
        except OSError as exc:
            error = (
                f"cannot write to --out {opts.out} ({files.unwritable_reason(opts.out, exc)}); choose a writable --out"
            )
    error = next((e for e in impl.allgather(error) if e), None)
    if error:
        raise InputError(error)
    return run_dir if impl.rank == 0 else None


def new_id(what: str) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-allreduce-{what}-{secrets.token_hex(2)}"


def run(opts: AllreduceConfig, info: launch.LaunchInfo) -> int:
    """One sweep inside this launcher: 0 when every size's result was right, 1 otherwise (rank 0 says why)."""
    import torch

    from benchmarks import environment

    if opts.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    if opts.dtype == "float16" and PERIOD * info.world_size > 2048:
        raise InputError(f"float16 cannot hold the exact check sums of {info.world_size} ranks; use --dtype float32")
    width = np.dtype(NUMPY_DTYPES[opts.dtype]).itemsize
    sizes = sweep_sizes(opts.sizes, opts.collective, info.world_size, width)
    if not sizes:
        raise InputError(
            f"--sizes: none holds one {opts.dtype} element per rank; --collective {opts.collective} on "
            f"{info.world_size} ranks needs at least {info.world_size * width} B"
        )
    threads = opts.threads or launch.default_threads(info.local_world_size)
    torch.set_num_threads(threads)
    impl = IMPLEMENTATIONS[opts.impl](info, opts)
    meta: dict[str, Any] = {}
    said: list[str] = []

    def fail(error: str) -> None:
        if meta.get("status") == "running" and "run_dir" in meta:
            meta.update(status="failed", error=error, end_time=_now())
            _write_meta(meta)
        if impl.rank == 0 and not said:
            where = f"; details in {Path(meta['run_dir']) / RUN_JSON}" if "run_dir" in meta else ""
            said.append(error)
            print(f"distbench: error: allreduce failed: {error}{where}", file=sys.stderr, flush=True)

    guard.install_signal_watcher(fail)
    watchdog = guard.Watchdog(opts.timeout, fail)
    try:
        impl.start()
        watchdog.beat()
        hosts = impl.allgather(network.this_host(info.node_rank))
        named = impl.name if opts.collective == "allreduce" else f"{impl.name}-{opts.collective}"
        run_id = opts.run_id or new_id(f"{named}-w{info.world_size}")
        meta.update(
            {
                "schema_version": SCHEMA_VERSION,
                "kind": KIND,
                "run_id": run_id,
                "impl": impl.name,
                "collective": opts.collective,
                "launcher": info.launcher,
                "launcher_detail": info.detail,
                "controller": impl.controller,
                "world_size": info.world_size,
                "local_world_size": info.local_world_size,
                "device": opts.device,
                "dtype": opts.dtype,
                "sizes": sizes,
                "in_place": opts.collective != "reduce_scatter",
                "op": "sum",
                "config": dataclasses.asdict(opts),
                "knobs": impl.knobs(),
                "threads": threads,
                "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
                "versions": environment.versions(),
                "hosts": hosts,
                "network": network.record(hosts),
                "command": sys.argv,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "start_time": _now(),
                "status": "running",
            }
        )
        _open_run_dir(impl, opts, meta)
        started = time.perf_counter()
        sweep(impl, opts, meta if impl.rank == 0 else None, watchdog, sizes)
        if impl.rank == 0:
            meta.update(status="completed", end_time=_now(), wall_s=time.perf_counter() - started)
            _write_meta(meta)
            print(meta["run_dir"])
        return 0
    except InputError:
        raise
    except WrongResult as exc:
        fail(str(exc))
        return 1
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return 1
    finally:
        watchdog.beat()
        try:
            impl.stop()
        except Exception:  # a failed run may have no process group left to stop
            pass
        watchdog.stop()
