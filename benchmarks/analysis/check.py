"""`distbench check`: validate run directories against the CSV contract, naming file and line.

Checks: run.json parses, has a known `schema_version`, the required keys and a status (a run left
`running` by a dead process is reported), and where recorded the shape of its placement and environment;
every CSV has the contract's header, whole lines (a truncated last line is caught), values of the right
type, no duplicate (rank, epoch, step), steps in order per rank; and for a completed run, `summary.csv`
has one row whose throughput is recomputable from the timing rows, (schema 3) whose memory columns are
ranges of MiB, and (schema 4) whose validation time and throughput are recomputable from loss.csv's `val`
rows (`validation_problems`), and (schema 5) whose FLOPs rate and MFU are recomputable from its own columns. A
`distbench allreduce` run directory (run.json `kind: allreduce`) is held to
its own contract (`allreduce_problems`). run.json itself is read by `rundir`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import config
from benchmarks.analysis import rundir
from benchmarks.run import collectives as rank_side
from benchmarks.run import recorder as results

REQUIRED_META = ("schema_version", "run_id", "backend", "launcher", "world_size", "workload", "status")
STATUSES = ("running", "completed", "failed")
INT_COLUMNS = {
    results.TIMING_CSV: ("world_size", "rank", "epoch", "step", "samples"),
    results.LOSS_CSV: ("world_size", "epoch", "step", "samples"),
}
SECONDS = ("data_s", "forward_s", "backward_s", "optimizer_s", "step_s")
MAX_LINES_SHOWN = 5

# `distbench allreduce` run directories (run.json `kind: allreduce`, allreduce.csv): `allreduce_problems`.
ALLREDUCE_KEYS = (
    "schema_version",
    "kind",
    "run_id",
    "impl",
    "launcher",
    "controller",
    "world_size",
    "dtype",
    "device",
    "sizes",
    "status",
)
RELATIVE_TOLERANCE = 1e-9
ALLREDUCE_COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")
"""Schema 1 runs, without a `collective`, are allreduce."""


@dataclass(frozen=True)
class Problem:
    path: Path
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}" if self.line else f"{self.path}: {self.message}"


def _lines(path: Path, mask: pd.Series, message: str) -> list[Problem]:
    """One problem per offending row (file line = row index + 2), the first few shown."""
    rows = np.flatnonzero(mask.to_numpy())
    problems = [Problem(path, int(i) + 2, message) for i in rows[:MAX_LINES_SHOWN]]
    if len(rows) > MAX_LINES_SHOWN:
        problems.append(Problem(path, None, f"{message}: {len(rows) - MAX_LINES_SHOWN} more lines"))
    return problems


def _numeric(values: pd.Series) -> pd.Series:
    """The column as numbers, with NaN where a value is not one (cheap when pandas parsed numbers)."""
    return values if pd.api.types.is_numeric_dtype(values) else pd.to_numeric(values, errors="coerce")


def read_frame(path: Path) -> tuple[pd.DataFrame | None, list[Problem]]:
    """Parse a CSV; a file that does not end in a newline has a torn last line."""
    if not path.is_file():
        return None, [Problem(path, None, "missing")]
    problems = []
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                handle.seek(0)
                lines = sum(1 for _ in handle)
                problems.append(Problem(path, lines, "truncated last line (no newline): the writer died mid-row"))
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        return None, [*problems, Problem(path, None, f"cannot be parsed: {exc}")]
    return frame, problems


def frame_problems(path: Path, frame: pd.DataFrame, columns: tuple[str, ...], meta: dict[str, Any]) -> list[Problem]:
    if tuple(frame.columns) != columns:
        return [Problem(path, 1, f"header is {','.join(map(str, frame.columns))}; expected {','.join(columns)}")]
    problems: list[Problem] = []
    for column in ("run_id", "backend"):
        values = frame[column] if frame[column].dtype == object else frame[column].astype(str)
        problems += _lines(path, values != str(meta.get(column)), f"{column} differs from run.json")
    for column in INT_COLUMNS.get(path.name, ()):
        if not pd.api.types.is_integer_dtype(frame[column]):  # pandas parsed something else: find the rows
            values = _numeric(frame[column])
            problems += _lines(path, values.isna() | (values != values.round()), f"{column} is not an integer")
    if path.name == results.TIMING_CSV:
        if not pd.api.types.is_bool_dtype(frame["warmup"]):
            bad = ~frame["warmup"].astype(str).isin(["True", "False"])
            problems += _lines(path, bad, "warmup is not True/False")
        for column in SECONDS:
            values = _numeric(frame[column])
            problems += _lines(path, values.isna() | (values < 0), f"{column} is not a non-negative number")
        rank = _numeric(frame["rank"])
        problems += _lines(path, (rank < 0) | (rank >= meta.get("world_size", np.inf)), "rank outside the world")
        problems += _lines(path, frame.duplicated(["rank", "epoch", "step"]), "duplicate (rank, epoch, step)")
        step = _numeric(frame["step"])
        out_of_order = step.groupby(frame["rank"]).diff() <= 0
        problems += _lines(path, out_of_order, "step not after this rank's previous step")
    else:
        problems += _lines(path, ~frame["split"].isin(["train", "val"]), "split is not train or val")
        problems += _lines(path, _numeric(frame["loss"]).isna(), "loss is not a number")
        repeat = ["val_pass"] if "val_pass" in frame else []  # schema 4: --eval-only's passes share a step
        key = ["split", "epoch", "step", *repeat]
        problems += _lines(path, frame.duplicated(key), f"duplicate ({', '.join(key)})")
        if repeat:
            val = frame["split"] == "val"
            seconds = _numeric(frame["val_s"])
            problems += _lines(path, val & ~(seconds > 0), "a val row's val_s is not a positive number")
    return problems


def summary_problems(
    path: Path,
    summary: pd.DataFrame,
    timing: pd.DataFrame | None,
    schema: int = results.SCHEMA_VERSION,
    loss: pd.DataFrame | None = None,
) -> list[Problem]:
    if tuple(summary.columns) != results.SUMMARY_COLUMNS_OF.get(schema, results.SUMMARY_COLUMNS):
        return [Problem(path, 1, f"header differs from the contract of schema_version {schema}")]
    if len(summary) != 1:
        return [Problem(path, None, f"{len(summary)} rows; expected exactly one")]
    row = summary.iloc[0]
    problems = memory_problems(path, row) if schema >= 3 else []
    if schema >= 4:
        problems += validation_problems(path, row, loss)
    if timing is None or not pd.notna(row["samples_per_s"]):
        return problems
    timed = timing[timing["warmup"].astype(str) == "False"]
    if row["timed_steps"] != timed["step"].nunique():
        problems.append(
            Problem(path, 2, f"timed_steps {row['timed_steps']} but timing.csv has {timed['step'].nunique()}")
        )
    recomputed = timed["samples"].sum() / row["wall_s"] if row["wall_s"] > 0 else np.nan
    if not np.isclose(recomputed, row["samples_per_s"], rtol=1e-6):
        problems.append(
            Problem(path, 2, f"samples_per_s {row['samples_per_s']:.6g} but the rows give {recomputed:.6g}")
        )
    step_p50 = timed.groupby("step")["step_s"].max().median()  # the slowest rank's time of each step
    if not np.isclose(step_p50, row["step_p50_s"], rtol=1e-6):
        problems.append(Problem(path, 2, f"step_p50_s {row['step_p50_s']:.6g} but the rows give {step_p50:.6g}"))
    if "compute_s" in row and pd.notna(row["compute_s"]):
        if not np.isclose(row["step_p50_s"] - row["compute_s"], row["exposed_comm_s"], rtol=1e-6, atol=1e-12):
            problems.append(Problem(path, 2, "exposed_comm_s is not step_p50_s − compute_s"))
    if schema >= 5 and pd.notna(row["model_flops_per_step"]) and row["wall_s"] > 0:
        achieved = row["model_flops_per_step"] * row["timed_steps"] / row["wall_s"] / 1e12
        if not np.isclose(achieved, row["achieved_tflops_per_rank"], rtol=1e-6):
            problems.append(
                Problem(path, 2, "achieved_tflops_per_rank is not model_flops_per_step × timed_steps ÷ wall_s")
            )
        elif pd.notna(row["mfu"]) and not np.isclose(achieved / row["peak_tflops"], row["mfu"], rtol=1e-6):
            problems.append(Problem(path, 2, "mfu is not achieved_tflops_per_rank ÷ peak_tflops"))
    return problems


def validation_problems(path: Path, row: pd.Series, loss: pd.DataFrame | None) -> list[Problem]:
    """Schema 4: `val_s` is the median of loss.csv's `val` rows' times, `val_samples_per_s` the set's size ÷
    it, the strategy a known one, and the samples evaluated minus the duplicates the set's size."""
    problems = []
    if pd.notna(row["val_strategy"]) and row["val_strategy"] not in config.VAL_STRATEGIES:
        problems.append(
            Problem(path, 2, f"val_strategy {row['val_strategy']!r} is not one of {', '.join(config.VAL_STRATEGIES)}")
        )
    if loss is None or "val_s" not in loss:
        return problems
    val = loss[loss["split"] == "val"]
    times = _numeric(val["val_s"]).dropna()
    if row["val_passes"] != len(times):
        problems.append(
            Problem(path, 2, f"val_passes {row['val_passes']} but loss.csv has {len(times)} timed val rows")
        )
    if not len(times):
        return problems
    if not np.isclose(times.median(), row["val_s"], rtol=1e-6):
        problems.append(Problem(path, 2, f"val_s {row['val_s']:.6g} but loss.csv's val rows give {times.median():.6g}"))
    size = _numeric(val["samples"]).iloc[-1]
    if not np.isclose(size / row["val_s"], row["val_samples_per_s"], rtol=1e-6):
        problems.append(
            Problem(
                path, 2, f"val_samples_per_s {row['val_samples_per_s']:.6g} is not the set's {size:g} samples ÷ val_s"
            )
        )
    if pd.notna(row["val_samples"]) and row["val_samples"] - row["val_duplicates"] != size:
        problems.append(
            Problem(
                path,
                2,
                f"val_samples {row['val_samples']} − val_duplicates {row['val_duplicates']} "
                f"is not the set's {size:g} samples",
            )
        )
    return problems


def memory_problems(path: Path, row: pd.Series) -> list[Problem]:
    """Schema 3's memory columns: each measure's smallest rank ≤ its largest, both empty or both MiB (≥ 0,
    but for `training_rss`, a difference of two readings)."""
    problems = []
    for measure in results.MEMORY_MEASURES:
        low, high = (pd.to_numeric(pd.Series([row[f"{measure}_{end}"]]), errors="coerce")[0] for end in ("min", "max"))
        negative = measure != "training_rss_mb" and low < 0
        if pd.isna(low) != pd.isna(high) or negative or low > high:
            problems.append(Problem(path, 2, f"{measure}_min {low} and _max {high} are not a range of MiB"))
    sources = (results.PEAK_FROM_MODEL_BUILD, results.PEAK_FROM_PROCESS_START)
    if pd.notna(row["peak_rss_from"]) and row["peak_rss_from"] not in sources:
        problems.append(Problem(path, 2, f"peak_rss_from {row['peak_rss_from']!r} is not one of {', '.join(sources)}"))
    return problems


def meta_problems(run_dir: Path) -> tuple[dict[str, Any] | None, list[Problem]]:
    path = run_dir / results.RUN_JSON
    try:
        meta = rundir.read(run_dir)
    except (OSError, ValueError) as exc:
        return None, [Problem(path, None, f"cannot be read: {exc}")]
    problems = [Problem(path, None, f"missing key {key!r}") for key in REQUIRED_META if key not in meta]
    if meta.get("schema_version") not in results.KNOWN_SCHEMAS:
        problems.append(Problem(path, None, f"schema_version {meta.get('schema_version')!r} is not known"))
    if meta.get("status") not in STATUSES:
        problems.append(Problem(path, None, f"status {meta.get('status')!r} is not one of {', '.join(STATUSES)}"))
    elif rundir.status(meta) != meta["status"]:
        problems.append(Problem(path, None, rundir.DIED))
    return meta, problems + [Problem(path, None, p) for p in conditions_problems(meta)]


def conditions_problems(meta: dict[str, Any]) -> list[str]:
    """run.json `placement` and `environment`, where recorded (runs before them have neither, and pass): a
    placement per rank, and variables as names and texts."""
    problems = []
    placement = meta.get("placement")
    if placement is not None:
        per_rank = placement.get("per_rank") if isinstance(placement, dict) else None
        if not isinstance(per_rank, list) or len(per_rank) != meta.get("world_size"):
            problems.append(f"placement.per_rank is not a list of world_size ({meta.get('world_size')}) entries")
        elif not all(isinstance(r, dict) and isinstance(r.get("cpus"), str) for r in per_rank):
            problems.append("placement.per_rank: every entry needs its cpus as a list text, e.g. '0-3'")
    environment = meta.get("environment")
    if environment is not None:
        variables = environment.get("variables") if isinstance(environment, dict) else None
        if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
            problems.append("environment.variables is not a mapping of variable names to their values")
    return problems


def check_frames(
    run_dir: Path, meta: dict[str, Any], frames: dict[str, tuple[pd.DataFrame | None, list[Problem]]]
) -> list[Problem]:
    """Problems in already-parsed CSVs (`report` parses each file once and checks it here)."""
    problems: list[Problem] = []
    schema = meta.get("schema_version", results.SCHEMA_VERSION)
    loss_columns = results.LOSS_COLUMNS_OF.get(schema, results.LOSS_COLUMNS)
    columns = {results.TIMING_CSV: results.TIMING_COLUMNS, results.LOSS_CSV: loss_columns}
    for name, cols in columns.items():
        frame, read = frames[name]
        problems += read
        if frame is not None:
            problems += frame_problems(run_dir / name, frame, cols, meta)
    summary, read = frames.get(results.SUMMARY_CSV, (None, []))
    if meta.get("status") == "completed":
        problems += read
        if summary is not None:
            timing, loss = frames[results.TIMING_CSV][0], frames[results.LOSS_CSV][0]
            problems += summary_problems(run_dir / results.SUMMARY_CSV, summary, timing, schema, loss)
    return problems


def read_frames(run_dir: Path) -> dict[str, tuple[pd.DataFrame | None, list[Problem]]]:
    return {name: read_frame(run_dir / name) for name in (results.TIMING_CSV, results.LOSS_CSV, results.SUMMARY_CSV)}


def check_run(run_dir: Path) -> list[Problem]:
    meta, problems = meta_problems(run_dir)
    if meta is None:
        return problems
    if meta.get("kind") == rank_side.KIND:  # `distbench allreduce`: its own files and contract
        return [Problem(run_dir, None, line) for line in allreduce_problems(run_dir)]
    return problems + check_frames(run_dir, meta, read_frames(run_dir))


def allreduce_problems(run_dir: Path) -> list[str]:
    """Problems of one allreduce run directory as lines (empty when it passes `distbench check`)."""
    run_dir, run_json = Path(run_dir), results.RUN_JSON
    meta = rundir.read_or_none(run_dir)
    if meta is None:
        return [f"{run_json}: missing or not a JSON object"]
    version = meta.get("schema_version")
    keys = (*ALLREDUCE_KEYS, "collective") if version != 1 else ALLREDUCE_KEYS
    problems = [f"{run_json}: missing key '{k}'" for k in keys if k not in meta]
    if version not in rank_side.SCHEMA_COLUMNS:
        known = ", ".join(map(str, rank_side.SCHEMA_COLUMNS))
        problems.append(f"{run_json}: schema_version {version!r} is not one this distbench knows ({known})")
    if meta.get("collective", "allreduce") not in ALLREDUCE_COLLECTIVES:
        problems.append(
            f"{run_json}: collective {meta.get('collective')!r} is not one of {', '.join(ALLREDUCE_COLLECTIVES)}"
        )
    status = rundir.status(meta)
    if status not in ("running", "completed", "failed"):
        problems.append(f"{run_json}: status {status!r} is not running, completed or failed")
    elif status == "failed" and meta.get("status") == "running":
        problems.append(f"{run_json}: {rundir.DIED}")
    if problems:
        return problems
    path = run_dir / rank_side.CSV_NAME
    if not path.is_file():
        return [f"{rank_side.CSV_NAME}: missing"]
    text = path.read_text()
    if text and not text.endswith("\n"):
        problems.append(f"{rank_side.CSV_NAME}: the last line is cut off (no newline)")
    rows = pd.read_csv(path, dtype=str, keep_default_na=False)
    columns = rank_side.SCHEMA_COLUMNS[meta["schema_version"]]
    if tuple(rows.columns) != columns:
        return [*problems, f"{rank_side.CSV_NAME}: header is {','.join(rows.columns)}, expected {','.join(columns)}"]
    return problems + _allreduce_rows(rows, meta, status)


def _non_negative(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


def _allreduce_rows(rows: pd.DataFrame, meta: dict, status: str) -> list[str]:
    problems: list[str] = []
    name = rank_side.CSV_NAME
    width = config.DTYPES.get(str(meta.get("dtype")), 0)
    world = int(meta.get("world_size") or 0)
    collective = meta.get("collective", "allreduce")
    factor = "2(n−1)/n" if collective == "allreduce" else "(n−1)/n"
    cpu = (*rank_side.CPU_COLUMNS, rank_side.IDLE_COLUMN)  # measured: empty on a wrong row, never negative
    if status == "completed" and list(pd.to_numeric(rows["size_bytes"], errors="coerce")) != meta["sizes"]:
        problems.append(f"{name}: sizes are not run.json's {meta['sizes']} (one row per size, in order)")
    for i, row in enumerate(rows.to_dict("records"), start=2):
        where = f"{name}:{i}:"
        try:
            size, elements = int(row["size_bytes"]), int(row["elements"])
            iters, warmup = int(row["iterations"]), int(row["warmup"])
        except ValueError:
            problems.append(f"{where} size_bytes, elements, iterations and warmup must be integers")
            continue
        if row.get("collective", collective) != collective:
            problems.append(f"{where} collective {row['collective']!r} is not run.json's {collective!r}")
        if row["correct"] not in ("True", "False"):
            problems.append(f"{where} correct is {row['correct']!r}, not True or False")
        if elements * width != size or iters < 1 or warmup < 0:
            problems.append(f"{where} elements × {meta.get('dtype')} width ≠ size_bytes, or iterations < 1")
        timed = ("time_mean_s", "time_min_s", "time_max_s", "algbw_gbps", "busbw_gbps")
        if row["correct"] != "True":
            if any(row.get(c, "") != "" for c in (*timed, *cpu)):
                problems.append(f"{where} a wrong result claims a time or bandwidth")
            if status == "completed":
                problems.append(f"{where} a completed run has a wrong result")
            continue
        try:
            mean, low, high, alg, bus = (float(row[c]) for c in timed)
        except ValueError:
            problems.append(f"{where} {', '.join(timed)} must be numbers")
            continue
        if not (0 < low <= mean * (1 + RELATIVE_TOLERANCE) and mean <= high * (1 + RELATIVE_TOLERANCE)):
            problems.append(f"{where} not 0 < time_min_s <= time_mean_s <= time_max_s")
            continue
        for c in cpu:
            if c in row and not _non_negative(row[c]):
                problems.append(f"{where} {c} {row[c]!r} is not a number ≥ 0")
        if not math.isclose(alg, rank_side.algbw_gbps(size, mean), rel_tol=1e-6):
            problems.append(f"{where} algbw_gbps {alg} is not size_bytes / time_mean_s / 1e9")
        expected = rank_side.busbw_gbps(size, mean, world, collective) if world else bus
        if not math.isclose(bus, expected, rel_tol=1e-6, abs_tol=1e-12):
            problems.append(f"{where} busbw_gbps {bus} is not algbw_gbps × {factor} for n = {world} ({collective})")
    return problems
