"""Micro-benchmark: `distbench report` on a compare directory of about a million timing rows.

    .venv/bin/python -m benchmarks.analysis.bench_report [--rows 1000000] [--target-s 5]

Writes a synthetic comparison (2 backends × 3 repeats × 4 ranks) in the real file format to a
temporary directory, times loading + statistics + plots + report files, and exits 1 when slower
than the target.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import files
from benchmarks.analysis import report
from benchmarks.run import recorder as results


def write_synthetic_compare(root: Path, rows: int, ranks: int = 4, seed: int = 0) -> None:
    """A compare directory in the real schema: run.json, timing.csv, loss.csv, summary.csv per run."""
    rng = np.random.default_rng(seed)
    runs = [(backend, repeat) for repeat in range(3) for backend in ("ddp", "horovod")]
    steps = rows // (len(runs) * ranks)
    for backend, repeat in runs:
        run_id = f"{backend}-r{repeat}"
        run_dir = root / run_id
        run_dir.mkdir(parents=True)
        base = 0.05 if backend == "ddp" else 0.06
        phases = rng.gamma(20, base / 80, size=(steps * ranks, 4))
        timing = pd.DataFrame(
            {
                "run_id": run_id,
                "backend": backend,
                "world_size": ranks,
                "rank": np.tile(np.arange(ranks), steps),
                "epoch": 1,
                "step": np.repeat(np.arange(1, steps + 1), ranks),
                "warmup": np.repeat(np.arange(1, steps + 1), ranks) <= 5,
                "samples": 32,
                "data_s": phases[:, 0],
                "forward_s": phases[:, 1],
                "backward_s": phases[:, 2],
                "optimizer_s": phases[:, 3],
                "step_s": phases.sum(axis=1),
            }
        )
        files.write_csv(timing, run_dir / results.TIMING_CSV, index=False, columns=results.TIMING_COLUMNS)
        loss = pd.DataFrame(
            {
                "run_id": run_id,
                "backend": backend,
                "world_size": ranks,
                "epoch": 1,
                "step": np.arange(1, steps + 1),
                "split": "train",
                "loss": np.exp(-np.arange(steps) / steps),
                "accuracy": None,
                "samples": 32 * ranks,
            }
        )
        # reindex: the validation columns (schema 4) are empty on train rows, as a run writes them
        files.write_csv(loss.reindex(columns=results.LOSS_COLUMNS), run_dir / results.LOSS_CSV, index=False)
        wall = float(timing[~timing.warmup].groupby("step")["step_s"].max().sum())  # a lock-step run
        meta = {
            "run_id": run_id,
            "backend": backend,
            "world_size": ranks,
            "workload": "synthetic",
            "launcher": "torchrun",
            "global_batch": 32 * ranks,
            "threads": 1,
            "timed_wall_s": wall,
        }
        results.write_json_atomic(
            run_dir / results.RUN_JSON, {"schema_version": results.SCHEMA_VERSION, **meta, "status": "completed"}
        )
        timed = timing[~timing.warmup]
        slowest = timed.groupby("step")["step_s"].max()
        summary = results.summary_row(meta, slowest, int(timed["samples"].sum()), {"train": loss.iloc[-1]}, wall)
        files.write_csv(
            pd.DataFrame([summary]), run_dir / results.SUMMARY_CSV, index=False, columns=results.SUMMARY_COLUMNS
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--target-s", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "compare"
        write_synthetic_compare(root, args.rows)
        start = time.perf_counter()
        report.write([root], root / "report", {"md", "html"})
        elapsed = time.perf_counter() - start
    verdict = "ok" if elapsed < args.target_s else "SLOWER THAN TARGET"
    print(f"report on {args.rows:,} timing rows: {elapsed:.2f} s (target < {args.target_s:.1f} s) {verdict}")
    return 0 if elapsed < args.target_s else 1


if __name__ == "__main__":
    raise SystemExit(main())
