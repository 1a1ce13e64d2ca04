"""The decision: per setup, what to pick, how sure that is, at what memory cost, or what would settle it.

Per setup (workload, global batch, world size) the recommended variant is the one of highest geometric-
mean throughput; every other variant gets its throughput ratio to it with a 95 % interval and a status:
`equivalent` (the interval lies within ±precision of 1), `resolved` (it lies wholly below 1), or
`unresolved` (neither, or too few runs for an interval). A resolved pick names one reason from the step
breakdown, only when that part's own difference is resolved; an unresolved one estimates the repeats that
would resolve a difference of the size observed. In a scaling study the decision is made at the largest
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

from benchmarks.analysis import stats
from benchmarks.analysis.tables import SETUP, oversubscribed_words

SCHEMA_VERSION = 1
DECISION_JSON = "decision.json"
PLAN_JSON = "plan.json"
DEFAULT_PRECISION = 0.05
MEMORY = {"peak_rss_mb": "peak RSS", "training_rss_mb": "of it training's own", "cuda_max_allocated_mb": "CUDA "
          "allocated", "cuda_max_reserved_mb": "CUDA reserved"}  # fmt: skip
"""The peak-memory measures per rank the decision shows (summary.csv's `<measure>_min`/`_max` over ranks)."""
REASONS = {"compute_ms": "compute", "exposed_comm_ms": "exposed communication and overhead"}


def _repeat(run_id: Any) -> int:
    match = re.search(r"-r(\d+)$", str(run_id))
    return int(match.group(1)) if match else 0


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


def _status(ratio: float, lo: float, hi: float, precision: float) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "unresolved"
    if lo >= 1 - precision and hi <= 1 + precision:
        return "equivalent"
    return "resolved" if hi < 1 or lo > 1 else "unresolved"


def _command(base: str, setup: dict[str, Any], variants: list[str], repeats: int) -> str:
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
    precision: float,
    pilot: int | None,
    knobs: dict[str, dict[str, Any]],
    command: str,
    efficiency: dict[str, float],
) -> dict[str, Any]:
    ok = group[group.status == "completed"].assign(repeat=lambda f: f.run_id.map(_repeat)).sort_values("repeat")
    by_variant = {v: rows for v, rows in ok.groupby("variant", sort=False)}
    means = {v: stats.log_ci(rows.samples_per_s)[0] for v, rows in by_variant.items()}
    means = {v: m for v, m in means.items() if np.isfinite(m)}
    entry: dict[str, Any] = {**{k: _plain(v) for k, v in setup.items()}, "decides": True, "alternatives": []}
    if not means:
        return {**entry, "status": "no-data", "recommended": None, "note": "no completed run"}
    pick = max(means, key=means.__getitem__)
    pilots = [rows.samples_per_s[rows.repeat < pilot] for rows in by_variant.values()] if pilot else None
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
        if variant == pick:
            continue
        a, b = rows.samples_per_s, by_variant[pick].samples_per_s
        ratio, rlo, rhi = stats.stein_ratio_ci(a, b, pilots) if pilots else stats.ratio_ci(a, b)
        status = _status(ratio, rlo, rhi, precision)
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
            needed = stats.runs_to_resolve(a, b)
            alt["repeats_to_resolve_estimate"] = needed
            if needed:
                alt["command"] = _command(command, setup, list(by_variant), needed)
        entry["alternatives"].append(alt)
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


def planned_repeats(per_run: pd.DataFrame, precision: float) -> int:
    """Runs per variant that every ratio of a setup needs to reach `precision`, from the pilot's completed
    runs (`stats.planned_runs` over each setup's variants; the largest setup's need)."""
    ok = per_run[per_run.status == "completed"] if len(per_run) else per_run
    # An arm is a run id less its repeat: a variant in compare, a variant at one setting in tune's final stage.
    ok = ok.assign(arm=ok.run_id.astype(str).str.replace(r"-r\d+$", "", regex=True))
    needs = [
        stats.planned_runs([rows.samples_per_s for _, rows in group.groupby("arm", sort=False)], precision)
        for _, group in ok.groupby(list(SETUP), sort=False)
    ]
    return max(needs, default=0)


def decide(
    per_run: pd.DataFrame,
    breakdown: pd.DataFrame | None = None,
    scale: pd.DataFrame | None = None,
    plan: dict[str, Any] | None = None,
    knobs: dict[str, dict[str, Any]] | None = None,
    command: str = "",
) -> dict[str, Any]:
    """decision.json's content from `tables.per_run_stats` rows, `why.per_run`'s breakdown per run and the
    scaling table. `plan`: {"precision": P} as given to compare, or a two-stage compare's plan.json (its
    intervals then take their spread from the pilot runs, `stats.stein_ratio_ci`). `knobs`: tune's kept
    knobs per variant; `command`: the command line to rerun with more repeats."""
    plan = plan or {}
    precision = plan.get("precision") or DEFAULT_PRECISION
    pilot = plan.get("pilot")
    decision: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "precision": precision,
        "confidence": 0.95,
        "interval": "two-stage (Stein): all runs' means, the pilot's spread" if pilot else "Welch on log throughput",
        "plan": plan or None,
        "setups": [],
    }
    if not len(per_run) or "samples_per_s" not in per_run:
        return decision
    runs = per_run.assign(variant=per_run["variant"].fillna(per_run["backend"]))
    # The training decision: a validation strategy changes no training step, so the runs of one variant under
    # several strategies are the same training; decide on the default (exact) ones, never on eval-only runs.
    if "eval_only" in runs:
        runs = runs[~runs["eval_only"].fillna(False).astype(bool)]
    if "val_strategy" in runs and (runs["val_strategy"].fillna("exact") == "exact").any():
        runs = runs[runs["val_strategy"].fillna("exact") == "exact"]
    over = runs.get("oversubscribed", pd.Series(False, index=runs.index)).fillna(False).astype(bool)
    runs = runs.assign(oversubscribed=over)
    largest = runs[~runs.oversubscribed].groupby("workload")["world_size"].max()
    for keys, group in runs.groupby(list(SETUP), sort=False):
        setup = dict(zip(SETUP, keys, strict=True))
        efficiency: dict[str, float] = {}
        if scale is not None and len(scale):
            here = scale[(scale.workload == setup["workload"]) & (scale.world_size == setup["world_size"])]
            efficiency = {str(r.variant): _number(r.efficiency) for r in here.itertuples()}
        if group.oversubscribed.any():
            cpus = group["cpus"].dropna() if "cpus" in group else pd.Series([], dtype=float)
            decision["setups"].append({**{k: _plain(v) for k, v in setup.items()}, "decides": False,
                                       "status": "oversubscribed",
                                       "note": oversubscribed_words(int(setup["world_size"]), cpus)})  # fmt: skip
            continue
        if setup["world_size"] != largest.get(setup["workload"]):
            continue  # a scaling study decides at its largest world size; the others are in the scaling table
        decision["setups"].append(
            _decide_setup(setup, group, breakdown, precision, pilot, knobs or {}, command, efficiency)
        )
    return decision


def _ratio_words(alt: dict[str, Any]) -> str:
    lo, hi = alt["ci"]
    interval = f" ({lo:.2f}–{hi:.2f})" if np.isfinite(lo) else f" (no interval from {alt['runs']} runs)"
    return f"{alt['variant']} {alt['ratio']:.2f}×{interval}"


def _memory_words(memory: dict[str, list[float]]) -> str:
    def mb(low: float, high: float) -> str:
        return f"{low:.0f} MB" if round(low) == round(high) else f"{low:.0f}–{high:.0f} MB"

    return ", ".join(f"{MEMORY[k]} {mb(*v)}" for k, v in memory.items())


def paragraphs(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """Per setup: its status, the decision in one sentence, and a line per other variant worth a word."""
    found = []
    for setup in decision["setups"]:
        where = f"{setup['workload']}, global batch {setup['global_batch']}, {setup['world_size']} ranks"
        if not setup["decides"] or setup.get("recommended") is None:
            found.append({"status": "none", "head": f"{where}: no decision — {setup.get('note', setup['status'])}",
                          "details": []})  # fmt: skip
            continue
        rec, alts, details = setup["recommended"], setup["alternatives"], []
        knobs = " with " + " ".join(f"{k}={v}" for k, v in rec["knobs"].items()) if rec["knobs"] else ""
        eff = f", scaling efficiency {rec['efficiency']:.2f}" if rec.get("efficiency") is not None else ""
        mem = f"; {_memory_words(rec['memory_mb'])} per rank" if rec["memory_mb"] else ""
        head = f"{where}: pick {rec['variant']}{knobs}{eff}{mem}"
        by_status = {s: [a for a in alts if a["status"] == s] for s in ("resolved", "equivalent", "unresolved")}
        parts = []
        if by_status["resolved"]:
            parts.append("faster than " + ", ".join(_ratio_words(a) for a in by_status["resolved"]))
        if by_status["equivalent"]:
            within = f"equivalent within ±{decision['precision']:.0%} to "
            parts.append(within + ", ".join(_ratio_words(a) for a in by_status["equivalent"]))
        if by_status["unresolved"]:
            parts.append("not resolved against " + ", ".join(_ratio_words(a) for a in by_status["unresolved"]))
        head += " — " + "; ".join(parts) + " (throughput ratio to the pick, 95 % CI)" if parts else " (the only one)"
        for alt in alts:
            extra = []
            if alt.get("efficiency") is not None:
                extra.append(f"scaling efficiency {alt['efficiency']:.2f}")
            if alt["memory_mb"]:
                extra.append(f"{_memory_words(alt['memory_mb'])} per rank")
            tail = f"; {', '.join(extra)}" if extra else ""
            if alt["status"] == "resolved" and alt.get("reason"):
                details.append(f"why {alt['variant']} is slower: {alt['reason']['text']}{tail}")
            elif alt["status"] == "unresolved" and alt.get("repeats_to_resolve_estimate"):
                details.append(
                    f"to settle {alt['variant']}: about {alt['repeats_to_resolve_estimate']} runs of each would "
                    f"resolve a difference of {abs(1 - alt['ratio']):.1%} at the measured spread (an estimate): "
                    f"{alt['command']}{tail}"
                )
            elif alt["status"] == "unresolved":
                details.append(f"to settle {alt['variant']}: run at least {stats.MIN_RUNS} repeats of each{tail}")
            elif extra:
                details.append(f"{alt['variant']}: {', '.join(extra)}")
        found.append({"status": setup["status"], "head": head, "details": details})
    return found


def precision_words(decision: dict[str, Any]) -> str:
    """For a two-stage compare: the precision every ratio reached, and what a capped plan would have needed."""
    plan = decision.get("plan") or {}
    if not plan.get("pilot"):
        return ""
    widths = [a["half_width"] for s in decision["setups"] for a in s.get("alternatives", [])]
    widths = [w for w in widths if w is not None and np.isfinite(w)]
    reached = f"±{max(widths):.1%}" if widths else "no interval"
    text = (f"Precision: every ratio's 95 % interval within {reached} of it (target ±{plan['precision']:.1%}) after "
            f"{plan['ran']} runs of each ({plan['pilot']} pilot + {plan['ran'] - plan['pilot']} planned)")  # fmt: skip
    if plan.get("capped"):
        text += (f"; the target would have needed {plan['needed']} runs of each: capped by --max-repeats "
                 f"{plan['max_repeats']} (raise it to reach ±{plan['precision']:.1%})")  # fmt: skip
    return text


def words(decision: dict[str, Any]) -> list[str]:
    """The decision in plain words: a line per setup, then an indented line per other variant's next step."""
    lines = []
    for p in paragraphs(decision):
        lines.append(f"Decision ({p['status']}): {p['head']}")
        lines += [f"  {line}" for line in p["details"]]
    if precision_words(decision):
        lines.append(precision_words(decision))
    return lines


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

    path.write_text(json.dumps(clean(decision), indent=2) + "\n")
    return path
