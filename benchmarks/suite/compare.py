"""`distbench compare`: the same workload over several variants (backend × launcher), each under a real launcher.

Runs are interleaved (ddp, horovod, ddp, horovod, …, and every world size of `--nproc 1,2,4` in turn) so
drift in machine speed hits all alike. Variants name the launcher: `ddp@torchrun`, `horovod@gloo`
(horovodrun --gloo), `horovod@mpi` (horovodrun --mpi), … (`variants`). One failing variant does not stop
the others; the exit code says it.

This module is imported by the parser of every `distbench` process, ranks included, so it imports
neither torch nor the analysis stack (pandas, scipy, matplotlib) at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import backends
from benchmarks import catalog, config, errors, files, launch
from benchmarks.errors import InputError
from benchmarks.run.validate import validate
from benchmarks.suite import host_options, hosts, precision, sizing, slurm, variants
from benchmarks.suite import jobs as processes
from benchmarks.suite.comparison import STRONG, WEAK, Attempt, time_line, write_comparison
from benchmarks.suite.options import add_arguments as add_arguments
from benchmarks.suite.options import check_not_overwrite, describe, effective_config, equal_buffers
from benchmarks.suite.variants import Job, jobs_for


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
        reason = files.unwritable_reason(out, exc)
        raise InputError(f"cannot write to --out {out} ({reason}); choose a writable --out") from exc
    return root


def run_jobs(
    jobs: list[Job],
    repeats: int,
    root: Path,
    supervisor: processes.Supervisor,
    label: str = "compare",
    first: int = 0,
    arms: set[str] | None = None,
) -> list[Attempt]:
    """Every (repeat, job) into `root`, interleaved, repeats `first` to `repeats` − 1 (of the jobs whose run prefix
    is in `arms`, when given); a failing job is recorded and the others still run. Once `supervisor` is
    interrupted the running job is stopped and recorded, and no other starts."""
    from benchmarks.run import recorder as results

    attempts: list[Attempt] = []
    jobs = [j for j in jobs if arms is None or j.run_prefix in arms]
    total = (repeats - first) * len(jobs)
    for repeat in range(first, repeats):
        for job in jobs:
            if supervisor.interrupted:
                return attempts
            run_id = f"{job.run_prefix}-r{repeat}"
            cmds = job.commands(root, run_id)
            cmd = cmds[0]
            name = job.variant.given or job.variant.name
            if len({j.strategy for j in jobs}) > 1:
                name += f" (val {job.strategy})"
            if len({j.step_config for j in jobs}) > 1:
                name += f" ({job.step_config})"
            at = f" ×{job.nproc}" if len({j.nproc for j in jobs}) > 1 else ""
            assert job.cfg.batch_size is not None
            attempt = Attempt(
                job.variant.name,
                job.variant.backend,
                job.nproc,
                job.cfg.batch_size,
                repeat,
                run_id,
                cmd,
                val_strategy=job.strategy,
                step_config=job.step_config,
            )
            print(
                f"[{label} {len(attempts) + 1}/{total}] {name}{at} repeat {repeat + 1}/{repeats}: "
                f"{' '.join(cmd[:4]) if not job.hosts.many else job.hosts.launch_words(job.variant, job.ranks)} …",
                file=sys.stderr,
                flush=True,
            )
            env = {**os.environ, **job.env()}
            t0 = time.perf_counter()
            try:
                attempt.returncode = supervisor.run_all(cmds, env, root / f"{run_id}.interrupted.log")
            except FileNotFoundError as exc:
                print(f"[{label}] cannot start {name}: {exc}", file=sys.stderr)
                attempt.returncode = 127
            attempt.job_wall_s = time.perf_counter() - t0
            if supervisor.interrupted:
                attempt.signalled = True
                attempt.interrupted = processes.record_interrupted(
                    root / run_id, supervisor.signal_name, f"distbench {label.split()[0]}"
                )
            elif attempt.returncode and job.variant.launcher == launch.SRUN:
                if cancel := slurm.cancelled(supervisor.said.decode(errors="replace")):
                    attempt.interrupted = processes.record_interrupted(root / run_id, why=cancel)
            if attempt.returncode and not attempt.signalled and not (root / run_id / results.RUN_JSON).exists():
                processes.record_launcher_died(root / run_id, job.meta(run_id), attempt.returncode, supervisor.said)
            results.mark_abandoned(root / run_id, f"the job exited {attempt.returncode} before the run completed")
            if attempt.interrupted:
                print(f"[{label}] {name}{at} repeat {repeat + 1} interrupted", file=sys.stderr)
            elif attempt.signalled:
                print(f"[{label}] {name}{at} repeat {repeat + 1} completed just before the interrupt", file=sys.stderr)
            elif attempt.returncode:
                lost = job.hosts.diagnose() if job.hosts.many else None
                print(
                    f"[{label}] {name}{at} repeat {repeat + 1} FAILED (exit {attempt.returncode})"
                    + (f": {lost}" if lost else ""),
                    file=sys.stderr,
                )
            attempts.append(attempt)
    return attempts


def compare(
    jobs: list[Job],
    design: argparse.Namespace,
    root: Path,
    scaling: str = WEAK,
    started: float | None = None,
    command: str = "",
) -> int:
    """Run every (repeat, job) into `root`, write comparison.csv, print the decision and the tables; 0 only if
    all succeeded, 130 when a signal stopped it (what completed is written all the same).

    `design` is the options `precision.check` filled in (repeats, margin, precision, max_repeats, budget_s): with
    a precision, `repeats` is the pilot of a two-stage compare. `started` is when the command started
    (`time.perf_counter()`), so the checks before the jobs count in the wall time.
    """
    first_job = time.perf_counter()
    started = first_job if started is None else started
    with processes.Supervisor(root) as supervisor:
        if getattr(design, "sized", False):
            jobs = size_runs(jobs, design.window, root, supervisor)
        pilot_started = time.perf_counter()
        attempts = run_jobs(jobs, design.repeats, root, supervisor)
        round_s = (time.perf_counter() - pilot_started) / max(1, design.repeats)
        # The step breakdown's intervals come from the pilot's runs; the second stage's, which the decision's
        # throughput needs, skip the compute baseline (about a second a job, outside the window, docs/benchmarks.md).
        later = [dataclasses.replace(j, cfg=dataclasses.replace(j.cfg, compute_baseline_steps=0)) for j in jobs]
        more, plan = precision.second_stage(
            root,
            design,
            lambda first, stop, arms: run_jobs(later, stop, root, supervisor, first=first, arms=arms),
            lambda: supervisor.interrupted,
            round_s,
        )
        attempts += more
        t0 = time.perf_counter()
        phases = {"checks": first_job - started, f"{len(attempts)} jobs": t0 - first_job}
        table = write_comparison(root, attempts, jobs, scaling, plan)
        lost = None if supervisor.interrupted else never_completed(root)
        if lost:
            print(lost)
        known = {"plan": plan, "command": command, "memory_limit_mb": design.memory_limit_mb}
        write_report(root, table, known, decide=not lost)
        phases["table and report"] = time.perf_counter() - t0
        print(time_line(attempts, phases, time.perf_counter() - started))
        print(root)
        if supervisor.interrupted:
            print(supervisor.closing_line(), file=sys.stderr)
            return errors.EXIT_INTERRUPTED
    return 0 if all(a.returncode == 0 for a in attempts) else 1


def size_runs(jobs: list[Job], window_s: float, root: Path, supervisor: processes.Supervisor) -> list[Job]:
    """The jobs sized to `window_s` from a probe run of the first (benchmarks.suite.sizing); says how, once."""
    from benchmarks.run import workloads
    from benchmarks.run.workloads import checks

    def run_probe(job: Job) -> Path | None:
        [attempt] = run_jobs([job], 1, root, supervisor, label="sizing")
        return root / attempt.run_id if attempt.returncode == 0 else None

    train_size: dict[int, int] = {}  # the workload is prepared once a world size, not once a job

    def data_steps(job: Job) -> int:
        if job.ranks not in train_size:
            cfg = dataclasses.replace(job.cfg, steps_per_epoch=None, epochs=1)
            train_size[job.ranks] = workloads.prepare(cfg, job.ranks).train_size
        return checks.data_steps(job.cfg, train_size[job.ranks], job.ranks)

    sized, line = sizing.size(jobs, window_s, root, run_probe, data_steps)
    print(f"  {line}", file=sys.stderr, flush=True)
    return sized


def never_completed(root: Path) -> str | None:
    """The line that comes first when a variant of the compare has no completed run (comparison.csv): a
    decision between the variants left would answer another question. None when every variant has one."""
    import pandas as pd

    rows = pd.read_csv(root / "comparison.csv")
    lost = [v for v, runs in rows.groupby("variant", sort=False) if not (runs.status == "completed").any()]
    if not lost:
        return None
    from benchmarks.analysis import rundir

    said = []
    for variant in lost:
        runs = rows[rows.variant == variant]
        meta = rundir.read_or_none(root / str(runs.run_id.iloc[0])) or {}
        said.append(f"{variant} failed in all {len(runs)} of its runs ({meta.get('error') or 'no error recorded'})")
    return (
        f"No decision: {'; '.join(said)}. Fix that and run the compare again; comparison.csv says how each run ended."
    )


def write_report(root: Path, table: str, known: dict[str, Any] | None = None, decide: bool = True) -> None:
    """The report and decision.json; print the decision (unless not `decide`), then `table`, then the Why
    lines."""
    try:
        said, why = report_and_decision([root], root, known)
    except FileNotFoundError:  # no run completed: nothing to plot
        print(table)
        print("[compare] no report: no run completed (comparison.csv says how each ended)", file=sys.stderr)
        return
    print(f"{said}\n\n{table}" if said and decide else table)
    if why:  # the report's plain-words reasons belong on the terminal too
        print(why)
    print(f"report: {root / 'report' / 'report.html'}")


def report_and_decision(
    paths: list[str], root: Path, known: dict[str, Any] | None, extra: dict[str, Any] | None = None
) -> tuple[str, str]:
    """`root`/report/ and `root`/decision.json from the runs under `paths`; the decision's words and the Why
    lines, for the terminal (`known` and `extra` as `analysis.report.write` takes them)."""
    from benchmarks.analysis import decision, report

    summary = report.write(paths, root / "report", {"md", "html"}, extra=extra, known=known)
    files.copy(root / "report" / decision.DECISION_JSON, root / decision.DECISION_JSON)
    said = summary[: summary.index("\n\n")] if "\n\n" in summary else ""  # the decision's lines come first
    why = summary[summary.index("\nWhy:\n") + 1 :] if "\nWhy:\n" in summary else ""
    return said, why


def prepare(args: argparse.Namespace, made: hosts.emulation.Cluster | None = None) -> tuple[list[Job], Path, str]:
    """Everything compare checks before it starts a process: the jobs, the compare directory, the scaling mode.
    `made` is the cluster --emulate-hosts brought up. Raises InputError (one line) on bad input."""
    check_not_overwrite(args, "compare")
    cfg, preset = effective_config(args)
    where = host_options.from_args(args, made)
    chosen = variants.parse(args.backends, args.launcher)
    sizes = variants.parse_nproc(args.nproc)
    slurm.check(chosen, sizes, where.many)
    chosen = hosts.check_hostname(chosen, where, asked=args.backends is not None)
    precision.check(args, default_two_stage=True)
    args.sized = sizing.wanted(args)
    if args.repeats < 1:
        raise InputError(f"--repeats must be a positive integer, got {args.repeats}")
    if args.global_batch is not None and args.global_batch < 1:
        raise InputError(f"--global-batch must be a positive integer, got {args.global_batch}")
    if args.global_batch is not None and args.batch_size is not None:
        raise InputError("--global-batch sets the per-rank batch (G ÷ ranks); give it or --batch-size, not both")
    buffers = equal_buffers(args, chosen)
    # Each backend gets only its own knobs, so no run warns about another backend's.
    options = {v.backend: config.from_namespace(backends.options_of(v.backend), args) for v in chosen}
    for option in options.values():
        config.check_values(option)
    knobs = {backend: config.to_argv(option) for backend, option in options.items()}
    strategies = variants.parse_strategies(cfg.val_strategy)  # a list here; each job runs one of them
    steps = variants.parse_steps(cfg)  # likewise --amp and --compile: each combination its own jobs
    jobs = jobs_for(cfg, chosen, sizes, args.global_batch, knobs, cfg.threads, strategies, hosts=where, steps=steps)
    capped = check_jobs(jobs, options)
    where.check()
    root = make_compare_dir(Path(cfg.out), cfg.run_id)
    print(describe(cfg, preset, jobs, precision.design_words(args), args.global_batch, buffers), file=sys.stderr)
    for line in capped:
        print(f"  {line}", file=sys.stderr)
    return jobs, root, STRONG if args.global_batch else WEAK


def check_jobs(
    jobs: list[Job], options: dict[str, Any] | None = None, also: dict[str, list[Any]] | None = None
) -> list[str]:
    """Every job's options, and its workload at its world size, before any process starts; with each backend's
    `options` (and the other settings of them in `also`: tune's grid points), also whether they apply to the
    workload's model (FSDP2's unit policy), in one line for all. Returns the start-up lines for what the data
    caps (an epoch shorter than --steps-per-epoch asks for) and for what a backend did once for the machine
    (DeepSpeed's op built)."""
    for job in jobs:
        validate(job.variant.backend, job.cfg)
    from benchmarks.run import fingerprint, workloads  # prepare imports torch: only past the checks that need none

    # Horovod's autotuner (given, or exported and adopted by the ranks) needs its search within the warm-up.
    exported = os.environ.get("HOROVOD_AUTOTUNE", "").strip() not in ("", "0")
    tuned = {id(j): "--autotune" in j.knobs or (exported and j.variant.backend == "horovod") for j in jobs}
    capped = []
    for job in {(j.cfg.batch_size, j.ranks, tuned[id(j)]): j for j in jobs}.values():
        ready = workloads.prepare(job.cfg, job.ranks, autotune=tuned[id(job)])
        capped += steps_capped(job, ready)
    for backend, option in (options or {}).items():  # the model is the same at every world size
        for setting in [option, *(also or {}).get(backend, [])]:
            backends.get(backend).check_model(ready.workload.build_model, setting)
    for job in jobs:  # e.g. DeepSpeed's op, built here once so no rank builds it in a job
        said = backends.get(job.variant.backend).check_run(job.cfg, (options or {}).get(job.variant.backend))
        capped += [said] if said else []
    from backends import step

    for job in {(j.cfg.amp, j.cfg.compile): j for j in jobs}.values():  # e.g. no C++ compiler for --compile
        step.check(job.cfg, job.cfg.device, ready.workload.build_model)
    cfg = jobs[0].cfg
    if ready.name.kind == "custom":  # a built-in is seeded; a user's may make data at import
        fingerprint.check_fresh_process(ready.workload, cfg.workload, cfg.seed, (cfg.train_size, cfg.val_size))
    return list(dict.fromkeys(capped))


def steps_capped(job: Job, ready: Any) -> list[str]:
    """The start-up line when the data gives an epoch fewer steps than --steps-per-epoch asks for, naming the
    option that gives more: --epochs, and --train-size where the workload's data can grow."""
    from benchmarks.run.workloads import checks

    cfg = ready.cfg
    steps = checks.data_steps(cfg, ready.train_size, job.ranks)
    if cfg.steps_per_epoch is None or steps >= cfg.steps_per_epoch or cfg.eval_only:
        return []
    grows = cfg.train_size is not None and "train_size" in catalog.defaults_for(cfg.workload)
    more = "raise --epochs or --train-size" if grows else "raise --epochs (the data set has no more samples)"
    batch = cfg.batch_size * cfg.accumulate * job.ranks
    return [
        f"the data caps an epoch at {steps} steps ({ready.train_size} training samples ÷ global batch {batch} at "
        f"{job.ranks} rank(s)), not --steps-per-epoch {cfg.steps_per_epoch}: {cfg.epochs * steps} steps in all, "
        f"{max(0, cfg.epochs * steps - cfg.warmup_steps)} timed; for more, {more}"
    ]


def command(args: argparse.Namespace) -> int:
    """`distbench compare`: 2 on bad input (one line, nothing started), 1 if a run failed, else 0."""
    started = time.perf_counter()
    try:
        with host_options.emulated(args) as made:
            jobs, root, scaling = prepare(args, made)
            return compare(jobs, args, root, scaling, started, rerun_command())
    except InputError as exc:
        errors.error(str(exc))
        return errors.EXIT_BAD_INPUT


def rerun_command() -> str:
    """This command's line without --repeats and --run-id, for the decision's advice on how many repeats would
    settle it: every option that shaped the decision (--margin, --precision, --max-repeats, ...) is kept."""
    argv = ["distbench", *sys.argv[1:]] if Path(sys.argv[0]).name in ("distbench", "cli.py") else []
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--repeats", "--run-id"):
            skip = True
        elif not arg.startswith(("--repeats=", "--run-id=")):
            kept.append(arg)
    return shlex.join(kept)
