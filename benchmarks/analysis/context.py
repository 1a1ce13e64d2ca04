"""What was compared: the part of a report that lets a reader judge the numbers without the runs.

Workload and its size, per-rank and global batch, steps timed, world size, launcher and controller
per backend, versions, threads, CPU placement, hosts and network, and every knob, option or recorded
environment variable that differs between the backends.
"""

from __future__ import annotations

import pandas as pd

from backends import horovod_autotune
from benchmarks.analysis.load import INTERRUPTED, RunSet
from benchmarks.analysis.tables import seconds

BACKEND_FACTS = {
    "launcher": "launcher",
    "launcher_detail": "launcher detail",
    "knob_controller": "controller",
    "knob_dist_backend": "process group",
    "world_size": "world size",
    "threads": "threads",
    "omp_num_threads_env": "OMP_NUM_THREADS",
    "placement": "CPU placement",
    "network": "hosts and network",
    "optimizer": "optimizer",
    "knob_autotuned": "Horovod autotuner settled on",
}
SHOWN_AS_FACTS = ("knob_autotune", "knob_autotuned")
"""Knobs of the facts table (the autotuner's search and outcome), not repeated among the differing options."""


def _text(value: object) -> str:
    """A recorded value as written: integers as integers (a column with a missing value holds floats, so
    2048 would read 2048.0), other numbers to 6 significant digits, '—' for not recorded."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if isinstance(value, dict):  # run.json knobs.autotuned in one line (backends.horovod_autotune.summary)
        return horovod_autotune.summary(value) if "log" in value else "; ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    return str(value)


def _values(series: pd.Series) -> str:
    """The distinct values of a column, '—' for not recorded (older runs, or not this backend's)."""
    return ", ".join(dict.fromkeys(_text(v) for v in series))


def _all_runs(rs: RunSet) -> pd.DataFrame:
    return pd.concat([rs.runs, rs.left_out], ignore_index=True) if len(rs.left_out) else rs.runs


def setup_table(rs: RunSet, per_run: pd.DataFrame) -> pd.DataFrame:
    """One row per workload, global batch and world size: the size of what was measured."""
    mine = per_run[["run_key", "backend", "status", "timed_steps"]]
    runs = _all_runs(rs).drop(columns=["backend", "status"]).merge(mine, on="run_key")
    keys = ["workload", "global_batch", "world_size"]
    rows = []
    for setup, group in runs.groupby(keys, sort=False, dropna=False):
        get = group.get
        rows.append(
            {
                **dict(zip(keys, setup, strict=True)),
                "parameters": _values(get("model_parameters", pd.Series([None]))),
                "batch per rank": _values(get("config_batch_size", pd.Series([None]))),
                "accumulate": _values(get("config_accumulate", pd.Series([None]))),
                "timed steps per run": _values(group["timed_steps"].dropna().astype(int)) or "—",
                "timed window per run (s)": ", ".join(dict.fromkeys(map(seconds, group["timed_wall_s"].dropna())))
                or "—",
                "warm-up steps": _values(get("config_warmup_steps", pd.Series([None]))),
                "validation buffers": _values(get("validation_buffers", pd.Series([None]))),
                "runs": ", ".join(_counted(b, rows.status) for b, rows in group.groupby("backend", sort=False)),
            }
        )
    return pd.DataFrame(rows)


def _counted(backend: str, status: pd.Series) -> str:
    """'ddp ×3', or 'ddp ×3 and 1 interrupted' where a signal stopped some: those measured nothing."""
    stopped = int((status == INTERRUPTED).sum())
    return f"{backend} ×{len(status) - stopped}" + (f" and {stopped} interrupted" if stopped else "")


def _by(runs: pd.DataFrame) -> str:
    """The column a table's columns are: the variant (ddp@torchrun and ddp@mpirun are two), where recorded."""
    return "variant" if "variant" in runs else "backend"


def backend_facts(rs: RunSet) -> pd.DataFrame:
    """Per variant: how it was launched, its threads and placement, and the versions it ran with."""
    runs = _all_runs(rs)
    columns = [c for c in BACKEND_FACTS if c in runs] + sorted(c for c in runs if c.startswith("version_"))
    table = runs.groupby(_by(runs), sort=False)[columns].agg(_values).T
    table.index = [BACKEND_FACTS.get(c, c.removeprefix("version_")) for c in table.index]
    return table.rename_axis("").reset_index()


def _option_name(column: str) -> str:
    if column.startswith("env_"):  # a variable's name is shown as the user exports it
        return f"environment {column.removeprefix('env_')}"
    return column.replace("knob_", "knob ").replace("config_", "--").replace("_", "-")


def differing_options(rs: RunSet) -> pd.DataFrame:
    """Every knob (`knob_*`), run option (`config_*`) and recorded environment variable (`env_*`, run.json
    `environment.variables`) whose value differs between the variants (two of one backend included).

    A knob only one backend has (DDP's bucket size, Horovod's fusion threshold), or a variable set for one
    variant's runs only, differs too: '—' marks the variant without it.
    """
    runs = _all_runs(rs)
    columns = [c for c in runs if c.startswith(("knob_", "config_", "env_")) and c not in SHOWN_AS_FACTS]
    if runs[_by(runs)].nunique() < 2 or not columns:
        return pd.DataFrame(columns=["option"])
    table = runs.groupby(_by(runs), sort=False)[columns].agg(_values).T
    table = table[table.nunique(axis=1) > 1]
    table.index = [_option_name(c) for c in table.index]
    return table.rename_axis("option").reset_index()


def headline(rs: RunSet, per_run: pd.DataFrame) -> str:
    """One line for the terminal: what was compared, at what size."""
    parts = []
    for row in setup_table(rs, per_run).to_dict("records"):
        params = f" ({row['parameters']} parameters)" if row["parameters"] != "—" else ""
        parts.append(
            f"{row['workload']}{params}, global batch {_text(row['global_batch'])} ({row['batch per rank']} per "
            f"rank × accumulate {row['accumulate']}), {_text(row['world_size'])} rank(s), {row['timed steps per run']} "
            f"timed steps per run: {row['runs']}"
        )
    return "compared: " + "; ".join(parts)


NOT_MEASURED = (
    "config_trace",
    "config_trace_steps",
    "config_compute_baseline_steps",
    "config_overwrite",
    "knob_autotuned",
)
"""Options that change no recorded number (they act after the timed steps, or on the run directory), and what
Horovod's autotuner settled on: an outcome of one setting, which may differ from repeat to repeat."""


def pooled_settings(rs: RunSet) -> list[str]:
    """Warnings for a variant whose runs in one setup differ in a knob or run option (a tune directory's
    sweep, say): its throughput interval would pool different settings as if they were repeats."""
    runs = rs.runs
    if "variant" not in runs:
        return []
    columns = [c for c in runs if c.startswith(("knob_", "config_")) and c not in NOT_MEASURED]
    said = []
    for (variant, *setup), group in runs.groupby(["variant", "workload", "global_batch", "world_size"], sort=False):
        differ = [c for c in columns if group[c].astype(str).nunique() > 1]
        if differ:
            plain = dict.fromkeys(c.split("_", 1)[1] for c in differ)  # a knob is often also an option
            names = ", ".join(f"--{n}".replace("_", "-") if f"config_{n}" in runs else n for n in plain)
            said.append(
                f"warning: {variant} ({setup[0]}, global batch {_text(setup[1])}, {_text(setup[2])} rank(s)): its runs "
                f"differ in {names}, so its interval pools different settings as if they were repeats; report the "
                "runs of one setting at a time (for a tune, its report/)"
            )
    return said
