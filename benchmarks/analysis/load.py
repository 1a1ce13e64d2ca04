"""Load result directories into tidy pandas frames (statistics are in `tables`).

import backends
from benchmarks.analysis.load import load_runs
rs = load_runs("results/runs")                  # a run dir, a compare dir, a tree of them, or a glob
rs.runs, rs.timing, rs.loss                     # metadata joined in; `run_key` (the run's path) is unique

Every compare names its runs `ddp-r0`, `horovod-r0`, …, so `run_id` repeats across comparisons; rows
are keyed by `run_key`, the run directory's path.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import backends
from benchmarks.analysis import check, rundir
from benchmarks.config import step_of
from benchmarks.launch import placement
from benchmarks.run import recorder as results

RUN_COLUMNS = ("run_id", "backend", "launcher", "world_size", "workload", "global_batch", "threads", "status")
EXTRA_COLUMNS = (
    "launcher_detail",
    "local_world_size",
    "train_size",
    "val_size",
    "model_parameters",
    "validation_buffers",
    "omp_num_threads_env",
    "timed_wall_s",
    "error",
    "failed_rank",
    "oversubscribed",
    "cpus",
)
JOINED = ("launcher", "workload", "global_batch", "status", "step_config")  # run columns onto timing and loss rows
INTERRUPTED = "interrupted"
"""The analysis's status of a run a signal stopped (run.json: `failed` with `"interrupted": true`, or a rank's
`interrupted by SIGINT` error), as comparison.csv calls it: not a failure of what was measured."""
NUMERIC = {
    results.TIMING_CSV: ("world_size", "rank", "epoch", "step", "samples", *check.SECONDS),
    results.LOSS_CSV: ("world_size", "epoch", "step", "loss", "accuracy", "samples", *results.VAL_LOSS_COLUMNS),
}
CONFIG_SKIPPED = ("out", "run_id", "quiet")  # where a run was written says nothing about what it measured
MEMORY_COLUMNS = results.MEMORY_COLUMNS
"""summary.csv's memory columns (schema 3), copied onto each run's row; NaN for older runs."""
VALIDATION_COLUMNS = results.VALIDATION_COLUMNS
"""summary.csv's validation columns (schema 4), copied onto each run's row; NaN for older runs, but
`val_strategy` (`exact`: the only validation there was) and `eval_only` (False)."""


class SchemaError(ValueError):
    """A result file distbench does not know how to read."""


@dataclass
class RunSet:
    runs: pd.DataFrame
    """One row per run: `run_key` (its directory), run.json's fields, `config_*`, `knob_*`, `version_*`, `env_*`
    (rank 0's recorded environment variables), `placement` (its CPU placement in words) and `network` (its
    hosts, interface and link in words)."""
    timing: pd.DataFrame
    loss: pd.DataFrame
    skipped: list[str] = dataclasses.field(default_factory=list)
    """Runs left out, with the reason: not completed, or failing `distbench check`."""
    left_out: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    """The left-out runs as rows (the `runs` columns), so tables can count and explain them."""


def find_run_dirs(*paths: str | Path) -> list[Path]:
    """Run directories (holding run.json) at or anywhere below each path or glob match, in path order."""
    found: list[Path] = []
    for pattern in paths:
        for path in [Path(p) for p in sorted(glob.glob(str(pattern)))] or [Path(pattern)]:
            if (path / results.RUN_JSON).is_file():
                found.append(path)
                continue
            for parent, dirs, files in os.walk(path):
                dirs.sort()
                if results.RUN_JSON in files:
                    found.append(Path(parent))
                    dirs.clear()  # a run directory holds no runs of its own
    unique = {p.resolve(): p for p in reversed(found)}  # the same run reached twice is loaded once
    return sorted(unique.values(), key=str)


def network_words(network: Any) -> str | None:
    """run.json `network` in words: 'one host', '2 hosts over eth0, emulated link 1gbit'; None if not recorded."""
    if not isinstance(network, dict):
        return None
    if (network.get("hosts") or 1) <= 1:
        return "one host"
    via = f" over {network['iface']}" if network.get("iface") else ""
    link = f", emulated link {network.get('link')}" if network.get("emulated") else ""
    return f"{network['hosts']} hosts{via}{link}"


def run_row(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The `runs` row of one run: older run.json files lack newer keys, which come out as None."""
    row: dict[str, Any] = {"run_key": str(run_dir), "compare_id": run_dir.parent.name}
    row.update({key: meta.get(key) for key in (*RUN_COLUMNS, *EXTRA_COLUMNS)})
    config = meta.get("config") or {}
    row.update({f"config_{k}": v for k, v in config.items() if k not in CONFIG_SKIPPED})
    row.update({f"knob_{k}": v for k, v in (meta.get("knobs") or {}).items()})
    row.update({f"version_{k}": v for k, v in (meta.get("versions") or {}).items()})
    row.update({f"env_{k}": v for k, v in ((meta.get("environment") or {}).get("variables") or {}).items()})
    row["placement"] = placement.summary(meta.get("placement"))
    row["network"] = network_words(meta.get("network"))
    optimizer = meta.get("optimizer")
    row["optimizer"] = ", ".join(f"{k}={v}" for k, v in optimizer.items()) if isinstance(optimizer, dict) else optimizer
    row["path"] = str(run_dir)
    row["val_strategy"], row["eval_only"] = strategy_of(meta), bool(meta.get("eval_only"))
    per_rank = (meta.get("validation") or {}).get("per_rank") or []
    row["val_most_on_a_rank"] = max((r.get("samples", 0) for r in per_rank), default=np.nan)  # bounds its time
    row["variant"] = with_strategy(run_variant(meta), row["val_strategy"])
    row["step_config"] = step_of(config)  # part of a setup: runs of different steps are never pooled or compared
    row.update(state_row(meta))
    return row


STATE_PARTS = ("param_bytes", "grad_bytes", "optimizer_state_bytes")


def state_row(meta: dict[str, Any]) -> dict[str, float]:
    """`state_mb_min`/`_max`: the training state a rank holds (parameters, gradients and optimizer state, its
    shards under FSDP2; run.json memory.per_rank), smallest and largest rank, in MiB; NaN before it was recorded."""
    ranks = [r for r in ((meta.get("memory") or {}).get("per_rank") or []) if all(k in r for k in STATE_PARTS)]
    held = [sum(float(r[k] or 0) for k in STATE_PARTS) / 2**20 for r in ranks]
    return {"state_mb_min": min(held, default=np.nan), "state_mb_max": max(held, default=np.nan)}


def was_interrupted(meta: dict[str, Any]) -> bool:
    """A run that Ctrl-C or a signal to `distbench compare` stopped: compare marks it `"interrupted": true`,
    a plain `distbench run`'s ranks record `interrupted by SIGINT …`."""
    error = meta.get("error")
    return meta.get("status") != "completed" and (
        meta.get("interrupted") is True or (isinstance(error, str) and error.startswith("interrupted"))
    )


def memory_row(summary: pd.DataFrame | None) -> dict[str, Any]:
    """A run's memory and validation columns from its summary.csv: NaN when it has none (before schemas 3
    and 4, no summary), but the strategy and eval_only, which older runs had only one of."""
    known = summary is not None and len(summary) == 1
    return {c: summary[c].iloc[0] if known and c in summary else np.nan for c in (*MEMORY_COLUMNS, *VALIDATION_COLUMNS)}


def strategy_of(meta: dict[str, Any]) -> str:
    """The run's --val-strategy: `exact` for runs from before there was a choice."""
    strategy = (meta.get("validation") or {}).get("strategy") or (meta.get("config") or {}).get("val_strategy")
    return str(strategy or "exact")


def with_strategy(name: str, strategy: object) -> str:
    """A variant's or backend's name for the tables, with its validation strategy unless `exact`: runs of
    different strategies are different rows, never pooled (`ddp@torchrun (val sampler)`)."""
    return name if strategy in (None, "exact") or strategy != strategy else f"{name} (val {strategy})"


def run_variant(meta: dict[str, Any]) -> str:
    """`compare`'s name for how the run was launched: ddp@torchrun, horovod@gloo, horovod@mpi, …"""
    backend, launcher = str(meta.get("backend") or "?"), str(meta.get("launcher") or "")
    controller = (meta.get("knobs") or {}).get("controller") or meta.get("launcher_detail") or ""
    by_controller = backend in backends.DECLARED and any(v.controller for v in backends.DECLARED[backend].variants)
    return backends.label(backend, launcher, str(controller) if by_controller else "")


def _compare_order(runs: pd.DataFrame) -> pd.DataFrame:
    """Variants in the order `compare --backends` gave them (its comparison.csv), so the report's ratio
    base is the compare table's; runs outside a comparison keep their path order, after those. Also each
    run's scaling mode (`scaling`: weak or strong, from comparison.csv; None outside a comparison)."""
    rank: dict[str, int] = {}
    scaling: dict[str, str] = {}
    for parent in dict.fromkeys(Path(key).parent for key in runs["run_key"]):
        listed = parent / "comparison.csv"
        if not listed.is_file():
            continue
        table = pd.read_csv(listed)
        column = "variant" if "variant" in table else "backend"  # comparisons before variants list backends
        for name in table[column]:
            rank.setdefault(str(name), len(rank))
        if "scaling" in table:
            scaling.update({str(parent / str(r)): str(m) for r, m in zip(table.run_id, table.scaling, strict=True)})
    runs = runs.assign(scaling=runs["run_key"].map(lambda k: scaling.get(str(k))))
    if not rank:
        return runs
    # A strategy's rows follow their variant's (comparison.csv names the variant alone).
    plain = runs["variant"].astype(str).str.split(" (val ", n=1, regex=False).str[0]
    named = zip(plain, runs["backend"].astype(str), strict=True)
    order = pd.Series([rank.get(v, rank.get(b, len(rank))) for v, b in named], index=runs.index)
    return runs.iloc[order.argsort(kind="stable")].reset_index(drop=True)


def _numbers(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Numeric contract columns as numbers: a run taken in with --include-failed may hold a torn or
    unparsable value, which would make the whole column text once frames are joined."""
    numeric = NUMERIC.get(name, ())
    bad = [c for c in numeric if c in frame and not pd.api.types.is_numeric_dtype(frame[c])]
    fixed = {c: pd.to_numeric(frame[c], errors="coerce") for c in bad}
    if "warmup" in frame and not pd.api.types.is_bool_dtype(frame["warmup"]):
        fixed["warmup"] = frame["warmup"].astype(str) == "True"
    return frame.assign(**fixed) if fixed else frame


def load_runs(*paths: str | Path, include_failed: bool = False) -> RunSet:
    """Load runs into tidy frames; timing and loss rows carry their run's metadata.

    Runs that did not complete, or that fail `distbench check`, are left out (listed in `skipped`
    and `left_out`) unless `include_failed`.
    """
    dirs = [d for d in find_run_dirs(*paths) if not rundir.is_allreduce(d)]  # `distbench allreduce`'s own
    if not dirs:
        raise FileNotFoundError(f"no run directories (with {results.RUN_JSON}) under {', '.join(map(str, paths))}")
    metas, left_out, timings, losses, skipped = [], [], [], [], []
    for run_dir in dirs:
        meta, problems = check.meta_problems(run_dir)
        if meta is None or meta.get("schema_version") not in results.KNOWN_SCHEMAS:
            raise SchemaError(f"{'; '.join(map(str, problems))}; upgrade distbench to read it")
        if rundir.status(meta) != meta.get("status"):  # left `running` by a process that is gone
            meta.update(status="failed", error=meta.get("error") or rundir.DIED)
        frames = check.read_frames(run_dir)
        problems += check.check_frames(run_dir, meta, frames)
        row = {**memory_row(frames[results.SUMMARY_CSV][0]), **run_row(run_dir, meta)}
        if was_interrupted(meta):
            row["status"] = INTERRUPTED
        if not include_failed and (meta["status"] != "completed" or problems):
            if meta.get("error") == rundir.DIED:
                why = rundir.DIED
            elif row["status"] == INTERRUPTED:
                why = str(meta.get("error") or INTERRUPTED)
            elif meta["status"] != "completed":
                why = f"status {meta['status']}" + (f": {meta['error']}" if meta.get("error") else "")
            else:
                why = f"{len(problems)} check problem{'s' * (len(problems) != 1)}, the first: {problems[0]}"
            skipped.append(f"{run_dir}: {why}")
            left_out.append(
                {
                    **row,
                    "status": row["status"] if meta["status"] != "completed" else "check problems",
                    "error": meta.get("error") or (str(problems[0]) if problems else None),
                }
            )
            continue
        metas.append(row)
        for name, sink in ((results.TIMING_CSV, timings), (results.LOSS_CSV, losses)):
            frame_, _ = frames[name]
            if frame_ is not None and len(frame_) and "run_id" in frame_:  # a run that died early has no rows
                sink.append((row["run_key"], _numbers(frame_, name)))
    if not metas:
        raise FileNotFoundError(f"no usable runs under {', '.join(map(str, paths))}: {'; '.join(skipped)}")
    runs = _compare_order(pd.DataFrame(metas))
    by_key = runs.set_index("run_key")

    def frame(parts: list[tuple[str, pd.DataFrame]], categorical: bool) -> pd.DataFrame:
        if not parts:
            return pd.DataFrame()
        out = pd.concat([p for _, p in parts], ignore_index=True)
        # Codes by part, not a string column per part: timing has a row per rank per step.
        codes = np.repeat(np.arange(len(parts)), [len(p) for _, p in parts])
        out["run_key"] = pd.Categorical.from_codes(codes, categories=[k for k, _ in parts])
        if categorical:  # categories make grouping a million rows by run cheap
            out["run_id"], out["backend"] = out["run_id"].astype("category"), out["backend"].astype("category")
        else:
            out["run_key"] = out["run_key"].astype(str)
        for column in JOINED:
            out[column] = out["run_key"].map(by_key[column])
        return out

    return RunSet(
        runs=runs,
        timing=frame(timings, True),
        loss=frame(losses, False),
        skipped=skipped,
        left_out=pd.DataFrame(left_out),
    )
