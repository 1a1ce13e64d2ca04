"""A result directory's run.json, read in this one place by every part of the analysis.

Training runs and `distbench allreduce` runs both record one; its `kind` tells them apart, and a run left
`running` by a process that no longer exists reads as `failed`, said in one wording (`DIED`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.run import collectives as rank_side
from benchmarks.run import recorder as results

DIED = "status running but its process is gone (the job died)"


def read(run_dir: Path) -> dict[str, Any]:
    """run.json as a mapping; OSError or ValueError when it is missing, unparsable or not a JSON object."""
    meta = json.loads((Path(run_dir) / results.RUN_JSON).read_text())
    if not isinstance(meta, dict):
        raise ValueError(f"{results.RUN_JSON} is not a JSON object")
    return meta


def read_or_none(run_dir: Path) -> dict[str, Any] | None:
    """run.json, or None where `read` fails (the check reports why)."""
    try:
        return read(run_dir)
    except (OSError, ValueError):
        return None


def is_allreduce(run_dir: Path) -> bool:
    """A `distbench allreduce` run directory (run.json `kind`), with its own contract and loader."""
    return (read_or_none(run_dir) or {}).get("kind") == rank_side.KIND


def status(meta: dict[str, Any]) -> str:
    """The recorded status, but `failed` for a run left `running` by a process that is gone (`DIED`)."""
    return results.effective_status(meta)
