"""What compare (and tune) write of their runs: each job's `Attempt`, comparison.csv with the terminal tables
built from it, and the time line (how much of the wall time was inside timed windows).

Imported by compare, which the parser of every `distbench` process imports: neither torch nor the analysis
stack (pandas, scipy, matplotlib) at module level.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import config, files
from benchmarks.suite.variants import Job

WEAK, STRONG = "weak", "strong"
"""comparison.csv `scaling`: the per-rank batch kept (weak) or the global batch kept (strong, --global-batch)."""


@dataclass
class Attempt:
    """One job of a compare (or tune): what it was asked to run, and how it ended."""

    variant: str
    backend: str
    nproc: int
    batch_size: int
    """Per-rank micro-batch the run was given."""
    repeat: int
    run_id: str
    command: list[str]
    returncode: int | None = None
    job_wall_s: float = float("nan")
    """The whole job: launcher, start-up, training, validation, exit."""
    timed_wall_s: float = float("nan")
    """The run's timed window (run.json, read by `write_comparison`), NaN if it recorded none."""
    interrupted: bool = False
    """A signal to compare (or tune) stopped this job before its run completed."""
    val_strategy: str = "exact"
    """The run's --val-strategy (`compare --val-strategy a,b`: each strategy its own runs and rows)."""
    signalled: bool = False
    """The signal reached this job; its exit code may then be the signal's even though its run completed."""
    outside: dict[str, float] = dataclasses.field(default_factory=dict)
    """run.json `outside`: its seconds outside the timed window, by part (empty if it recorded none)."""
    step_config: str = config.PLAIN_STEP
    """The step it trained, in words (config.step_of): part of what a row compares, as the strategy is."""


def time_line(attempts: list[Attempt], phases: dict[str, float], wall_s: float) -> str:
    """Where the wall time went: the share inside the runs' timed windows is what was measured; then, per job
    that recorded its parts, the mean seconds of each part outside its window (`outside_parts`)."""
    timed = sum(a.timed_wall_s for a in attempts if a.timed_wall_s == a.timed_wall_s)  # NaN ≠ NaN
    share = timed / wall_s if wall_s > 0 else float("nan")
    spent = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    line = f"time: {timed:.1f} s of {wall_s:.1f} s wall inside timed windows ({share:.0%}); {spent}"
    parts = outside_parts(attempts)
    if parts:
        total = sum(parts.values())
        line += (
            f"\n  outside the timed window, per job: {total:.1f} s ("
            + ", ".join(f"{name.replace('_', ' ')} {seconds:.1f}" for name, seconds in parts.items())
            + ")"
        )
    return line


OUTSIDE_ORDER = (
    "start",
    "checks_and_join",
    "build",
    "warmup",
    "gathers",
    "validation",
    "baseline",
    "step_measure",
    "trace",
    "record",
)
"""run.json `outside`'s parts in the order a run spends them."""


def outside_parts(attempts: list[Attempt]) -> dict[str, float]:
    """The mean seconds per job of each part outside the timed window, over the jobs that recorded them:
    `launch and exit` is the job's wall time less everything its run recorded (the launcher's start, its ranks'
    exit, the process group's teardown)."""
    recorded = [a for a in attempts if a.outside and a.timed_wall_s == a.timed_wall_s]
    if not recorded:
        return {}
    found = dict.fromkeys(k for a in recorded for k in a.outside)  # run.json's keys come sorted: put them in order
    names = [k for k in OUTSIDE_ORDER if k in found] + [k for k in found if k not in OUTSIDE_ORDER]
    parts = {"launch and exit": 0.0, **dict.fromkeys(names, 0.0)}
    for a in recorded:
        parts["launch and exit"] += max(0.0, a.job_wall_s - a.timed_wall_s - sum(a.outside.values()))
        for name, seconds in a.outside.items():
            parts[name] += seconds
    return {name: seconds / len(recorded) for name, seconds in parts.items()}


COMPARISON_COLUMNS = [
    "variant",
    "backend",
    "launcher",
    "controller",
    "scaling",
    "nproc",
    "world_size",
    "batch_size",
    "global_batch",
    "oversubscribed",
    "repeat",
    "run_id",
    "status",
    "returncode",
    "command",
    "samples_per_s",
    "step_p50_s",
    "step_p90_s",
    "step_p99_s",
    "final_train_loss",
    "final_val_loss",
    "job_wall_s",
    "timed_wall_s",
    "val_strategy",
    "eval_only",
    "val_s",
    "val_samples_per_s",
    "val_samples",
    "val_duplicates",
    "final_val_exact_loss",
    "step_config",
]


def comparison_frame(root: Path, attempts: list[Attempt], jobs: list[Job], scaling: str) -> tuple[Any, Any]:
    """One row per attempt (failures included): the run's statistics, what it was asked to be, and what its
    run.json says it was (launcher, controller). Also the loaded runs, or None when no run directory exists."""
    import pandas as pd

    from benchmarks.analysis import load, rundir, tables

    found = load.find_run_dirs(root)
    rs = load.load_runs(root, include_failed=True) if found else None
    per_run = tables.per_run_stats(rs) if rs is not None else pd.DataFrame(columns=["run_key"])
    by_run = {str(Path(row["run_key"]).resolve()): row for row in per_run.to_dict("records")}
    planned = {j.variant.name: j.variant for j in jobs}
    rows = []
    for a in attempts:
        run_dir = root / a.run_id
        stats = by_run.get(str(run_dir.resolve()), {})
        wall = stats.get("timed_wall_s")
        a.timed_wall_s = float(wall) if isinstance(wall, (int, float)) else float("nan")  # for the time line
        a.outside = dict((rundir.read_or_none(run_dir) or {}).get("outside") or {})
        ok = (a.returncode == 0 or a.signalled) and stats.get("status") == "completed"
        v = planned[a.variant]
        # A run that died before writing run.json has no launcher of its own: the planned one stands in.
        launch = {
            "launcher": stats.get("launcher") or v.launcher,
            "controller": stats.get("controller") or v.controller,
        }
        # Every statistic the analysis has (the table may use more than the CSV keeps), then the attempt's facts.
        rows.append(
            {
                "run_key": str(run_dir),
                **stats,
                **dataclasses.asdict(a),
                **launch,
                "scaling": scaling,
                "command": " ".join(a.command),
                "status": "completed" if ok else "interrupted" if a.interrupted else "failed",
            }
        )
    return pd.DataFrame(rows), rs


def write_comparison(
    root: Path, attempts: list[Attempt], jobs: list[Job], scaling: str = WEAK, plan: dict[str, Any] | None = None
) -> str:
    """comparison.csv (one row per run, failures included) and the terminal tables (a two-stage compare's
    intervals from its `plan`)."""
    import pandas as pd

    from benchmarks.analysis import evaluation, load, tables, terminal

    full, rs = comparison_frame(root, attempts, jobs, scaling)
    files.write_csv(full.reindex(columns=COMPARISON_COLUMNS), root / "comparison.csv", index=False)
    labelled = full.assign(backend=tables.backend_labels(full))  # a backend under two launchers: a row each
    strategies = list(labelled.get("val_strategy", pd.Series("exact", index=labelled.index)))
    # A validation strategy is part of what a row compares, as in the report: never pooled with another's.
    labelled = labelled.assign(
        backend=[load.with_strategy(b, s) for b, s in zip(labelled.backend, strategies, strict=True)],
        variant=[load.with_strategy(v, s) for v, s in zip(labelled.variant, strategies, strict=True)],
    )
    only = evaluation.eval_only(labelled)
    parts = []
    if not only.all():  # --eval-only trains nothing: its rows are validation's alone
        agreement = tables.loss_agreement(rs) if rs is not None else float("nan")  # nan: no run to compare
        training = labelled[~only]
        parts.append(terminal.format_table(tables.backend_table(training, plan), agreement))
        scale = tables.scaling(training)
        if len(scale):
            parts.append(terminal.format_scaling(scale))
    validated = evaluation.validation_table(labelled)
    if len(validated):
        parts.append(evaluation.format_validation(validated))
    return "\n\n".join(parts) if parts else "no run completed"
