"""The decision: per setup, what to pick, how sure that is, at what memory cost, or what would settle it.

Per setup (workload, global batch, world size) the variant of highest geometric-mean throughput leads;
every other variant gets its throughput ratio to it with a 95 % interval (`intervals.ratio_interval`: Welch
for a fixed design, the two-stage interval after a planned second stage) and a status: `equivalent` (the
whole interval lies within the margin, [1/(1+M), 1+M]), `resolved` (it excludes 1), or `unresolved`
(neither, or too few runs for an interval). The leader is a pick only when no ratio is unresolved; otherwise
it is "ahead on these runs". A resolved ratio names one reason from the step breakdown, only when that
part's own difference is resolved; an unresolved one estimates the runs of each that would resolve a true
difference of the size observed with 80 % power. In a scaling study the decision is made at the largest
world size that is not oversubscribed; an oversubscribed setup never decides.

decision.json (`SCHEMA_VERSION`) holds the same as the words; docs/results.md documents its fields.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import files
from benchmarks.analysis import intervals, stats
from benchmarks.analysis.tables import SETUP, SHORT_RUN_FIX, oversubscribed_words, with_setup

SCHEMA_VERSION = 2
DECISION_JSON = "decision.json"
PLAN_JSON = "plan.json"
DEFAULT_MARGIN = 0.05
"""The smallest relative throughput difference worth a choice (`--margin`)."""
MEMORY = {
    "peak_rss_mb": "peak RSS",
    "training_rss_mb": "of it training's own",
    "cuda_max_allocated_mb": "CUDA allocated",
    "cuda_max_reserved_mb": "CUDA reserved",
    "state_mb": "training state held",
}
"""The peak-memory measures per rank the decision shows (summary.csv's `<measure>_min`/`_max` over ranks)."""
WELCH = "Welch on log throughput"
TWO_STAGE = (
    "two-stage: all runs' means, each variant's spread from its own pilot runs (Behrens–Fisher); Welch "
    "over all runs for a pair whose plans were both cut short"
)
REASONS = {"compute_ms": "compute", "exposed_comm_ms": "exposed communication and overhead"}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float, np.number)) and np.isfinite(value) else None


def _memory(rows: pd.DataFrame) -> dict[str, list[float]]:
    """Each measure's [smallest rank, largest rank] in MB, means over the variant's runs, where measured."""
    out = {}
    for measure in MEMORY:
        low, high = rows.get(f"{measure}_min"), rows.get(f"{measure}_max")
        if low is not None and high is not None and low.notna().any() and high.notna().any():
            out[measure] = [round(float(low.mean()), 1), round(float(high.mean()), 1)]
    return out


BUDGET_MEASURES = ("cuda_max_allocated_mb", "peak_rss_mb")
"""What --memory-limit-mb is held against, the first measured: CUDA's allocated peak on GPU, else peak RSS."""
LEAN_MEASURES = ("cuda_max_allocated_mb", "state_mb", "training_rss_mb", "peak_rss_mb")
"""The training memory per rank that names the leanest variant, the first measured: on CPU the training state a
rank holds (parameters, gradients, optimizer state: FSDP2's shards), which RSS hides under everything resident."""
LEAN_BY = 0.1
"""The leanest variant is named only when the pick needs at least this much more memory (10 %)."""


def _largest(memory: dict[str, list[float]], measures: tuple[str, ...]) -> tuple[str, float] | None:
    """The first of `measures` that was measured, with its largest rank's MB."""
    return next(((m, memory[m][1]) for m in measures if m in memory), None)


def _over_budget(memory: dict[str, dict[str, list[float]]], limit: float | None) -> list[dict[str, Any]]:
    """The variants whose largest rank's peak is above `limit` MB: never picked."""
    found = []
    for variant, mine in memory.items():
        peak = _largest(mine, BUDGET_MEASURES) if limit else None
        if peak and peak[1] > limit:
            found.append({"variant": variant, "measure": peak[0], "peak_mb": peak[1], "limit_mb": limit})
    return found


def _leanest(entry: dict[str, Any], memory: dict[str, dict[str, list[float]]]) -> dict[str, Any] | None:
    """The variant of least training memory per rank when it is not the pick and the pick needs LEAN_BY more: its
    memory, its share of the pick's, and its throughput ratio to the pick with the decision's interval."""
    pick = entry["recommended"]["variant"]
    sized = {a["variant"]: a for a in entry["alternatives"]}
    mine = {v: _largest(memory[v], LEAN_MEASURES) for v in [pick, *sized]}
    if mine[pick] is None:
        return None
    same = {v: m[1] for v, m in mine.items() if m is not None and m[0] == mine[pick][0]}
    lean = min(same, key=same.__getitem__)
    if lean == pick or same[lean] * (1 + LEAN_BY) > same[pick]:  # a few MB either way is not a trade
        return None
    alt = sized[lean]
    return {
        "variant": lean,
        "measure": mine[pick][0],
        "mb": same[lean],
        "pick_mb": same[pick],
        "share": same[lean] / same[pick],
        "ratio": alt["ratio"],
        "ci": alt["ci"],
    }


def _reason(breakdown: pd.DataFrame | None, alternative: str, pick: str, setup: dict[str, Any]) -> dict[str, Any]:
    """The resolved part of the step breakdown that differs most between `alternative` and `pick`."""
    if breakdown is None or not len(breakdown):
        return {"text": "no step breakdown (compute baseline) to name a cause", "resolved": False}
    mine = breakdown
    for key, value in setup.items():
        mine = mine[mine[key] == value]
    found = []
    for part, name in REASONS.items():
        diff, lo, hi = stats.diff_ci(mine[mine.variant == alternative][part], mine[mine.variant == pick][part])
        if stats.excludes_zero(lo, hi):
            found.append((abs(diff), part, name, diff, lo, hi))
    if not found:
        runs = int(min((mine.variant == alternative).sum(), (mine.variant == pick).sum()))
        return {"text": f"no part of the step breakdown is resolved from {runs} runs", "resolved": False}
    _, part, name, diff, lo, hi = max(found)
    more = "longer" if diff > 0 else "shorter"
    return {
        "part": part,
        "difference_ms": diff,
        "ci": [lo, hi],
        "resolved": True,
        "text": f"{alternative}'s {name} is {abs(diff):.1f} ms {more} per step ({lo:+.1f} to {hi:+.1f} ms)",
    }


def status_of(lo: float, hi: float, margin: float) -> str:
    """`equivalent` when the whole interval lies within [1/(1+M), 1+M], else `resolved` when it excludes 1."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "unresolved"
    if lo >= 1 / (1 + margin) and hi <= 1 + margin:
        return "equivalent"
    return "resolved" if hi < 1 or lo > 1 else "unresolved"


def _command(base: str, setup: dict[str, Any], variants: list[str], repeats: int) -> str:
    """The command that reruns the comparison with `repeats` of each: the original line (every option that shaped
    the decision kept) with its --repeats replaced."""
    if base:
        return re.sub(r"\s--repeats[ =]\d+", "", base) + f" --repeats {repeats}"
    return (
        f"distbench compare --workload {setup['workload']} --backends {','.join(variants)} "
        f"--nproc {setup['world_size']} --repeats {repeats}"
    )


def _decide_setup(
    setup: dict[str, Any],
    group: pd.DataFrame,
    breakdown: pd.DataFrame | None,
    margin: float,
    plan: dict[str, Any],
    knobs: dict[str, dict[str, Any]],
    command: str,
    efficiency: dict[str, float],
    memory_limit_mb: float | None = None,
) -> dict[str, Any]:
    ok = (
        group[group.status == "completed"]
        .assign(repeat=lambda f: f.run_id.map(intervals.repeat_of))
        .sort_values("repeat")
    )
    by_variant = {v: rows for v, rows in ok.groupby("variant", sort=False)}
    means = {v: stats.log_ci(rows.samples_per_s)[0] for v, rows in by_variant.items()}
    means = {v: m for v, m in means.items() if np.isfinite(m)}
    entry: dict[str, Any] = {**{k: _plain(v) for k, v in setup.items()}, "decides": True, "alternatives": []}
    short = ok[ok["warning"].fillna("").astype(str) != ""] if "warning" in ok else ok.iloc[:0]
    entry["short_runs"] = (
        f"{len(short)} of {len(ok)} runs short ({short['warning'].iloc[0]}): {SHORT_RUN_FIX}" if len(short) else None
    )
    if not means:
        return {**entry, "status": "no-data", "recommended": None, "note": "no completed run"}
    memory = {v: _memory(by_variant[v]) for v in means}
    over = _over_budget(memory, memory_limit_mb)
    entry["over_budget"] = over
    means = {v: m for v, m in means.items() if v not in {o["variant"] for o in over}}
    if not means:
        note = f"every variant's peak memory per rank is above --memory-limit-mb {memory_limit_mb:g}"
        return {**entry, "status": "over-budget", "recommended": None, "note": note}
    pick = max(means, key=means.__getitem__)
    mean, lo, hi = stats.log_ci(by_variant[pick].samples_per_s)
    entry["recommended"] = {
        "variant": pick,
        "backend": str(by_variant[pick].backend.iloc[0]).split(" (")[0],
        "knobs": knobs.get(pick, {}),
        "samples_per_s": mean,
        "ci": [lo, hi],
        "runs": len(by_variant[pick]),
        "memory_mb": _memory(by_variant[pick]),
        "efficiency": efficiency.get(pick),
    }
    for variant, rows in by_variant.items():
        if variant == pick or variant not in means:
            continue
        ratio, rlo, rhi = intervals.interval_of(rows, by_variant[pick], plan)
        status = status_of(rlo, rhi, margin)
        alt: dict[str, Any] = {
            "variant": variant,
            "ratio": ratio,
            "ci": [rlo, rhi],
            "half_width": stats.relative_half_width(ratio, rlo, rhi),
            "status": status,
            "runs": len(rows),
            "memory_mb": _memory(rows),
            "efficiency": efficiency.get(variant),
        }
        if status == "resolved":
            alt["reason"] = _reason(breakdown, variant, pick, setup)
        elif status == "unresolved":
            floors = (intervals.floor_of(rows), intervals.floor_of(by_variant[pick]))
            needed = intervals.runs_to_resolve(rows.samples_per_s, by_variant[pick].samples_per_s, floors)
            alt["repeats_to_resolve_estimate"] = needed
            if needed:
                alt["command"] = _command(command, setup, list(by_variant), needed)
        entry["alternatives"].append(alt)
    entry["leanest"] = _leanest(entry, memory)
    statuses = {a["status"] for a in entry["alternatives"]}
    entry["status"] = (
        "unresolved"
        if "unresolved" in statuses
        else "equivalent"
        if statuses == {"equivalent"}
        else "resolved"
        if statuses
        else "one-variant"
    )
    return entry


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars as Python numbers."""
    return value.item() if isinstance(value, np.generic) else value


def read_plan(paths: list[str | Path]) -> dict[str, Any] | None:
    """The plan.json of a two-stage compare among `paths` (one directory given), else None."""
    if len(paths) != 1 or not (Path(paths[0]) / PLAN_JSON).is_file():
        return None
    return json.loads((Path(paths[0]) / PLAN_JSON).read_text())


def _training_runs(per_run: pd.DataFrame) -> pd.DataFrame:
    """The runs a training decision is made on: a validation strategy changes no training step, so the runs of
    one variant under several strategies are the same training; the default (exact) ones, never eval-only runs."""
    runs = with_setup(per_run).assign(variant=per_run["variant"].fillna(per_run["backend"]))
    if "eval_only" in runs:
        runs = runs[~runs["eval_only"].fillna(False).astype(bool)]
    if "val_strategy" in runs and (runs["val_strategy"].fillna("exact") == "exact").any():
        runs = runs[runs["val_strategy"].fillna("exact") == "exact"]
    over = runs.get("oversubscribed", pd.Series(False, index=runs.index)).fillna(False).astype(bool)
    return runs.assign(oversubscribed=over)


def _setups(runs: pd.DataFrame) -> list[tuple[dict[str, Any], pd.DataFrame, bool]]:
    """Each setup with its runs and whether it decides: an oversubscribed setup never does (it is listed to say
    so), and a scaling study decides at its largest world size (the others are left out)."""
    largest = runs[~runs.oversubscribed].groupby("workload")["world_size"].max()
    found = []
    for keys, group in runs.groupby(list(SETUP), sort=False):
        setup = dict(zip(SETUP, keys, strict=True))
        if group.oversubscribed.any():
            found.append((setup, group, False))
        elif setup["world_size"] == largest.get(setup["workload"]):
            found.append((setup, group, True))
    return found


def planned_repeats(per_run: pd.DataFrame, precision: float) -> dict[str, int]:
    """Runs of each arm (a run id less its repeat: a variant in compare, a variant at one setting in tune's
    final stage) that every ratio of the setups that decide needs to reach `precision`, from the pilot's
    completed runs alone (`intervals.planned_runs`: each arm from its own spread)."""
    if not len(per_run) or "samples_per_s" not in per_run:
        return {}
    needs: dict[str, int] = {}
    for _, group, decides in _setups(_training_runs(per_run)):
        ok = group[group.status == "completed"]
        if not decides or not len(ok):
            continue
        arms = {a: rows for a, rows in ok.groupby(ok.run_id.astype(str).map(intervals.arm_of), sort=False)}
        planned = intervals.planned_runs(
            [r.samples_per_s for r in arms.values()], precision, [intervals.floor_of(r) for r in arms.values()]
        )
        needs.update(zip(arms, planned, strict=True))
    return needs


def decide(
    per_run: pd.DataFrame,
    breakdown: pd.DataFrame | None = None,
    scale: pd.DataFrame | None = None,
    plan: dict[str, Any] | None = None,
    knobs: dict[str, dict[str, Any]] | None = None,
    command: str = "",
    memory_limit_mb: float | None = None,
) -> dict[str, Any]:
    """decision.json's content from `tables.per_run_stats` rows, `why.per_run`'s breakdown per run and the
    scaling table. `plan`: {"margin": M} for a fixed design, or a two-stage compare's plan.json (its
    intervals are then two-stage, from the pilot's spreads). `knobs`: tune's kept knobs per variant;
    `command`: the command line to rerun with more repeats; `memory_limit_mb`: no variant whose peak memory per
    rank (CUDA allocated on GPU, RSS on CPU) is above it is picked."""
    plan = plan or {}
    margin = plan.get("margin") or DEFAULT_MARGIN
    pilot = plan.get("pilot")
    decision: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "margin": margin,
        "precision": plan.get("precision"),
        "confidence": 0.95,
        "interval": TWO_STAGE if pilot else WELCH,
        "memory_limit_mb": memory_limit_mb,
        "plan": plan or None,
        "setups": [],
    }
    if not len(per_run) or "samples_per_s" not in per_run:
        return decision
    runs = _training_runs(per_run)
    for setup, group, decides in _setups(runs):
        if not decides:
            cpus = group["cpus"].dropna() if "cpus" in group else pd.Series([], dtype=float)
            decision["setups"].append(
                {
                    **{k: _plain(v) for k, v in setup.items()},
                    "decides": False,
                    "status": "oversubscribed",
                    "note": oversubscribed_words(int(setup["world_size"]), cpus),
                }
            )
            continue
        efficiency: dict[str, float] = {}
        if scale is not None and len(scale):
            here = scale[(scale.workload == setup["workload"]) & (scale.world_size == setup["world_size"])]
            if "step_config" in here:
                here = here[here.step_config == setup["step_config"]]
            efficiency = {str(r.variant): _number(r.efficiency) for r in here.itertuples()}
        decision["setups"].append(
            _decide_setup(setup, group, breakdown, margin, plan, knobs or {}, command, efficiency, memory_limit_mb)
        )
    decision["by_step"] = by_step(decision["setups"])
    return decision


def by_step(setups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A study over step configurations (compare --amp off,bf16 --compile off,on): per workload, global batch and
    world size decided under more than one step, who leads under each and whether the pick changes with the step.
    A pick changes only between two steps that each resolved theirs; a leader that is not a pick cannot."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for setup in setups:
        if not setup.get("decides") or setup.get("recommended") is None:
            continue
        key = (setup["workload"], setup["global_batch"], setup["world_size"])
        entry = found.setdefault(key, {"workload": key[0], "global_batch": key[1], "world_size": key[2], "steps": []})
        resolved = setup["status"] == "resolved"
        entry["steps"].append(
            {"step_config": setup.get("step_config"), "leader": setup["recommended"]["variant"], "pick": resolved}
        )
    studies = [e for e in found.values() if len(e["steps"]) > 1]
    for entry in studies:
        picks = {s["leader"] for s in entry["steps"] if s["pick"]}
        leaders = {s["leader"] for s in entry["steps"]}
        entry["pick_changes"] = len(picks) > 1
        entry["same_leader"] = len(leaders) == 1
    return studies


def write(out: Path, decision: dict[str, Any]) -> Path:
    """decision.json in `out` (NaN written as null)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / DECISION_JSON

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, (float, np.floating)):
            return float(value) if np.isfinite(value) else None
        return _plain(value)

    return files.write_text(path, json.dumps(clean(decision), indent=2) + "\n")
