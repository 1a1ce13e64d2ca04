"""The decision in words: a sentence per setup, a line per other variant worth one, the precision line.

Reads decision.json's content (`decision.decide`) only, so a decision.json from disk reads the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.analysis import intervals, stats
from benchmarks.analysis.decision import DEFAULT_MARGIN, MEMORY
from benchmarks.config import PLAIN_STEP


def _ratio_words(alt: dict[str, Any], margin: float) -> str:
    lo, hi = alt["ci"]
    if not (lo is not None and np.isfinite(lo)):
        return f"{alt['variant']} {alt['ratio']:.2f}× (no interval from {alt['runs']} runs)"
    digits = stats.interval_digits(lo, hi, margin)
    return f"{alt['variant']} {alt['ratio']:.{digits}f}× ({lo:.{digits}f}–{hi:.{digits}f})"


def _num(mb: float) -> str:
    """Whole MB, but two significant digits below 10 MB (a small model's training state is under 1 MB)."""
    return f"{mb:.0f}" if mb >= 10 else f"{mb:.2g}"


def _memory_words(memory: dict[str, list[float]]) -> str:
    def mb(low: float, high: float) -> str:
        return f"{_num(low)} MB" if _num(low) == _num(high) else f"{_num(low)}–{_num(high)} MB"

    return ", ".join(f"{MEMORY[k]} {mb(*v)}" for k, v in memory.items())


NAMES = {
    "cuda_max_allocated_mb": "CUDA allocated",
    "state_mb": "training state held",
    "training_rss_mb": "training's RSS",
    "peak_rss_mb": "peak RSS",
}


def _memory_lines(setup: dict[str, Any]) -> list[str]:
    """A line per variant left out for its memory, and the leanest variant's trade when it is not the pick."""
    lines = [
        f"not picked: {o['variant']}, {MEMORY[o['measure']]} {o['peak_mb']:.0f} MB per rank is above "
        f"--memory-limit-mb {o['limit_mb']:g}"
        for o in setup.get("over_budget") or []
    ]
    lean = setup.get("leanest")
    if lean:
        lo, hi = lean["ci"]
        interval = f" ({lo:.2f}–{hi:.2f})" if lo is not None and np.isfinite(lo) else ""
        lines.append(
            f"leanest: {lean['variant']}: {lean['ratio']:.2f}×{interval} the speed at {lean['share']:.0%} "
            f"of the training memory per rank ({NAMES[lean['measure']]} {_num(lean['mb'])} vs "
            f"{_num(lean['pick_mb'])} MB)"
        )
    return lines


def _head(setup: dict[str, Any], margin: float) -> str:
    """The setup's one sentence: the pick (resolved), the equivalence (equivalent), or who is ahead (unresolved)."""
    rec, alts = setup["recommended"], setup["alternatives"]
    knobs = " with " + " ".join(f"{k}={v}" for k, v in rec["knobs"].items()) if rec["knobs"] else ""
    eff = f", scaling efficiency {rec['efficiency']:.2f}" if rec.get("efficiency") is not None else ""
    mem = f"; {_memory_words(rec['memory_mb'])} per rank" if rec["memory_mb"] else ""
    by_status = {s: [a for a in alts if a["status"] == s] for s in ("resolved", "equivalent", "unresolved")}
    if setup["status"] == "equivalent":
        names = ", ".join([rec["variant"], *(a["variant"] for a in alts)])
        head = f"{names} equally fast within ±{margin:.0%}, choose on other grounds; {rec['variant']}{knobs}{eff}{mem}"
    elif setup["status"] == "unresolved":
        head = f"{rec['variant']}{knobs} ahead on these runs, not resolved{eff}{mem}"
    else:
        head = f"pick {rec['variant']}{knobs}{eff}{mem}"
    parts = []
    if by_status["resolved"]:
        parts.append("faster than " + ", ".join(_ratio_words(a, margin) for a in by_status["resolved"]))
    if by_status["equivalent"]:
        parts.append(
            f"equivalent within ±{margin:.0%} to " + ", ".join(_ratio_words(a, margin) for a in by_status["equivalent"])
        )
    if by_status["unresolved"]:
        parts.append("not resolved against " + ", ".join(_ratio_words(a, margin) for a in by_status["unresolved"]))
    return head + (" — " + "; ".join(parts) + " (throughput ratio to it, 95 % CI)" if parts else " (the only one)")


def paragraphs(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """Per setup: its status, the decision in one sentence, and a line per other variant worth a word."""
    found = []
    margin = decision.get("margin") or decision.get("precision") or DEFAULT_MARGIN  # schema 1 had no margin
    steps = {s.get("step_config") for s in decision["setups"]}
    plan_advice = (decision.get("plan") or {}).get("advice")
    for setup in decision["setups"]:
        where = f"{setup['workload']}, global batch {setup['global_batch']}, {setup['world_size']} ranks"
        if setup.get("step_config") and (len(steps) > 1 or setup["step_config"] != PLAIN_STEP):
            where += f", {setup['step_config']}"
        if not setup["decides"] or setup.get("recommended") is None:
            found.append(
                {
                    "status": "none",
                    "head": f"{where}: no decision — {setup.get('note', setup['status'])}",
                    "details": [],
                }
            )
            continue
        details = []
        for alt in setup["alternatives"]:
            extra = []
            if alt.get("efficiency") is not None:
                extra.append(f"scaling efficiency {alt['efficiency']:.2f}")
            if alt["memory_mb"]:
                extra.append(f"{_memory_words(alt['memory_mb'])} per rank")
            tail = f"; {', '.join(extra)}" if extra else ""
            if alt["status"] == "resolved" and alt.get("reason"):
                details.append(f"why {alt['variant']} is slower: {alt['reason']['text']}{tail}")
            elif alt["status"] == "unresolved" and plan_advice:  # one plan, said after the pilot: no second count
                details.append(f"to settle {alt['variant']}: the plan the pilot gave (Precision, below){tail}")
            elif alt["status"] == "unresolved" and alt.get("repeats_to_resolve_estimate"):
                details.append(
                    f"to settle {alt['variant']}: an estimate — {alt['repeats_to_resolve_estimate']} runs of each give "
                    f"an {intervals.POWER:.0%} chance of resolving a true difference of {abs(1 - alt['ratio']):.1%} "
                    f"(the one observed) at the measured spreads: {alt['command']}{tail}"
                )
            elif alt["status"] == "unresolved":
                details.append(f"to settle {alt['variant']}: run at least {stats.MIN_RUNS} repeats of each{tail}")
            elif extra:
                details.append(f"{alt['variant']}: {', '.join(extra)}")
        details += _memory_lines(setup)
        if setup.get("short_runs"):  # said in the decision itself, not only under the tables
            details.append(f"warning: {setup['short_runs']}")
        found.append({"status": setup["status"], "head": f"{where}: {_head(setup, margin)}", "details": details})
    return found


def precision_words(decision: dict[str, Any]) -> str:
    """After a second stage: the precision every ratio reached, the runs that completed of each variant, and
    what the plan would have needed where the cap or the budget stopped it."""
    plan = decision.get("plan") or {}
    if not plan.get("pilot"):
        return ""
    widths = [a["half_width"] for s in decision["setups"] for a in s.get("alternatives", [])]
    widths = [w for w in widths if w is not None and np.isfinite(w)]
    reached = f"±{max(widths):.1%}" if widths else "no interval"
    runs = {s["recommended"]["variant"]: s["recommended"]["runs"] for s in decision["setups"] if s.get("recommended")}
    runs.update({a["variant"]: a["runs"] for s in decision["setups"] for a in s.get("alternatives", [])})
    counted = ", ".join(f"{v} {n}" for v, n in runs.items())
    text = (
        f"Precision: every ratio's 95 % interval within {reached} of it (target ±{plan['precision']:.1%}); "
        f"completed runs after a pilot of {plan['pilot']}: {counted}"
    )
    if plan.get("budget"):
        text += f"; {plan['budget']}"
    if plan.get("advice"):
        decided = all(s.get("status") in ("resolved", "equivalent") for s in decision["setups"])
        if not decided:  # the plan said right after the pilot, the same words
            return f"{text}; {plan['advice']}"
        # The pilot's few runs overstate a spread more often than not: these runs decided after all.
        return f"{text}; decided with these runs, though the pilot's spreads had asked for more"
    short = {a: n for a, n in (plan.get("needed") or {}).items() if n > (plan.get("ran") or {}).get(a, n)}
    if short:
        text += "; the target needed " + ", ".join(f"{a} {n}" for a, n in short.items()) + " runs"
    return text


def step_words(decision: dict[str, Any]) -> list[str]:
    """A study over step configurations: whether the pick changes with the step, one line per setup studied."""
    lines = []
    for study in decision.get("by_step") or []:
        each = "; ".join(
            f"{s['step_config']} → {s['leader']}{'' if s['pick'] else ' (ahead, not resolved)'}" for s in study["steps"]
        )
        if study["pick_changes"]:
            verdict = "the pick changes with the step"
        elif study["same_leader"]:
            resolved = all(s["pick"] for s in study["steps"])
            verdict = "the pick is the same under every step" if resolved else "the same variant leads under every step"
        else:
            verdict = "the leader changes with the step, but not between two resolved picks"
        where = f"{study['workload']}, global batch {study['global_batch']}, {study['world_size']} ranks"
        lines.append(f"Across steps ({where}): {verdict}: {each}")
    return lines


def words(decision: dict[str, Any]) -> list[str]:
    """The decision in plain words: a line per setup, then an indented line per other variant's next step."""
    lines = []
    for p in paragraphs(decision):
        lines.append(f"Decision ({p['status']}): {p['head']}")
        lines += [f"  {line}" for line in p["details"]]
    lines += step_words(decision)
    if precision_words(decision):
        lines.append(precision_words(decision))
    return lines
