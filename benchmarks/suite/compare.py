"""`distbench compare`: the same workload over several backends, each under a real launcher.

Runs are interleaved (ddp, horovod, ddp, horovod, …) so drift in machine speed hits both alike.
The launchers are the engines: torchrun for ddp and horovodrun for horovod by default, or mpirun
for both (`--launcher mpirun`). One failing backend does not stop the others; the exit code does.
"""

from __future__ import annotations

import datetime
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from benchmarks import launch
from benchmarks.analysis import load, report, tables
from benchmarks.config import InputError
from benchmarks.run import recorder as results

DEFAULT_LAUNCHER = {"ddp": launch.TORCHRUN, "horovod": launch.HOROVODRUN, "single": launch.PYTHON}
# The embedded default: about a minute on 2 cores, and a communication-heavy model so the two
# frameworks' allreduce strategies actually differ.
DEFAULTS = {"workload": "transformer", "epochs": 1, "steps_per_epoch": 20, "warmup_steps": 3,
            "train_size": 1024, "val_size": 128}  # fmt: skip


@dataclass
class Attempt:
    backend: str
    repeat: int
    run_id: str
    command: list[str]
    returncode: int | None = None


def launcher_command(backend: str, launcher: str | None, nproc: int) -> list[str]:
    """argv prefix that starts `nproc` ranks of `python -m benchmarks.cli` under a launcher."""
    bin_dir = Path(sys.executable).parent
    module = [sys.executable, "-m", "benchmarks.cli"]
    chosen = launcher or DEFAULT_LAUNCHER[backend]
    if backend == "single":
        return module
    if chosen == launch.TORCHRUN:
        return [str(bin_dir / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", "-m", "benchmarks.cli"]
    if chosen == launch.HOROVODRUN:
        return [str(bin_dir / "horovodrun"), "-np", str(nproc), "--gloo", *module]
    if chosen == launch.MPIRUN:
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return ["mpirun", "-np", str(nproc), "--oversubscribe", *root, *module]
    raise ValueError(f"--launcher must be torchrun, horovodrun or mpirun, not {chosen!r}")


def new_compare_id() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-compare-{secrets.token_hex(2)}"


def make_compare_dir(out: Path, compare_id: str | None) -> Path:
    root = out / (compare_id or new_compare_id())
    try:
        root.mkdir(parents=True, exist_ok=False)
    except FileExistsError as exc:
        raise InputError(f"{root} already exists; choose another --run-id") from exc
    except OSError as exc:
        raise InputError(f"cannot write to --out {out} ({exc.strerror}); choose a writable --out") from exc
    return root


def compare(
    backends: list[str], nproc: int, repeats: int, launcher: str | None, run_argv: list[str], root: Path, threads: int
) -> int:
    """Run every (repeat, backend) into `root`, write comparison.csv, print the table; 0 only if all succeeded."""
    # The same OpenMP setting under every launcher (torchrun alone would force 1).
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    attempts = []
    total = repeats * len(backends)
    for repeat in range(repeats):
        for backend in backends:
            run_id = f"{backend}-r{repeat}"
            cmd = [
                *launcher_command(backend, launcher, nproc),
                "run",
                "--backend",
                backend,
                *run_argv,
                "--out",
                str(root),
                "--run-id",
                run_id,
            ]
            attempt = Attempt(backend, repeat, run_id, cmd)
            print(
                f"[compare {len(attempts) + 1}/{total}] {backend} repeat {repeat + 1}/{repeats}: {' '.join(cmd[:4])} …",
                file=sys.stderr,
                flush=True,
            )
            try:
                attempt.returncode = subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env).returncode
            except FileNotFoundError as exc:
                print(f"[compare] cannot start {backend}: {exc}", file=sys.stderr)
                attempt.returncode = 127
            results.mark_abandoned(root / run_id, f"the job exited {attempt.returncode} before the run completed")
            if attempt.returncode:
                print(f"[compare] {backend} repeat {repeat + 1} FAILED (exit {attempt.returncode})", file=sys.stderr)
            attempts.append(attempt)
    print(write_comparison(root, attempts))
    try:
        report.write([root], root / "report", {"md", "html"})
        print(f"report: {root / 'report' / 'report.html'}")
    except FileNotFoundError as exc:  # no run completed: nothing to plot
        print(f"[compare] no report: {exc}", file=sys.stderr)
    print(root)
    return 0 if all(a.returncode == 0 for a in attempts) else 1


def write_comparison(root: Path, attempts: list[Attempt]) -> str:
    """comparison.csv (one row per run, failures included) and the terminal table."""
    found = load.find_run_dirs(root)
    rs = load.load_runs(root, include_failed=True) if found else None
    per_run = tables.per_run_stats(rs) if rs is not None else pd.DataFrame(columns=["run_id"])
    rows = []
    for a in attempts:
        match = per_run[per_run.run_id == a.run_id]
        stats = match.iloc[0].to_dict() if len(match) else {}
        ok = a.returncode == 0 and stats.get("status") == "completed"
        rows.append(
            {
                "backend": a.backend,
                "repeat": a.repeat,
                "run_id": a.run_id,
                "status": "completed" if ok else "failed",
                "returncode": a.returncode,
                "command": " ".join(a.command),
                **{
                    k: stats.get(k)
                    for k in (
                        "world_size",
                        "samples_per_s",
                        "step_p50_s",
                        "step_p90_s",
                        "step_p99_s",
                        "final_train_loss",
                        "final_val_loss",
                    )
                },
            }
        )
    comparison = pd.DataFrame(rows)
    comparison.to_csv(root / "comparison.csv", index=False)
    table = tables.backend_table(comparison)
    agreement = tables.loss_agreement(rs) if rs is not None else float("nan")
    return tables.format_table(table, agreement)
