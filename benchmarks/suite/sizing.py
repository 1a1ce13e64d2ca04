"""Runs sized to the workload: before the pilot, compare times a short probe run of its first variant and gives
every run as many timed steps as fill a timed window of `--window` seconds (and as many epochs over the data as
that takes), so a small model's runs are not mostly launch and a large one's not needlessly long. A user's own
--epochs or --steps-per-epoch win; `--window 0` keeps the given or preset length.

Imported by the parser of every `distbench` process: no torch, no analysis stack at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import files
from benchmarks.errors import InputError
from benchmarks.suite.variants import Job

DEFAULT_WINDOW_S = 12.0
"""Each run's timed window when compare sizes the runs. A launch costs 5-7 s outside its window on a CPU machine
(the launcher ~1.5 s, each rank's interpreter, torch and dynamo imports ~2.3 s, joining, warm-up, exit), and
little of it can be cut (docs/benchmarks.md): a window about twice that keeps two thirds of the wall time timed."""
PROBE_TIMED_STEPS = 10
MIN_TIMED_STEPS = 20
MAX_TIMED_STEPS = 20000
SIZING_JSON = "sizing.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        help="size every run to this timed window in seconds, from a short probe run of the first variant made "
        f"before the pilot (at least {MIN_TIMED_STEPS} timed steps); applies when neither --epochs nor "
        f"--steps-per-epoch is given; 0 keeps the preset's or run's length (default: {DEFAULT_WINDOW_S:g})",
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether compare sizes its runs: a window asked for, and no length given by the user."""
    if args.window < 0 or args.window != args.window:
        raise InputError(f"--window is seconds of timed window per run, 0 to keep the length; got {args.window}")
    given = args.epochs is not None or args.steps_per_epoch is not None
    return args.window > 0 and not given and not getattr(args, "eval_only", False)


def probe(job: Job, data_steps: int) -> Job:
    """The probe: the first job with its warm-up and PROBE_TIMED_STEPS timed steps, no compute baseline."""
    total = job.cfg.warmup_steps + PROBE_TIMED_STEPS
    epochs = max(1, math.ceil(total / data_steps))
    cfg = dataclasses.replace(
        job.cfg, epochs=epochs, steps_per_epoch=None if epochs > 1 else total, compute_baseline_steps=0
    )
    return dataclasses.replace(job, cfg=cfg, run_prefix="probe")


def length(step_s: float, window_s: float, warmup_steps: int, data_steps: int) -> dict[str, int | None]:
    """Timed steps that fill `window_s` at `step_s` a step, and the epochs and steps per epoch that give them:
    as few epochs as the data allows, each cut to the same length (so the count said is the count run)."""
    timed = min(MAX_TIMED_STEPS, max(MIN_TIMED_STEPS, math.ceil(window_s / step_s)))
    epochs = max(1, math.ceil((warmup_steps + timed) / data_steps))
    per_epoch = math.ceil((warmup_steps + timed) / epochs)
    return {
        "timed_steps": epochs * per_epoch - warmup_steps,
        "epochs": epochs,
        "steps_per_epoch": per_epoch if per_epoch < data_steps or epochs == 1 else None,
    }


def size(
    jobs: list[Job],
    window_s: float,
    root: Path,
    run_probe: Callable[[Job], Path | None],
    data_steps: Callable[[Job], int],
) -> tuple[list[Job], str]:
    """The jobs with every run's length set from a probe of the first (`run_probe` runs it and returns its run
    directory, None if it failed), and the start-up line that says so; sizing.json records it. The probe's
    directory is removed once read: it is no run of the comparison."""
    first = jobs[0]
    steps_of = {id(job): data_steps(job) for job in jobs}
    run_dir = run_probe(probe(first, steps_of[id(first)]))
    step_s = _step_s(run_dir) if run_dir is not None else None
    if run_dir is not None:
        shutil.rmtree(run_dir, ignore_errors=True)
    if step_s is None:
        return jobs, f"sizing: the probe run of {first.variant.name} did not complete; every run keeps its length"
    sized, chosen = [], {}
    for job in jobs:
        chosen = length(step_s, window_s, job.cfg.warmup_steps, steps_of[id(job)])
        cfg = dataclasses.replace(job.cfg, epochs=chosen["epochs"], steps_per_epoch=chosen["steps_per_epoch"])
        sized.append(dataclasses.replace(job, cfg=cfg))
    first_length = length(step_s, window_s, first.cfg.warmup_steps, steps_of[id(first)])
    record: dict[str, Any] = {
        "variant": first.variant.name,
        "step_s": step_s,
        "window_s": window_s,
        **first_length,
        "data_steps": steps_of[id(first)],
    }
    files.write_text(root / SIZING_JSON, json.dumps(record, indent=2) + "\n")
    epochs = first_length["epochs"]
    per, data = first_length["steps_per_epoch"] or steps_of[id(first)], steps_of[id(first)]
    over = f"{epochs} epochs of {per} steps over its data ({data} an epoch)" if epochs > 1 else "one epoch"
    line = (
        f"sized to the workload: a step of {first.variant.name} takes {step_s * 1e3:.1f} ms (a probe run), so "
        f"{first_length['timed_steps']} timed steps a run for a {window_s:g} s window, {over}; every variant the "
        "same (--window to change it, --epochs or --steps-per-epoch to choose yourself)"
    )
    return sized, line


def _step_s(run_dir: Path) -> float | None:
    """The probe's typical step (summary.csv step_p50_s: the slowest rank's), None if it has none."""
    import csv

    try:
        with open(run_dir / "summary.csv", newline="") as handle:
            row = next(csv.DictReader(handle))
        value = float(row["step_p50_s"])
    except (OSError, StopIteration, KeyError, ValueError):
        return None
    return value if value > 0 else None
