"""`compare --precision P --max-repeats N` (and tune's final stage): a two-stage compare.

Imported by the parser of every `distbench` process: the analysis stack is imported only when used.

The pilot (`--repeats`, at least 3, interleaved as always) measures the run-to-run spread; from that
spread alone — never from a ratio, so the verdict cannot steer it — `analysis.decision.planned_repeats`
says how many runs of each variant every ratio's 95 % interval needs to be within ±P of it; the missing
rounds then run, interleaved, and the intervals use every run (the means) and the pilot's spread
(Stein's procedure). Nothing is looked at between the two stages. `--max-repeats` caps the plan; the
output then says the precision reached and what the target needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.errors import InputError

DEFAULT_MAX_REPEATS = 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--precision",
        type=float,
        default=None,
        help="run a two-stage compare: after the --repeats pilot (at least 3), as many more interleaved rounds as "
        "the pilot's spread says every throughput ratio's 95%% interval needs to be within ±P of it, e.g. 0.05; "
        "also the half-width below which a ratio counts as equivalent to 1 (default: no second stage; 0.05 for "
        "equivalence)",
    )
    parser.add_argument(
        "--max-repeats",
        type=int,
        default=DEFAULT_MAX_REPEATS,
        help=f"--precision: at most this many runs of each variant in all (default: {DEFAULT_MAX_REPEATS})",
    )


def check(args: argparse.Namespace) -> None:
    """Bad input before anything starts."""
    if args.precision is None:
        return
    from benchmarks.analysis import stats  # scipy: only when --precision is given, never for the parser

    if not 0 < args.precision < 1:
        raise InputError(f"--precision is a relative half-width between 0 and 1, e.g. 0.05; got {args.precision}")
    if args.repeats < stats.MIN_RUNS:
        raise InputError(f"--precision needs a pilot of at least {stats.MIN_RUNS} --repeats, got {args.repeats}")
    if args.max_repeats < args.repeats:
        raise InputError(f"--max-repeats {args.max_repeats} is below the pilot's --repeats {args.repeats}")


def second_stage(
    root: Path,
    pilot: int,
    precision: float | None,
    max_repeats: int,
    run_rounds: Callable[[int, int], list[Any]],
    interrupted: Callable[[], bool],
) -> tuple[list[Any], dict[str, Any] | None]:
    """After the pilot's rounds: plan from their spread, run rounds pilot..planned-1 with `run_rounds(first,
    stop)`, write plan.json; the attempts of the second stage and the plan (None without --precision)."""
    if precision is None or interrupted():
        return [], None
    from benchmarks.analysis import decision, load, tables

    per_run = tables.per_run_stats(load.load_runs(root))
    needed = decision.planned_repeats(per_run, precision)
    ran = max(pilot, min(needed, max_repeats))
    capped = needed > max_repeats
    cap = f", capped by --max-repeats {max_repeats}" if capped else ""
    print(f"[compare] --precision {precision:g}: the pilot's spread asks for {needed} runs of each variant{cap}; "
          f"running {ran - pilot} more interleaved round(s)", file=sys.stderr, flush=True)  # fmt: skip
    attempts = run_rounds(pilot, ran) if ran > pilot else []
    plan = {"precision": precision, "pilot": pilot, "needed": needed, "max_repeats": max_repeats,
            "ran": ran, "capped": capped}  # fmt: skip
    if interrupted():
        plan["interrupted"] = True
    (root / decision.PLAN_JSON).write_text(json.dumps(plan, indent=2) + "\n")
    return attempts, plan
