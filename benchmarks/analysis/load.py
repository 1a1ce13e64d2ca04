"""Load result directories into tidy pandas frames (statistics are in `tables`).

from benchmarks.analysis.load import load_runs
rs = load_runs("results/runs/<compare-id>")      # or one run dir, or a glob
rs.runs, rs.timing, rs.loss                     # metadata joined in
"""

from __future__ import annotations

import dataclasses
import glob
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from benchmarks.analysis import check
from benchmarks.run import recorder as results

RUN_COLUMNS = ("run_id", "backend", "launcher", "world_size", "workload", "global_batch", "threads", "status")


class SchemaError(ValueError):
    """A result file distbench does not know how to read."""


@dataclass
class RunSet:
    runs: pd.DataFrame
    """One row per run: run.json's main fields, the knobs flattened as knob_*, and `path`."""
    timing: pd.DataFrame
    loss: pd.DataFrame
    skipped: list[str] = dataclasses.field(default_factory=list)
    """Runs left out, with the reason: not completed, or failing `distbench check`."""


def find_run_dirs(*paths: str | Path) -> list[Path]:
    """Run directories under each path: the path itself, its children, or a glob's matches."""
    found: list[Path] = []
    for pattern in paths:
        matches = [Path(p) for p in sorted(glob.glob(str(pattern)))] or [Path(pattern)]
        for path in matches:
            if (path / results.RUN_JSON).is_file():
                found.append(path)
            elif path.is_dir():
                found += sorted(p.parent for p in path.glob(f"*/{results.RUN_JSON}"))
    return list(dict.fromkeys(found))


def load_runs(*paths: str | Path, include_failed: bool = False) -> RunSet:
    """Load runs into tidy frames; timing and loss rows carry their run's metadata.

    Runs that did not complete, or that fail `distbench check`, are left out (and listed in
    `skipped`) unless `include_failed`.
    """
    dirs = find_run_dirs(*paths)
    if not dirs:
        raise FileNotFoundError(f"no run directories (with {results.RUN_JSON}) under {', '.join(map(str, paths))}")
    metas, timings, losses, skipped = [], [], [], []
    for run_dir in dirs:
        meta, problems = check.meta_problems(run_dir)  # the one reader of run.json
        if meta is None or meta.get("schema_version") not in results.KNOWN_SCHEMAS:
            raise SchemaError(f"{'; '.join(map(str, problems))}; upgrade distbench to read it")
        meta["status"] = results.effective_status(meta)
        frames = check.read_frames(run_dir)
        problems += check.check_frames(run_dir, meta, frames)
        if not include_failed and (meta["status"] != "completed" or problems):
            why = f"status {meta['status']}" if meta["status"] != "completed" else f"{len(problems)} check problems"
            skipped.append(f"{run_dir}: {why}")
            continue
        row = {key: meta.get(key) for key in RUN_COLUMNS}
        row.update({f"knob_{k}": v for k, v in (meta.get("knobs") or {}).items()})
        row.update(path=str(run_dir), error=meta.get("error"), timed_wall_s=meta.get("timed_wall_s"))
        metas.append(row)
        for name, sink in ((results.TIMING_CSV, timings), (results.LOSS_CSV, losses)):
            frame_, _ = frames[name]
            if frame_ is not None and len(frame_.columns) and "run_id" in frame_:
                sink.append(frame_)
    if not metas:
        raise FileNotFoundError(
            f"no usable runs under {', '.join(map(str, paths))} ({'; '.join(skipped)}); "
            "pass --include-failed to load them anyway"
        )
    runs = pd.DataFrame(metas)

    def frame(parts: list[pd.DataFrame], categorical: bool) -> pd.DataFrame:
        if not parts:
            return pd.DataFrame()
        out = pd.concat(parts, ignore_index=True)
        if categorical:  # timing has a row per rank per step: categories make grouping by run cheap
            out["run_id"], out["backend"] = out["run_id"].astype("category"), out["backend"].astype("category")
        by_run = runs.set_index("run_id")
        for column in ("launcher", "workload", "status"):
            out[column] = out["run_id"].map(by_run[column])
        return out

    return RunSet(runs=runs, timing=frame(timings, True), loss=frame(losses, False), skipped=skipped)
