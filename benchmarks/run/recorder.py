"""The CSV contract and the recorder: the one module that knows the result files' schema.

`<out>/<run-id>/` holds run.json, timing.csv, loss.csv and summary.csv (docs/results.md).
Columns are stable; new ones are added at the end and SCHEMA_VERSION is bumped.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import socket
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import files
from benchmarks.run import guard

SCHEMA_VERSION = 5
KNOWN_SCHEMAS = frozenset({1, 2, 3, 4, 5})
RUN_JSON, TIMING_CSV, LOSS_CSV, SUMMARY_CSV = "run.json", "timing.csv", "loss.csv", "summary.csv"
FINISH_LOCK_WAIT_S = 5.0
RESERVE, RESERVE_BYTES = ".space-reserve", 64 * 1024
"""Space held in the run directory while the run writes, freed just before the last run.json: on a disk that
fills mid-run, the record of why the run failed still fits."""

TIMING_COLUMNS = (
    "run_id",
    "backend",
    "world_size",
    "rank",
    "epoch",
    "step",
    "warmup",
    "samples",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "step_s",
)
VAL_LOSS_COLUMNS = ("val_pass", "val_s", "val_samples_per_s", "val_exact_loss")
"""loss.csv's validation columns (schema 4; empty on `train` rows): benchmarks.run.validation."""
LOSS_COLUMNS = (
    "run_id",
    "backend",
    "world_size",
    "epoch",
    "step",
    "split",
    "loss",
    "accuracy",
    "samples",
    *VAL_LOSS_COLUMNS,
)
LOSS_COLUMNS_OF = {
    **dict.fromkeys((1, 2, 3), LOSS_COLUMNS[: LOSS_COLUMNS.index(VAL_LOSS_COLUMNS[0])]),
    **dict.fromkeys((4, 5), LOSS_COLUMNS),
}
"""loss.csv's header by run.json schema_version: version 4 added the validation's time."""
MEMORY_MEASURES = (
    "peak_rss_mb",
    "training_rss_mb",
    "rss_before_model_mb",
    "cuda_max_allocated_mb",
    "cuda_max_reserved_mb",
)
"""Each rank's numbers (benchmarks.run.memory, MiB); summary.csv has each one's smallest and largest rank."""
MEMORY_COLUMNS = (
    "peak_rss_mb_min",
    "peak_rss_mb_max",
    "training_rss_mb_min",
    "training_rss_mb_max",
    "rss_before_model_mb_min",
    "rss_before_model_mb_max",
    "peak_rss_from",
    "cuda_max_allocated_mb_min",
    "cuda_max_allocated_mb_max",
    "cuda_max_reserved_mb_min",
    "cuda_max_reserved_mb_max",
)
PEAK_FROM_MODEL_BUILD, PEAK_FROM_PROCESS_START = "model_build", "process_start"
"""`peak_rss_from`'s values: the RSS high-water mark was reset just before the model was built, or could not
be and is the process's lifetime peak."""
VALIDATION_COLUMNS = (
    "val_strategy",
    "eval_only",
    "val_passes",
    "val_s",
    "val_samples_per_s",
    "val_samples",
    "val_duplicates",
    "final_val_exact_loss",
)
"""summary.csv's validation columns (schema 4): the strategy, the median validation time (slowest rank)
and the throughput over the set, the samples each validation evaluated over all ranks and how many of
them were duplicates, and the exact loss of the last validation's model."""
FLOPS_COLUMNS = ("model_flops_per_step", "achieved_tflops_per_rank", "peak_tflops", "mfu", "tokens_per_s")
"""summary.csv's throughput in FLOPs (schema 5, run.json `step`): model FLOPs of one rank's step, their rate per
rank over the timed window, the peak it is against and their ratio (MFU), and tokens per second (token workloads)."""
SUMMARY_COLUMNS = (
    "run_id",
    "backend",
    "world_size",
    "workload",
    "global_batch",
    "timed_steps",
    "samples_per_s",
    "step_p50_s",
    "step_p90_s",
    "step_p99_s",
    "final_train_loss",
    "final_val_loss",
    "final_val_accuracy",
    "wall_s",
    "compute_s",
    "exposed_comm_s",
    "exposed_comm_share",
    *MEMORY_COLUMNS,
    *VALIDATION_COLUMNS,
    *FLOPS_COLUMNS,
)
SUMMARY_COLUMNS_OF = {
    1: SUMMARY_COLUMNS[: SUMMARY_COLUMNS.index("compute_s")],
    2: SUMMARY_COLUMNS[: SUMMARY_COLUMNS.index(MEMORY_COLUMNS[0])],
    3: SUMMARY_COLUMNS[: SUMMARY_COLUMNS.index(VALIDATION_COLUMNS[0])],
    4: SUMMARY_COLUMNS[: SUMMARY_COLUMNS.index(FLOPS_COLUMNS[0])],
    5: SUMMARY_COLUMNS,
}
"""summary.csv's header by run.json schema_version: version 2 added the step breakdown at the end,
version 3 the memory columns, version 4 the validation's, version 5 the FLOPs."""


class ResultsWriteError(OSError):
    """A result file could not be written (disk full, read-only file system, quota)."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(exc.errno, f"cannot write {path}: {exc.strerror}; free space or choose another --out")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write via temp file + fsync + rename, so a reader never sees half a run.json.

    A write that fails part-way (disk full, a value that cannot be written) leaves the old file as it
    was and removes its temp file.
    """
    files.write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


class Recorder:
    """Rank 0's writer of one run directory. Rows are appended in whole lines and flushed."""

    def __init__(self, run_dir: Path, meta: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.lock = threading.Lock()  # the SIGTERM watcher thread may finish the run mid-write
        self.meta = {"schema_version": SCHEMA_VERSION, **meta, "status": "running"}
        self._slowest: dict[int, float] = defaultdict(float)
        self._timed_samples = 0
        self._last: dict[str, dict[str, Any]] = {}
        self._val_s: list[float] = []
        run_dir.mkdir(parents=True, exist_ok=False)
        write_json_atomic(run_dir / RUN_JSON, self.meta)
        try:  # best effort: without it a disk that fills mid-run leaves `running`, read as failed once rank 0 is gone
            (run_dir / RESERVE).write_bytes(bytes(RESERVE_BYTES))
        except OSError:
            with contextlib.suppress(OSError):
                (run_dir / RESERVE).unlink()
        for name, columns in ((TIMING_CSV, TIMING_COLUMNS), (LOSS_CSV, LOSS_COLUMNS)):
            self._append(name, columns, [], header=True)

    def _append(self, name: str, columns: Sequence[str], rows: Iterable[dict[str, Any]], header: bool = False) -> None:
        """Append whole lines: a write that fails part-way (disk full) is cut back to the last whole row."""
        buffer = io.StringIO(newline="")
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="raise", lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        data = buffer.getvalue().encode()
        path = self.run_dir / name
        with self.lock, open(path, "ab", buffering=0) as handle:
            start = handle.seek(0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:
                    view = view[handle.write(view) :]
                os.fsync(handle.fileno())
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(handle.fileno(), start)
                    if not start:  # not even its header: no file rather than an empty CSV
                        path.unlink()
                raise ResultsWriteError(path, exc) from exc

    def timing(self, rows: list[dict[str, Any]]) -> None:
        self._append(TIMING_CSV, TIMING_COLUMNS, rows)
        for row in rows:  # running totals for summary.csv, so memory does not grow with the run
            if not row["warmup"]:
                self._slowest[row["step"]] = max(self._slowest[row["step"]], row["step_s"])
                self._timed_samples += row["samples"]

    def gathered(self, gathered: list[Any]) -> list[dict[str, Any]]:
        """Every rank's buffered step rows, as [rows, rank] pairs: timing.csv gets each rank's, loss.csv each
        step's loss over all ranks' samples; returns those loss rows."""
        meta = self.meta
        common = {"run_id": meta["run_id"], "backend": meta["backend"], "world_size": meta["world_size"]}
        timing, by_step = [], {}
        for rows, rank in gathered:
            for row in rows:
                timing.append({**common, "rank": rank, **{c: row[c] for c in TIMING_COLUMNS if c in row}})
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
            {
                **common,
                "epoch": a["epoch"],
                "step": step,
                "split": "train",
                "loss": a["loss"] / a["samples"],
                "accuracy": a["correct"] / a["samples"] if a["has_acc"] else None,
                "samples": a["samples"],
            }
            for step, a in sorted(by_step.items())
        ]
        self.timing(timing)
        self.loss(losses)
        return losses

    def loss(self, rows: list[dict[str, Any]]) -> None:
        self._append(LOSS_CSV, LOSS_COLUMNS, rows)
        for row in rows:
            self._last[row["split"]] = row
            if row["split"] == "val" and row.get("val_s") is not None:
                self._val_s.append(row["val_s"])

    def memory(self, per_rank: Sequence[dict[str, Any]]) -> None:
        """Every rank's memory reading (benchmarks.run.memory), in rank order: run.json `memory`."""
        self.meta["memory"] = {"unit": "MiB", "per_rank": [{"rank": r, **m} for r, m in enumerate(per_rank)]}

    def summary(self, timed_wall_s: float, compute_step_s: Sequence[float] = ()) -> dict[str, Any]:
        """Write summary.csv from everything recorded so far; a step's time is its slowest rank's.

        `compute_step_s`: the slowest rank's time of each compute-baseline step (none when it was off).
        """
        slowest = list(self._slowest.values())
        memory = self.meta.get("memory", {}).get("per_rank", [])
        row = summary_row(
            self.meta, slowest, self._timed_samples, self._last, timed_wall_s, compute_step_s, memory, self._val_s
        )
        self._append(SUMMARY_CSV, SUMMARY_COLUMNS, [row], header=True)
        return row

    def finish(self, status: str, **extra: Any) -> None:
        # Bounded wait: why the run ended must be written even if a writer never releases the lock (the
        # signal watcher keeps it on purpose once it has recorded a stop, until the process exits).
        locked = self.lock.acquire(timeout=FINISH_LOCK_WAIT_S)
        try:
            self.meta.update(status=status, **extra)
            with contextlib.suppress(OSError):
                (self.run_dir / RESERVE).unlink()
            write_json_atomic(self.run_dir / RUN_JSON, self.meta)
            with contextlib.suppress(OSError):  # the record it announced is written
                (self.run_dir / guard.RECORDING).unlink()
        finally:
            if locked:
                self.lock.release()


def effective_status(meta: dict[str, Any]) -> str:
    """`status`, except that a run left `running` by a process that no longer exists is `failed`."""
    status = meta.get("status", "missing")
    if status == "running" and meta.get("host") == socket.gethostname() and meta.get("pid"):
        if not guard.pid_alive(int(meta["pid"])):
            return "failed"
    return status


def mark_abandoned(run_dir: Path, reason: str) -> None:
    """Record as failed a run whose job ended while run.json still said `running` (e.g. rank 0 SIGKILLed)."""
    path = run_dir / RUN_JSON
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if meta.get("status") == "running":
        with contextlib.suppress(OSError):
            (run_dir / RESERVE).unlink()
        write_json_atomic(path, {**meta, "status": "failed", "error": reason})


def summary_row(
    meta: dict[str, Any],
    step_times: Sequence[float],
    timed_samples: int,
    last: dict[str, dict[str, Any]],
    timed_wall_s: float,
    compute_step_s: Sequence[float] = (),
    memory: Sequence[dict[str, Any]] = (),
    val_s: Sequence[float] = (),
) -> dict[str, Any]:
    """summary.csv's row from the slowest rank's time of each timed step, the last train/val rows and
    each rank's memory reading (empty columns without one; the CUDA ones are empty on CPU), and each
    validation's time (its slowest rank's), whose median is `val_s`.

    The breakdown, in medians (a few slow steps among ten baseline steps would move a mean far):
    `compute_s`, the median compute-baseline step (the same work with no gradient communication), and
    `exposed_comm_s` = `step_p50_s` − `compute_s`, communication and framework overhead not hidden behind
    compute, with its share of `step_p50_s`. Noise can make it slightly negative; it is written as measured.
    """
    times = np.asarray(step_times, dtype=float)
    step = float(np.median(times)) if len(times) else None
    compute = float(np.median(compute_step_s)) if len(compute_step_s) else None
    exposed = step - compute if step is not None and compute is not None else None

    def pct(q: float) -> float | None:
        return float(np.percentile(times, q)) if len(times) else None

    train, val = last.get("train", {}), last.get("val", {})
    return {
        "run_id": meta["run_id"],
        "backend": meta["backend"],
        "world_size": meta["world_size"],
        "workload": meta["workload"],
        "global_batch": meta["global_batch"],
        "timed_steps": len(times),
        "samples_per_s": timed_samples / timed_wall_s if timed_wall_s > 0 and timed_samples else None,
        "step_p50_s": pct(50),
        "step_p90_s": pct(90),
        "step_p99_s": pct(99),
        "final_train_loss": train.get("loss"),
        "final_val_loss": val.get("loss"),
        "final_val_accuracy": val.get("accuracy"),
        "wall_s": timed_wall_s,
        "compute_s": compute,
        "exposed_comm_s": exposed,
        "exposed_comm_share": exposed / step if exposed is not None and step else None,
        **memory_range(memory),
        **validation_summary(meta, val, val_s),
        **flops_summary(meta.get("step") or {}, len(times), timed_samples, timed_wall_s),
    }


def flops_summary(step: dict[str, Any], timed_steps: int, timed_samples: int, timed_wall_s: float) -> dict[str, Any]:
    """FLOPS_COLUMNS from run.json `step`: empty where it was not measured."""
    flops, peak = step.get("model_flops_per_step"), step.get("peak_tflops")
    achieved = flops * timed_steps / timed_wall_s / 1e12 if flops and timed_steps and timed_wall_s > 0 else None
    tokens = step.get("tokens_per_sample")
    return {
        "model_flops_per_step": flops,
        "achieved_tflops_per_rank": achieved,
        "peak_tflops": peak,
        "mfu": achieved / peak if achieved is not None and peak else None,
        "tokens_per_s": timed_samples * tokens / timed_wall_s if tokens and timed_wall_s > 0 else None,
    }


def validation_summary(meta: dict[str, Any], last_val: dict[str, Any], val_s: Sequence[float]) -> dict[str, Any]:
    """summary.csv's validation columns from run.json `validation` and `eval_only`, the last `val` row and
    every validation's time. A median, as for steps: one descheduled validation would move a mean far."""
    described = meta.get("validation") or {}
    median = float(np.median(val_s)) if len(val_s) else None
    samples = last_val.get("samples")  # the validation set's size
    return {
        "val_strategy": described.get("strategy"),
        "eval_only": bool(meta.get("eval_only")),
        "val_passes": len(val_s),
        "val_s": median,
        "val_samples_per_s": samples / median if median and samples else None,
        "val_samples": described.get("samples"),
        "val_duplicates": described.get("duplicates"),
        "final_val_exact_loss": last_val.get("val_exact_loss"),
    }


def memory_range(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """summary.csv's memory columns: each measure's smallest and largest rank, and `peak_rss_from`
    (`process_start` if any rank's peak could not be reset, since that peak may predate the model)."""
    row: dict[str, Any] = {}
    for measure in MEMORY_MEASURES:
        values = [m[measure] for m in per_rank if m.get(measure) is not None]
        row[f"{measure}_min"], row[f"{measure}_max"] = (min(values), max(values)) if values else (None, None)
    sources = {m.get("peak_rss_from") for m in per_rank} - {None}
    lifetime = PEAK_FROM_PROCESS_START in sources
    row["peak_rss_from"] = PEAK_FROM_PROCESS_START if lifetime else next(iter(sources), None)
    return {c: row[c] for c in MEMORY_COLUMNS}
