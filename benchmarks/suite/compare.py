"""`distbench compare`: the same workload over several backends, each under a real launcher.

Runs are interleaved (ddp, horovod, ddp, horovod, …) so drift in machine speed hits both alike.
The launchers are the engines: torchrun for ddp and horovodrun for horovod by default, or mpirun
for both (`--launcher mpirun`). One failing backend does not stop the others; the exit code does.

This module is imported by the parser of every `distbench` process, ranks included, so it imports
neither torch nor the analysis stack (pandas, scipy, matplotlib) at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import backends
from benchmarks import config, launch
from benchmarks.config import InputError, RunConfig
from benchmarks.run import workloads

DEFAULT_LAUNCHER = {"ddp": launch.TORCHRUN, "horovod": launch.HOROVODRUN, "single": launch.PYTHON}
FORCEABLE_LAUNCHERS = (launch.TORCHRUN, launch.HOROVODRUN, launch.MPIRUN)
# The embedded default, used only when no --workload is given: a communication-heavy model (so the
# two frameworks' allreduce strategies differ) in one epoch of 80 timed steps. Launcher start-up,
# imports and the report cost ~7 s per run whatever the length, so a run must be this long for over a
# third of a compare's wall time to be measured (README: "where a compare's time goes").
PRESET: dict[str, Any] = {"workload": "transformer", "epochs": 1, "steps_per_epoch": 85, "train_size": 4096,
                          "val_size": 128}  # fmt: skip


def _flags(options: dict[str, Any]) -> str:
    return " ".join(f"{config.flag(k)} {v}" for k, v in options.items())


def add_arguments(cmp: argparse.ArgumentParser) -> None:
    """compare's own options; call after the run options are added, whose preset defaults it rewrites."""
    rest = {k: v for k, v in PRESET.items() if k != "workload"}
    cmp.description = (
        f"With no options: DDP vs Horovod on {PRESET['workload']} (a small GPT), 2 ranks, 3 interleaved repeats, "
        f"about 70–80 s on 2 cores. Without --workload the run options default to {_flags(rest)} and the "
        "transformer's own --lr and --batch-size; with --workload W they default to run's and W's own. "
        "compare prints the options in effect before it starts."
    )
    cmp.add_argument("--backends", default="ddp,horovod", help="comma-separated backends (default: ddp,horovod)")
    cmp.add_argument("--nproc", type=int, default=2, help="ranks per backend (default: 2)")
    cmp.add_argument("--repeats", type=int, default=3, help="interleaved repeats per backend (default: 3)")
    cmp.add_argument(
        "--launcher",
        choices=FORCEABLE_LAUNCHERS,
        default=None,
        help="one launcher for every backend but single, which runs under python "
        "(default: torchrun for ddp, horovodrun for horovod)",
    )
    # None = "not given": the preset fills these only when --workload is not given either.
    cmp.set_defaults(**dict.fromkeys(PRESET))
    run_defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    texts = {
        "workload": f"{PRESET['workload']} with {_flags(rest)}; a --workload given takes run's defaults and "
        "the workload's own instead",
        **{k: f"{v} without --workload, else {_run_default_text(k, run_defaults[k])}" for k, v in rest.items()},
    }
    # argparse has no public way to change an added option's help; the actions list is stable since 2.7.
    for action in cmp._actions:
        if action.dest in texts:
            field = next(f for f in dataclasses.fields(RunConfig) if f.name == action.dest)
            action.help = f"{field.metadata['help']} (default: {texts[action.dest]})".replace("%", "%%")


def _run_default_text(name: str, default: Any) -> str:
    if name in ("train_size", "val_size"):
        sizes = {w: spec.defaults.get(name, "the rest") for w, spec in workloads.REGISTRY.items()}
        return "the workload's: " + ", ".join(f"{w} {v}" for w, v in sizes.items())
    return "one pass" if default is None else str(default)


def effective_config(args: argparse.Namespace) -> tuple[RunConfig, bool]:
    """The run options compare will pass on, and whether they are the preset (no --workload given)."""
    preset = args.workload is None
    fill = PRESET if preset else {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in PRESET}
    given = {k: v for k, v in vars(args).items() if k in PRESET and v is not None}
    cfg = config.from_namespace(RunConfig, argparse.Namespace(**{**vars(args), **fill, **given}))
    return workloads.resolve(cfg), preset


def one_process(cfg: RunConfig, nproc: int) -> RunConfig:
    """The options of a one-process backend in a compare of `nproc` ranks: the same global batch."""
    assert cfg.batch_size is not None
    return dataclasses.replace(cfg, batch_size=cfg.batch_size * nproc)


def launcher_for(backend: str, launcher: str | None) -> str:
    """The launcher a backend's runs start under: a one-process backend always under python."""
    return launch.PYTHON if backend in backends.ONE_PROCESS else launcher or DEFAULT_LAUNCHER[backend]


def check_launchers(names: list[str], launcher: str | None) -> None:
    """Refuse, before anything starts, a backend the chosen launcher cannot start."""
    accepts = {name: backends.get(name).launchers for name in names}
    for name, supported in accepts.items():
        chosen = launcher_for(name, launcher)
        if chosen not in supported:
            many = [s for b, s in accepts.items() if b not in backends.ONE_PROCESS]
            common = [x for x in FORCEABLE_LAUNCHERS if all(x in s for s in many)]
            fix = f"use --launcher {' or '.join(common)}" if common else "compare them in separate commands"
            raise InputError(
                f"backend '{name}' cannot run under {chosen} (it runs under {', '.join(supported)}); "
                f"leave out --launcher for each backend's own, or {fix}"
            )


def describe(cfg: RunConfig, preset: bool, names: list[str], launcher: str | None, nproc: int,
             repeats: int, threads: int, knobs: dict[str, list[str]] | None = None) -> str:  # fmt: skip
    """The start-up lines: what will run, with every option that matters spelt out (`knobs`: each
    backend's own options that differ from their defaults)."""
    variants = ", ".join(f"{n} ({launcher_for(n, launcher)})" for n in names)
    single = [f"{n}: 1 rank of batch {cfg.batch_size * nproc}" for n in names if n in backends.ONE_PROCESS]
    ranks = f"{nproc} ranks per backend" + (f" ({', '.join(single)})" if single else "")
    where = (
        "compare's default; give --workload for a workload's own"
        if preset
        else "the workload's defaults and the options given"
    )
    steps = "one pass per epoch" if cfg.steps_per_epoch is None else f"--steps-per-epoch {cfg.steps_per_epoch}"
    train = "the rest" if cfg.train_size is None else cfg.train_size
    shown = ("workload", "epochs", "steps_per_epoch", "warmup_steps", "batch_size", "lr", "train_size", "val_size")
    plain = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in (*shown, "out", "run_id")}
    others = config.to_argv(dataclasses.replace(cfg, **plain))
    return (
        f"distbench compare: {variants}; {ranks}, {repeats} repeat{'s' * (repeats != 1)} interleaved, "
        f"OMP_NUM_THREADS={threads}\n"
        f"  {cfg.workload} ({where}): --epochs {cfg.epochs}, {steps}, --warmup-steps {cfg.warmup_steps}, "
        f"--batch-size {cfg.batch_size} per rank, --lr {cfg.lr}, --train-size {train}, --val-size {cfg.val_size}"
        + (f"; also {' '.join(others)}" if others else "")
        + "".join(f"\n  {name} only: {' '.join(argv)}" for name, argv in (knobs or {}).items() if argv)
    )


@dataclass
class Attempt:
    backend: str
    repeat: int
    run_id: str
    command: list[str]
    returncode: int | None = None
    job_wall_s: float = float("nan")
    """The whole job: launcher, start-up, training, validation, exit."""
    timed_wall_s: float = float("nan")
    """The run's timed window (run.json, read by `write_comparison`), NaN if it recorded none."""


def launcher_command(backend: str, launcher: str | None, nproc: int) -> list[str]:
    """argv prefix that starts `nproc` ranks of `python -m benchmarks.cli` under a launcher."""
    bin_dir = Path(sys.executable).parent
    module = [sys.executable, "-m", "benchmarks.cli"]
    chosen = launcher_for(backend, launcher)
    if chosen == launch.PYTHON:
        return module
    if chosen == launch.TORCHRUN:
        return [str(bin_dir / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", "-m", "benchmarks.cli"]
    if chosen == launch.HOROVODRUN:
        return [str(bin_dir / "horovodrun"), "-np", str(nproc), "--gloo", *module]
    if chosen == launch.MPIRUN:
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return ["mpirun", "-np", str(nproc), "--oversubscribe", *root, *module]
    raise ValueError(f"--launcher must be one of {', '.join(FORCEABLE_LAUNCHERS)}, not {chosen!r}")


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
    backends: list[str],
    nproc: int,
    repeats: int,
    launcher: str | None,
    run_argv: dict[str, list[str]],
    root: Path,
    threads: int,
    started: float | None = None,
) -> int:
    """Run every (repeat, backend) into `root`, write comparison.csv, print the table; 0 only if all succeeded.

    `run_argv[backend]` is the `run` options that backend's runs get; `started` is when the command
    started (`time.perf_counter()`), so the checks before the jobs count in the wall time.
    """
    from benchmarks.run import recorder as results

    first_job = time.perf_counter()
    started = first_job if started is None else started
    # The same OpenMP setting under every launcher (torchrun alone would force 1).
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    attempts = []
    total = repeats * len(backends)
    for repeat in range(repeats):
        for backend in backends:
            run_id = f"{backend}-r{repeat}"
            cmd = [*launcher_command(backend, launcher, nproc), "run", "--backend", backend, *run_argv[backend],
                   "--out", str(root), "--run-id", run_id]  # fmt: skip
            attempt = Attempt(backend, repeat, run_id, cmd)
            print(
                f"[compare {len(attempts) + 1}/{total}] {backend} repeat {repeat + 1}/{repeats}: {' '.join(cmd[:4])} …",
                file=sys.stderr,
                flush=True,
            )
            t0 = time.perf_counter()
            try:
                attempt.returncode = subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env).returncode
            except FileNotFoundError as exc:
                print(f"[compare] cannot start {backend}: {exc}", file=sys.stderr)
                attempt.returncode = 127
            attempt.job_wall_s = time.perf_counter() - t0
            results.mark_abandoned(root / run_id, f"the job exited {attempt.returncode} before the run completed")
            if attempt.returncode:
                print(f"[compare] {backend} repeat {repeat + 1} FAILED (exit {attempt.returncode})", file=sys.stderr)
            attempts.append(attempt)
    t0 = time.perf_counter()
    phases = {"checks": first_job - started, f"{len(attempts)} jobs": t0 - first_job}
    print(write_comparison(root, attempts))
    try:
        from benchmarks.analysis import report

        report.write([root], root / "report", {"md", "html"})
        print(f"report: {root / 'report' / 'report.html'}")
    except FileNotFoundError as exc:  # no run completed: nothing to plot
        print(f"[compare] no report: {exc}", file=sys.stderr)
    phases["table and report"] = time.perf_counter() - t0
    print(time_line(attempts, phases, time.perf_counter() - started))
    print(root)
    return 0 if all(a.returncode == 0 for a in attempts) else 1


def time_line(attempts: list[Attempt], phases: dict[str, float], wall_s: float) -> str:
    """Where the wall time went: the share inside the runs' timed windows is what was measured."""
    timed = sum(a.timed_wall_s for a in attempts if a.timed_wall_s == a.timed_wall_s)  # NaN ≠ NaN
    share = timed / wall_s if wall_s > 0 else float("nan")
    spent = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    return f"time: {timed:.1f} s of {wall_s:.1f} s wall inside timed windows ({share:.0%}); {spent}"


COMPARISON_COLUMNS = ["backend", "repeat", "run_id", "status", "returncode", "command", "world_size", "samples_per_s",
                      "step_p50_s", "step_p90_s", "step_p99_s", "final_train_loss", "final_val_loss", "job_wall_s",
                      "timed_wall_s"]  # fmt: skip


def write_comparison(root: Path, attempts: list[Attempt]) -> str:
    """comparison.csv (one row per run, failures included) and the terminal table."""
    import pandas as pd

    from benchmarks.analysis import load, tables

    found = load.find_run_dirs(root)
    rs = load.load_runs(root, include_failed=True) if found else None
    per_run = tables.per_run_stats(rs) if rs is not None else pd.DataFrame(columns=["run_key"])
    by_run = {str(Path(row["run_key"]).resolve()): row for row in per_run.to_dict("records")}
    rows = []
    for a in attempts:
        run_dir = root / a.run_id
        stats = by_run.get(str(run_dir.resolve()), {})
        wall = stats.get("timed_wall_s")
        a.timed_wall_s = float(wall) if isinstance(wall, (int, float)) else float("nan")  # for the time line
        ok = a.returncode == 0 and stats.get("status") == "completed"
        # Every statistic the analysis has (the table may use more than the CSV keeps), then the attempt's facts.
        rows.append({"run_key": str(run_dir), **stats, **dataclasses.asdict(a), "command": " ".join(a.command),
                     "status": "completed" if ok else "failed"})  # fmt: skip
    full = pd.DataFrame(rows)
    full.reindex(columns=COMPARISON_COLUMNS).to_csv(root / "comparison.csv", index=False)
    table = tables.backend_table(full)
    agreement = tables.loss_agreement(rs) if rs is not None else float("nan")
    return tables.format_table(table, agreement)
