"""Read a Horovod timeline (`run --trace`): where its allreduces spent their time, per step.

The timeline is Chrome-trace JSON written by rank 0: one "process" per tensor, and per tensor nested
begin/end events — NEGOTIATE_ALLREDUCE (waiting until every rank has the tensor ready), then ALLREDUCE
with its sub-activities: QUEUE / WAIT_FOR_* (GPU), MEMCPY_IN/OUT_FUSION_BUFFER, and the transfer itself
(GLOO_ALLREDUCE, MPI_ALLREDUCE, NCCL_ALLREDUCE, …). Fused tensors carry the same activity at the same
time, so each category is measured as the union of its intervals over all tensors: wall time, not a sum.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

CATEGORIES = ("negotiation", "queue", "memcpy", "communication", "allreduce")
"""Reported per step in ms: `queue` is the wait between a tensor's negotiation and its allreduce plus any
QUEUE/WAIT_FOR_* activity; `allreduce` is the whole ALLREDUCE operation (memcpy + communication + rest)."""


def _category(name: str) -> str | None:
    if name.startswith("NEGOTIATE_"):
        return "negotiation"
    if name == "ALLREDUCE":
        return "allreduce"
    if name.startswith("MEMCPY_"):
        return "memcpy"
    if name in ("QUEUE", "SCHEDULE") or name.startswith("WAIT_FOR_"):
        return "queue"
    if name.endswith("_ALLREDUCE"):
        return "communication"
    return None


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def load_events(path: Path) -> list[dict[str, Any]]:
    """The timeline's events; a file cut short (a job killed mid-write) is read up to its last whole event."""
    text = path.read_text().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.rstrip(",\n ").rsplit("}", 1)[0] + "}]") if "}" in text else []


def summarize(path: Path, steps: int) -> dict[str, float]:
    """Milliseconds per step in each of CATEGORIES (wall time over all tensors), for `steps` traced steps."""
    open_events: dict[Any, list[tuple[str, float]]] = defaultdict(list)
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    last_negotiated: dict[Any, float] = {}
    for event in load_events(path):
        phase, pid, ts = event.get("ph"), event.get("pid"), event.get("ts")
        if phase == "B":
            name = str(event.get("name", ""))
            if name == "ALLREDUCE" and pid in last_negotiated:  # agreed, then waiting for its turn
                intervals["queue"].append((last_negotiated.pop(pid), float(ts)))
            open_events[pid].append((name, float(ts)))
        elif phase == "E" and open_events[pid]:
            name, begin = open_events[pid].pop()
            category = _category(name)
            if category is not None:
                intervals[category].append((begin, float(ts)))
            if category == "negotiation":
                last_negotiated[pid] = float(ts)
    return {c: _union_us(intervals[c]) / 1000 / max(steps, 1) for c in CATEGORIES}
