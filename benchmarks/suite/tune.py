"""`distbench tune`: each variant at its own best communication knobs, then the comparison at those.

1. Sweep: every grid point of a variant's backend (DDP bucket size × gradient-as-bucket-view, Horovod
   fusion threshold × cycle time) in short runs (--tune-steps, --tune-repeats), interleaved; tune.csv
   holds every run and each point's geometric mean; `best` marks each variant's argmax.
2. Final: each variant at its default knobs and at its sweep best, --repeats each, interleaved. The
   best is kept only when its gain over the default has a 95 % interval above 1 (Welch, on log
   throughput); within noise, or without an interval (< 3 repeats), the default is kept. With --autotune a
   Horovod variant also runs at Horovod's autotuner (benchmarks/suite/autotuning.py), held to the same rule.
3. tuned.csv (default vs tuned per variant) and a report of the final runs at the chosen knobs.

Imported by the parser of every `distbench` process: no torch, no analysis stack at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import backends
from backends import horovod_autotune
from benchmarks import config, errors, files
from benchmarks.errors import InputError
from benchmarks.suite import autotuning, compare, comparison, host_options, hosts, options, precision, variants
from benchmarks.suite import jobs as processes
from benchmarks.suite.autotuning import AUTOTUNE
from benchmarks.suite.variants import Job, Variant

DEFAULT_GRID: dict[str, dict[str, list[Any]]] = {
    d.name: {k: list(v) for k, v in d.tune_grid.items()} for d in backends.DECLARED.values() if d.tune_grid
}
"""Each backend's own communication knobs (fields of its options dataclass), as it declares them
(backends.Declared.tune_grid); benchmarks/grids/default.toml shows them to copy."""
TUNE_STEPS = 30
TUNE_CSV, TUNED_CSV = "tune.csv", "tuned.csv"
DEFAULT_TIME = "about 9 minutes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """tune's own options; call after the run options are added (compare's preset applies, as in compare)."""
    parser.description = (
        "Sweep each variant's own communication knobs in short runs, pick each one's best by throughput, then "
        "run each variant at its default and at its best with full repeats and keep the best only when its gain "
        f"is beyond noise. With no options: {variants.DEFAULT} on compare's transformer preset, 2 ranks, "
        f"{DEFAULT_TIME} on 2 cores."
    )
    options.add_variant_options(parser, scaling=False)
    host_options.add_arguments(parser)
    parser.add_argument(
        "--grid",
        default=None,
        help="TOML file: a [ddp] and/or [horovod] table of option = [values], e.g. bucket_cap_mb = [5, 25]; "
        "its tables replace the default grid's (default: benchmarks/grids/default.toml: "
        + "; ".join(f"{b} {' × '.join(f'{k} {v}' for k, v in g.items())}" for b, g in DEFAULT_GRID.items())
        + ")",
    )
    parser.add_argument(
        "--tune-steps",
        type=int,
        default=TUNE_STEPS,
        help=f"steps of each sweep run, warm-up included (one epoch) (default: {TUNE_STEPS})",
    )
    parser.add_argument("--tune-repeats", type=int, default=1, help="repeats of each sweep point (default: 1)")
    options.add_preset_defaults(parser)


def load_grid(path: str | None) -> dict[str, dict[str, list[Any]]]:
    """The grid to sweep: the default, with each backend table of `path` replacing the default's."""
    if path is None:
        return DEFAULT_GRID
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as exc:
            raise InputError("--grid needs Python 3.11+ or `pip install tomli`") from exc
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read --grid {path}: {exc.strerror}; give a readable TOML file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--grid {path} is not valid TOML: {exc}") from exc
    grid = dict(DEFAULT_GRID)
    for backend, table in data.items():
        known = [n for n in backends.NAMES if n not in backends.ONE_PROCESS]
        if backend not in known or not isinstance(table, dict):
            raise InputError(f"--grid {path}: [{backend}] is not a backend table; use [{'] or ['.join(known)}]")
        fields = {f.name: f for f in dataclasses.fields(backends.options_of(backend))}
        checked: dict[str, list[Any]] = {}
        for key, values in table.items():
            if key not in fields:
                raise InputError(f"--grid {path}: [{backend}] has no option {key!r}; known: {', '.join(fields)}")
            values = values if isinstance(values, list) else [values]
            kind = bool if fields[key].type in ("bool", bool) else float if "float" in str(fields[key].type) else None
            if not values or (
                kind and not all(isinstance(v, (bool if kind is bool else (int, float))) for v in values)
            ):
                raise InputError(
                    f"--grid {path}: [{backend}] {key} needs a list of {kind.__name__ if kind else 'values'}"
                )
            checked[key] = [kind(v) if kind else v for v in values]
            defaults = backends.options_of(backend)()
            for value in checked[key]:  # the same rule as the command line's, before anything runs
                try:
                    config.check_values(dataclasses.replace(defaults, **{key: value}))
                except InputError as exc:
                    raise InputError(f"--grid {path}: [{backend}] {exc}") from exc
        grid[backend] = checked
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first option varying slowest."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def knob_argv(own: Any, point: dict[str, Any]) -> list[str]:
    return config.to_argv(dataclasses.replace(own, **point))


def describe_point(point: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items()) or "default"


def command(args: argparse.Namespace) -> int:
    """`distbench tune`: 2 on bad input (one line, nothing started), 1 if a run failed, else 0."""
    try:
        with host_options.emulated(args) as made:
            return tune_on(args, made)
    except InputError as exc:
        errors.error(str(exc))
        return errors.EXIT_BAD_INPUT


def tune_on(args: argparse.Namespace, made: hosts.emulation.Cluster | None) -> int:
    """`command` on the hosts the options name (`made`: the cluster --emulate-hosts brought up)."""
    started = time.perf_counter()
    try:
        options.check_not_overwrite(args, "tune")
        where = host_options.from_args(args, made)
        cfg, _ = options.effective_config(args)
        chosen = variants.parse(args.backends, args.launcher)
        nproc = variants.parse_nproc(args.nproc)
        if len(nproc) != 1:
            raise InputError("tune runs one world size: give --nproc N (a scaling study is `compare --nproc 1,2,4`)")
        precision.check(args)
        if min(args.repeats, args.tune_repeats, args.tune_steps) < 1:
            raise InputError("--repeats, --tune-repeats and --tune-steps must be positive integers")
        if cfg.eval_only:
            raise InputError(
                "tune ranks knobs by training throughput and --eval-only trains nothing; time "
                "evaluation with `distbench compare --eval-only`"
            )
        grid = load_grid(args.grid)
        sweep_cfg = dataclasses.replace(
            cfg, epochs=1, steps_per_epoch=min(cfg.steps_per_epoch or 10**9, args.tune_steps)
        )
        if sweep_cfg.steps_per_epoch <= cfg.warmup_steps:
            raise InputError(
                f"--tune-steps {args.tune_steps} leaves no timed step after --warmup-steps "
                f"{cfg.warmup_steps}; raise --tune-steps"
            )
        buffers = options.equal_buffers(args, chosen)
        own = {v.backend: config.from_namespace(backends.options_of(v.backend), args) for v in chosen}
        autotune = autotuning.plan_for(args, chosen)  # --autotune: a setting of its own, never in the sweep or default
        own = {b: dataclasses.replace(o, autotune=False) if b == "horovod" else o for b, o in own.items()}
        sweep, points, swept = [], {}, {}
        for v in chosen:
            points[v.name] = grid_points(grid.get(v.backend, {})) if v.backend not in backends.ONE_PROCESS else []
            for i, point in enumerate(points[v.name]):
                setting = dataclasses.replace(own[v.backend], **point)
                swept.setdefault(v.backend, []).append(setting)  # checked against the model with the others below
                knobs = {v.backend: config.to_argv(setting)}
                [job] = variants.jobs_for(sweep_cfg, [v], nproc, None, knobs, hosts=where)
                sweep.append(dataclasses.replace(job, run_prefix=f"{v.slug}-p{i}"))
        finals = variants.jobs_for(
            cfg, chosen, nproc, None, {b: config.to_argv(o) for b, o in own.items()}, hosts=where
        )
        autotuned = [
            autotuning.job_for(job, autotune) for job in finals if autotune and job.variant.backend == "horovod"
        ]
        said = compare.check_jobs([*sweep, *finals, *autotuned], own, swept)
        where.check()
        root = compare.make_compare_dir(
            Path(cfg.out), cfg.run_id or compare.new_compare_id().replace("compare", "tune")
        )
    except InputError as exc:
        errors.error(str(exc))
        return errors.EXIT_BAD_INPUT
    sizes = ", ".join(f"{v.name} {len(points[v.name])} points" for v in chosen)
    print(
        f"distbench tune: sweep {sizes}, {args.tune_repeats} repeat(s) of {sweep_cfg.steps_per_epoch} steps; "
        f"then default and best with {args.repeats} repeats each; {nproc[0]} ranks",
        file=sys.stderr,
    )
    if buffers:
        print(f"distbench tune: {buffers}", file=sys.stderr)
    for line in said:  # as compare's start-up lines: what the data caps, what a backend built once
        print(f"distbench tune: {line}", file=sys.stderr)
    if autotuned:
        print(
            f"distbench tune: autotune beside them, its warm-up lengthened by {autotune.steps} steps for Horovod's "
            f"autotuner to settle ({autotune.derivation()})",
            file=sys.stderr,
        )
    with processes.Supervisor(root) as supervisor:
        attempts = compare.run_jobs(sweep, args.tune_repeats, root / "sweep", supervisor, label="tune sweep")
        table = write_tune_csv(root, attempts, sweep, points)
        final: list[comparison.Attempt] = []
        if supervisor.interrupted:
            print(
                "[tune] no report: interrupted during the sweep, before any final run (tune.csv has the sweep)",
                file=sys.stderr,
            )
        else:
            best = {v.name: best_point(table, v.name, points[v.name]) for v in chosen}
            final_jobs = []
            for job in finals:
                v, point = job.variant, best[job.variant.name]
                final_jobs.append(dataclasses.replace(job, run_prefix=f"{v.slug}-default"))
                if point is not None and knob_argv(own[v.backend], point) != job.knobs:
                    final_jobs.append(
                        dataclasses.replace(job, knobs=knob_argv(own[v.backend], point), run_prefix=f"{v.slug}-best")
                    )
                final_jobs += [a for a in autotuned if a.variant == v]
            final = compare.run_jobs(final_jobs, args.repeats, root / "final", supervisor, label="tune final")
            more, plan = precision.second_stage(
                root / "final",
                args,
                lambda first, stop, arms: compare.run_jobs(
                    final_jobs, stop, root / "final", supervisor, "tune final", first, arms
                ),
                lambda: supervisor.interrupted,
            )
            final += more
            if final:
                print(finish(root, final, final_jobs, best, chosen, plan, args.memory_limit_mb))
        print(f"time: {time.perf_counter() - started:.1f} s wall; {len(attempts)} sweep runs, {len(final)} final runs")
        print(root)
        if supervisor.interrupted:
            print(supervisor.closing_line(), file=sys.stderr)
            return errors.EXIT_INTERRUPTED
    return 0 if all(a.returncode == 0 for a in [*attempts, *final]) else 1


def write_tune_csv(root: Path, attempts: list[comparison.Attempt], jobs: list[Job], points: dict[str, list]) -> Any:
    """tune.csv: one row per sweep run with its point's knobs, and the point's geometric mean and CI."""
    import pandas as pd

    from benchmarks.analysis import stats

    full, _ = comparison.comparison_frame(root / "sweep", attempts, jobs, comparison.WEAK)
    prefix = {j.run_prefix: (j.variant, int(j.run_prefix.rsplit("-p", 1)[1])) for j in jobs}
    rows = []
    for row in full.to_dict("records"):
        variant, index = prefix[row["run_id"].rsplit("-r", 1)[0]]
        point = points[variant.name][index]
        facts = {c: row.get(c) for c in ("repeat", "run_id", "status", "samples_per_s", "timed_wall_s")}
        rows.append(
            {
                "variant": variant.name,
                "backend": variant.backend,
                "point_index": index,
                "point": describe_point(point),
                **point,
                **facts,
            }
        )
    columns = ["variant", "backend", "point_index", "point", "repeat", "run_id", "status", "samples_per_s"]
    table = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)  # none: interrupted before the first
    ok = table.samples_per_s.where(table.status == "completed")
    for _, group in ok.groupby([table.variant, table.point], sort=False):
        mean, lo, hi = stats.log_ci(group.dropna())
        table.loc[group.index, ["point_samples_per_s", "point_ci_low", "point_ci_high"]] = [mean, lo, hi]
    table["best"] = False
    for _, group in table.groupby("variant", sort=False):
        if group.point_samples_per_s.notna().any():
            top = group.point_samples_per_s.max()
            table.loc[group.index, "best"] = group.point_samples_per_s == top
    files.write_csv(table, root / TUNE_CSV, index=False)
    return table


def best_point(table: Any, variant: str, points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The knobs of the variant's best sweep point (tune.csv's argmax), None when none completed."""
    rows = table[(table.variant == variant) & table.best] if len(table) else table
    return points[int(rows.point_index.iloc[0])] if len(rows) else None


def keep_or_default(
    tuned: Any, default: Any, point: dict[str, Any] | None, pilot: int | None = None
) -> tuple[str, str, tuple[float, float, float]]:
    """`best` or `default`, why, and the gain (best ÷ default throughput with the decision's 95 % interval,
    `intervals.interval_of`: two-stage after a second stage from `pilot`, else Welch) from the final runs (rows
    with run_id, samples_per_s and their timed steps). The best is kept only when the whole interval lies above
    1: an interval that includes 1 (within noise) or none at all (< 3 runs of each) keeps the default."""
    from benchmarks.analysis import intervals, stats

    nan = float("nan")
    if not len(tuned):
        return "default", "no knobs to tune" if point is None else "the default is the sweep's best", (1.0, nan, nan)
    gain, lo, hi = intervals.interval_of(tuned, default, pilot)
    if not lo == lo:  # NaN: fewer than 3 runs of each
        return "default", f"{stats.no_interval_reason(min(len(tuned), len(default)))}: default kept", (gain, lo, hi)
    d = stats.interval_digits(lo, hi)
    if lo > 1.0:
        return "best", f"gain {gain:.{d}f}× ({lo:.{d}f}–{hi:.{d}f}) beyond noise", (gain, lo, hi)
    return "default", f"gain {gain:.{d}f}× ({lo:.{d}f}–{hi:.{d}f}) within noise: default kept", (gain, lo, hi)


def autotune_row(
    root: Path, v: Variant, mine: Any, default: Any, grid_gain: float | None, pilot: int | None
) -> dict[str, Any]:
    """tuned.csv's autotune row of a variant: its gain over the default by the same keep rule as the grid's best,
    what the autotuner settled on (each run's run.json knobs.autotuned: distinct ones joined by |), and `beyond`:
    whether it is kept, i.e. beyond noise and above the grid best's gain where that is kept (`grid_gain`)."""
    from benchmarks.analysis import stats

    auto = mine[mine.setting == AUTOTUNE]
    settled = dict.fromkeys(horovod_autotune.summary(autotuning.settled_of(root / "final" / r)) for r in auto.run_id)
    nan = float("nan")
    if not len(auto):
        verdict, why, (gain, lo, hi) = "default", "runs all failed (see final/comparison.csv)", (nan,) * 3
    elif not len(default):
        verdict, why, (gain, lo, hi) = "default", "not compared: no default run", (nan,) * 3
    else:
        verdict, why, (gain, lo, hi) = keep_or_default(auto, default, {AUTOTUNE: True}, pilot)
    beyond = verdict == "best" and (grid_gain is None or gain > grid_gain)
    return {
        "variant": v.name,
        "backend": v.backend,
        "best": f"{AUTOTUNE}: {' | '.join(settled) or '—'}",
        "default_samples_per_s": stats.log_ci(default.samples_per_s)[0],
        "tuned_samples_per_s": stats.log_ci(auto.samples_per_s)[0],
        "gain": gain,
        "gain_low": lo,
        "gain_high": hi,
        "why": f"{AUTOTUNE} {why.split(': ')[0].removeprefix('gain ')}",
        "beyond": beyond,
    }


def finish(
    root: Path,
    attempts: list[comparison.Attempt],
    jobs: list[Job],
    best: dict,
    chosen: list[Variant],
    plan: dict[str, Any],
    memory_limit_mb: float | None = None,
) -> str:
    """tuned.csv (default vs best per variant, the gain with its CI, what was kept and why), the report and
    decision of the final runs at the kept knobs (`plan`: the final stage's precision or two-stage plan);
    returns the terminal text, the decision first."""
    import pandas as pd

    from benchmarks.analysis import load, stats, tables, terminal

    full, _ = comparison.comparison_frame(root / "final", attempts, jobs, comparison.WEAK)
    full = full.assign(setting=full.run_id.str.rsplit("-", n=2).str[-2])  # <slug>-default-rN / <slug>-best-rN
    files.write_csv(
        full.reindex(columns=[*comparison.COMPARISON_COLUMNS, "setting"]),
        root / "final" / "comparison.csv",
        index=False,
    )
    rows, kept, knobs = [], [], {}
    for v in chosen:
        mine = full[(full.variant == v.name) & (full.status == "completed")]
        default, tuned = mine[mine.setting == "default"], mine[mine.setting == "best"]
        point = best.get(v.name)
        planned = set(full[full.variant == v.name].setting)
        failed = sorted(s for s in planned - {AUTOTUNE} if not (mine.setting == s).any())  # all its runs failed
        if failed:
            gain, lo, hi = float("nan"), float("nan"), float("nan")
            keep = next(iter(planned - set(failed)), "none")
            why = f"every {' and '.join(failed)} run failed (see final/comparison.csv): {keep} kept, no gain measured"
        else:
            keep, why, (gain, lo, hi) = keep_or_default(tuned, default, point, plan.get("pilot"))
        rows.append(
            {
                "variant": v.name,
                "backend": v.backend,
                "best": describe_point(point or {}),
                "default_samples_per_s": stats.log_ci(default.samples_per_s)[0],
                "tuned_samples_per_s": stats.log_ci(tuned.samples_per_s)[0],
                "gain": gain,
                "gain_low": lo,
                "gain_high": hi,
                "kept": keep,
                "why": why,
            }
        )
        if AUTOTUNE in planned:  # kept when beyond noise and ahead of a kept grid best; one sentence, both rows
            row = autotune_row(root, v, mine, default, gain if keep == "best" else None, plan.get("pilot"))
            keep = AUTOTUNE if row.pop("beyond") else keep
            grid = why.split(": ")[0]
            grid = f"grid best {grid.removeprefix('gain ')}" if grid.startswith("gain ") else f"grid: {grid}"
            said = f"{grid}; {row['why']}: {keep} kept"
            rows[-1]["kept"], rows[-1]["why"], row["kept"], row["why"] = keep, said, keep, said
            rows.append(row)
        kept += [str(root / "final" / r) for r in mine[mine.setting == keep].run_id]
        if keep == "best" and point:
            knobs[v.name] = point
        elif keep == AUTOTUNE:
            knobs[v.name] = {"autotune": "on"}
    tuned_table = pd.DataFrame(rows)
    files.write_csv(tuned_table, root / TUNED_CSV, index=False)
    how = "two-stage" if plan.get("pilot") else "Welch"
    text = f"default vs tuned (gain: {how} 95% CI on log throughput; the best is kept only when the CI is above 1):\n"
    text += terminal.format_tuned(tuned_table)
    if kept:
        at_kept = load.load_runs(*kept, include_failed=True)
        per_run = tables.per_run_stats(at_kept)
        text += "\n\nat the kept knobs:\n" + terminal.format_table(
            tables.backend_table(per_run, plan.get("pilot")), tables.loss_agreement(at_kept)
        )
        extra = {"Default vs tuned (distbench tune)": tuned_table}
        known = {"plan": plan, "knobs": knobs, "command": compare.rerun_command(), "memory_limit_mb": memory_limit_mb}
        said, _ = compare.report_and_decision(kept, root, known, extra)
        text = f"{said}\n\n{text}" if said else text
        text += f"\nreport: {root / 'report' / 'report.html'}"
    return text
