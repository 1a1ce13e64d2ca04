"""How many runs a comparison makes: a fixed design (`--repeats N`) or a two-stage one (a pilot, then as many
runs of each variant as the pilot's spreads ask for), and the decision's margin (`--margin`).

Imported by the parser of every `distbench` process: the analysis stack is imported only when used.

The pilot (`--repeats`, at least 3, interleaved as always) measures each variant's run-to-run spread; from
those spreads alone — never from a ratio, so the verdict cannot steer it — `analysis.decision.planned_repeats`
says how many runs of each variant every ratio's 95 % interval needs to be within ±P of it (a noisy variant
gets more runs than a quiet one); the missing rounds then run, interleaved, and the intervals use every run's
mean and each variant's pilot spread (docs/fairness.md). Nothing is looked at between the two stages.

The default compare (no --repeats, no --precision) is two-stage toward a decision at the margin M: its target
half-width is √(1+M) − 1 (about M/2), the widest an interval can be and still always end `resolved` or
`equivalent`, within a budget (at most DEFAULT_BUDGET_RUNS runs of each and DEFAULT_BUDGET_S seconds of
second stage) that never depends on a ratio seen.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import files
from benchmarks.errors import InputError

PILOT = 3
DEFAULT_MARGIN = 0.05
DEFAULT_MAX_REPEATS = 30
DEFAULT_BUDGET_RUNS = 8
DEFAULT_BUDGET_S = 240.0
"""The default compare's budget: on the default workload a round (a run of each of its three variants) takes
about 45 s on 2 cores, so the budget buys up to 5 planned rounds, about 4 minutes (docs/benchmarks.md)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="the smallest relative throughput difference worth a choice: a ratio whose whole 95%% interval lies "
        f"within [1/(1+M), 1+M] is 'equivalent' (default: {DEFAULT_MARGIN})",
    )
    parser.add_argument(
        "--memory-limit-mb",
        type=float,
        default=None,
        help="a memory budget per rank (CUDA allocated on GPU, peak RSS on CPU): a variant whose peak is above it is "
        "never picked, and the decision says so (default: none; the decision names the leanest variant's trade)",
    )
    parser.add_argument(
        "--precision",
        type=float,
        default=None,
        help="run a two-stage compare: after the --repeats pilot (at least 3), as many more interleaved runs of each "
        "variant as its pilot spread says every throughput ratio's 95%% interval needs to be within ±P of it, "
        "e.g. 0.05 (default: compare: √(1+margin) − 1 within a budget unless --repeats is given; tune: none)",
    )
    parser.add_argument(
        "--max-repeats",
        type=int,
        default=None,
        help=f"two-stage: at most this many runs of each variant in all (default: {DEFAULT_MAX_REPEATS} with "
        f"--precision; {DEFAULT_BUDGET_RUNS} for compare's default design)",
    )


def target_for(margin: float) -> float:
    """The half-width that always decides at `margin`: an interval at most this wide (on the log scale, half the
    margin's) either excludes 1 or lies within [1/(1+M), 1+M]."""
    return math.sqrt(1 + margin) - 1


def check(args: argparse.Namespace, default_two_stage: bool = False) -> None:
    """Bad input before anything starts; fills in the design: args.repeats (the pilot, or the fixed design's
    repeats), args.precision (None: no second stage), args.max_repeats and args.budget_s (seconds, or None)."""
    if args.memory_limit_mb is not None and args.memory_limit_mb <= 0:
        raise InputError(f"--memory-limit-mb is a positive number of MB per rank; got {args.memory_limit_mb:g}")
    if not 0 < args.margin < 1:
        raise InputError(f"--margin is a relative difference between 0 and 1, e.g. 0.05; got {args.margin}")
    default = default_two_stage and args.repeats is None and args.precision is None
    args.budget_s = DEFAULT_BUDGET_S if default else None
    if default:
        args.precision = target_for(args.margin)
    if args.repeats is None:
        args.repeats = PILOT
    if args.max_repeats is None:
        args.max_repeats = DEFAULT_BUDGET_RUNS if default else DEFAULT_MAX_REPEATS
    if args.precision is None:
        return
    if not 0 < args.precision < 1:
        raise InputError(f"--precision is a relative half-width between 0 and 1, e.g. 0.05; got {args.precision}")
    if args.repeats < PILOT:
        raise InputError(f"--precision needs a pilot of at least {PILOT} --repeats, got {args.repeats}")
    if args.max_repeats < args.repeats:
        raise InputError(f"--max-repeats {args.max_repeats} is below the pilot's --repeats {args.repeats}")


def design_words(args: argparse.Namespace) -> str:
    """The start-up line's words for the design checked by `check`."""
    if args.precision is None:
        return f"{args.repeats} repeat{'s' * (args.repeats != 1)} interleaved"
    budget = f" and {args.budget_s:.0f} s of second stage" if args.budget_s else ""
    return (
        f"a pilot of {args.repeats} interleaved, then up to {args.max_repeats} runs of each{budget} toward "
        f"±{args.precision:.1%} (margin ±{args.margin:.0%})"
    )


RunRounds = Callable[[int, int, set[str]], list[Any]]


def reachable_margin(precision: float, needed: int, runs: int) -> float:
    """The margin that `runs` of each can decide where `needed` were asked for ±`precision`: a planned run count
    goes as 1 / ln²(1 + P) (intervals.planned_runs), so `runs` reach ln(1 + P') = ln(1 + P)·√(needed / runs),
    and a half-width P' decides the margin M' with √(1 + M') − 1 = P' (target_for)."""
    reached = math.expm1(math.log1p(precision) * math.sqrt(needed / max(runs, 1)))
    return (1 + reached) ** 2 - 1


def advice(args: argparse.Namespace, needed: dict[str, int], round_s: float | None) -> str | None:
    """When the budget cannot reach the plan: the one plan that would, in numbers (None when it can)."""
    most = max(needed.values(), default=0)
    runs = args.max_repeats
    if args.budget_s and round_s:
        runs = min(runs, args.repeats + int(args.budget_s // round_s))
    if most <= runs:
        return None
    hours = f", about {most * round_s / 3600:.1f} h" if round_s else ""
    margin = reachable_margin(args.precision, most, runs)
    return (
        f"this budget (about {runs} runs of each) cannot decide at ±{args.margin:.0%}: the pilot's spreads need "
        f"{most} runs of each{hours} (distbench compare … --repeats {args.repeats} --precision {args.precision:.3g} "
        f"--max-repeats {most}); with this budget only a margin of ±{margin:.0%} decides (--margin {margin:.2f}), "
        "or make each run longer (--window) to narrow its spread"
    )


def second_stage(
    root: Path,
    args: argparse.Namespace,
    run_rounds: RunRounds,
    interrupted: Callable[[], bool],
    round_s: float | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """After the pilot's rounds: plan from their spreads, say at once when the budget cannot reach the plan and
    what would (`advice`, repeated by the final lines), run round r (pilot..) of the arms that still need one
    with `run_rounds(r, r + 1, arms)` while the budget lasts, write plan.json; the attempts of the second stage
    and the plan ({"margin": M} alone for a fixed design). `round_s`: the pilot's seconds per round."""
    if args.precision is None:
        return [], {"margin": args.margin}
    if interrupted():
        return [], {"margin": args.margin, "precision": args.precision, "interrupted": True}
    from benchmarks.analysis import decision, load, tables

    needed = decision.planned_repeats(tables.per_run_stats(load.load_runs(root)), args.precision)
    target = {arm: min(n, args.max_repeats) for arm, n in needed.items()}
    rounds = max([args.repeats, *target.values()])
    asked = ", ".join(f"{arm} {n}" for arm, n in needed.items())
    said = advice(args, needed, round_s)
    print(
        f"[compare] toward ±{args.precision:.1%}: the pilot's spreads ask for {asked} runs; at most "
        f"{args.max_repeats} of each{f' and {args.budget_s:.0f} s' if args.budget_s else ''}"
        + (f"\n[compare] {said}; the budget still runs, for what it can settle" if said else ""),
        file=sys.stderr,
        flush=True,
    )
    attempts: list[Any] = []
    started, stopped = time.monotonic(), ""
    for r in range(args.repeats, rounds):
        if interrupted():
            break
        if args.budget_s and time.monotonic() - started > args.budget_s:
            stopped = f"the {args.budget_s:.0f} s budget ended the second stage after round {r}"
            break
        attempts += run_rounds(r, r + 1, {arm for arm, n in target.items() if n > r})
    reached = _rounds_run(args.repeats, attempts)
    ran = {arm: min(n, reached) for arm, n in target.items()}
    plan: dict[str, Any] = {
        "margin": args.margin,
        "precision": args.precision,
        "pilot": args.repeats,
        "needed": needed,
        "ran": ran,
        "max_repeats": args.max_repeats,
        "budget_s": args.budget_s,
        "capped": any(n > args.max_repeats for n in needed.values()) or bool(stopped),
        "advice": said,
    }
    if args.budget_s:
        plan["budget"] = stopped or (
            f"within the default budget (at most {args.max_repeats} runs of each and "
            f"{args.budget_s:.0f} s of second stage)"
        )
    if interrupted():
        plan["interrupted"] = True
    files.write_text(root / decision.PLAN_JSON, json.dumps(plan, indent=2) + "\n")
    return attempts, plan


def _rounds_run(pilot: int, attempts: list[Any]) -> int:
    """Rounds reached: the pilot's, or one past the last second-stage round that started."""
    return max([pilot, *(a.repeat + 1 for a in attempts)])
