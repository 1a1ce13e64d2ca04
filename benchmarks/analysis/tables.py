"""Statistics over loaded runs: per-run numbers, per-backend tables with intervals, scaling (printed
by `benchmarks.analysis.terminal`).

Runs are keyed by `run_key` (their directory). Throughput ratios are taken only between runs of the
same setup — workload, global batch and world size — so a table never mixes them in one ratio.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from backends import ONE_PROCESS
from benchmarks.analysis import intervals, stats
from benchmarks.analysis.agreement import Agreement, loss_agreement
from benchmarks.analysis.load import INTERRUPTED, MEMORY_COLUMNS, VALIDATION_COLUMNS, RunSet, with_strategy
from benchmarks.config import PLAIN_STEP

# loss_agreement lives in `agreement`; callers (compare, the notebook) find it here with the other tables.
__all__ = [
    "Agreement",
    "backend_labels",
    "backend_table",
    "loss_agreement",
    "per_run_stats",
    "phase_breakdown",
    "scaling",
]

SETUP = ("workload", "global_batch", "world_size", "step_config")
"""What one comparison holds fixed; `step_config` is config.step_of's words ('fp32 eager', 'bf16 compiled, clip 1')."""
MIN_TIMED_STEPS = 20
MIN_WINDOW_S = 2.0
LAUNCH = ("launcher", "controller")
RANGE_COLUMNS = (
    "peak_rss_mb_min",
    "peak_rss_mb_max",
    "training_rss_mb_max",
    "cuda_max_allocated_mb_min",
    "cuda_max_allocated_mb_max",
    "cuda_max_reserved_mb_max",
    "state_mb_min",
    "state_mb_max",
)
"""The memory columns the per-backend table carries: the range over ranks of each run, averaged over runs."""
PLAN = ("oversubscribed", "cpus", "scaling")
"""run.json's `oversubscribed` (more local ranks than cores) and `cpus`, and compare's scaling mode."""
VALIDATION_KEYS = ("val_strategy", "eval_only")
"""What a left-out run keeps of its validation: its strategy keeps it on its own row."""
NO_LOSS = {"final_train_loss": np.nan, "final_val_loss": np.nan, "final_val_accuracy": np.nan}


SHORT_RUN_FIX = (
    "throughput this short is mostly noise; time more steps (compare --window; or --epochs, --steps-per-epoch, "
    "and --train-size where the data caps an epoch and the workload's data can grow)"
)
"""What a short run's warning says to do, wherever it is said."""


def run_warning(timed_steps: float, window_s: float) -> str:
    """'' for a run long enough to time, else what is too short (such a throughput is mostly noise)."""
    short = []
    if pd.notna(timed_steps) and timed_steps < MIN_TIMED_STEPS:
        short.append(f"{int(timed_steps)} timed steps (< {MIN_TIMED_STEPS})")
    if pd.notna(window_s) and window_s < MIN_WINDOW_S:
        short.append(f"timed window {seconds(window_s, below=MIN_WINDOW_S)} s (< {MIN_WINDOW_S:g} s)")
    return "; ".join(short)


def seconds(value: float, below: float | None = None) -> str:
    """Seconds to 3 significant digits (0.00312, 1.95, 12.3), with more where fewer would print a value
    under `below` as `below` itself ("1.9996 s (< 2 s)", never "2 s (< 2 s)")."""
    for digits in range(3, 10):
        text = f"{value:.{digits}g}"
        if below is None or float(text) < below:
            return text
    return text


def _launch(run: dict) -> tuple[str, str]:
    """The run's launcher and, for Horovod, its controller (gloo or mpi): what a backend's runs must share
    to be pooled into one interval."""
    controller = run.get("knob_controller")
    if not isinstance(controller, str) and run.get("backend") == "horovod":
        controller = run.get("launcher_detail")  # older runs without the knob
    launcher, controller = run.get("launcher"), controller if isinstance(controller, str) else ""
    return (launcher if isinstance(launcher, str) else ""), controller


def _split_launchers(rows: pd.DataFrame) -> pd.Series:
    """`backend`, or `backend (launcher)` / `backend (controller)` where a backend's runs in one setup
    come from several launchers, so an interval never pools them."""
    label = rows["backend"].astype(str)
    for _, group in setups(rows):
        for backend, mine in group.groupby("backend", sort=False):
            launcher, controller = mine["launcher"].fillna(""), mine["controller"].fillna("")
            keys = launcher + "\0" + controller
            if keys.nunique() < 2:
                continue
            names = launcher + " " + controller  # what tells the launches apart, the controller first
            for field in (controller, launcher):
                if field.nunique() == keys.nunique():
                    names = field
                    break
            label[mine.index] = f"{backend} (" + names.str.strip() + ")"
    return label


def per_run_stats(rs: RunSet) -> pd.DataFrame:
    """Per run: throughput over the timed window, step percentiles (slowest rank per step), rank skew.

    Throughput is recomputed from the rows: samples of all ranks in non-warm-up steps ÷ the run's
    timed window (`timed_wall_s` in run.json, also summary.csv's `wall_s`). Runs `load_runs` left out
    come last, with their status and error and no numbers.
    """
    timing = rs.timing
    timed = timing[~timing["warmup"].astype(bool)] if len(timing) else timing
    if len(timed):
        slowest = timed.groupby(["run_key", "step"], observed=True)["step_s"].max()
        q = slowest.groupby(level="run_key", observed=True).quantile([0.5, 0.9, 0.95, 0.99]).unstack()
        steps = slowest.groupby(level="run_key", observed=True).size()
        samples = timed.groupby("run_key", observed=True)["samples"].sum()
        rank_total = (
            timed.groupby(["run_key", "rank"], observed=True)["step_s"].sum().groupby(level="run_key", observed=True)
        )
        skew = rank_total.max() / rank_total.min()
    else:
        q = pd.DataFrame(columns=[0.5, 0.9, 0.95, 0.99])
        steps, samples, skew = pd.Series(dtype=float), pd.Series(dtype=float), pd.Series(dtype=float)
    final = _final_losses(rs.loss)
    rows = []
    for run in rs.runs.to_dict("records"):
        key, wall = run["run_key"], run.get("timed_wall_s")
        has_q, n_steps = key in q.index, steps.get(key, np.nan)
        rows.append(
            {
                **{c: run.get(c) for c in ("run_key", "run_id", "backend", "variant")},
                **dict(zip(LAUNCH, _launch(run), strict=True)),
                **{c: run.get(c) for c in (*SETUP, "status", *PLAN)},
                "timed_steps": n_steps,
                "timed_wall_s": wall,
                "samples_per_s": samples.get(key, np.nan) / wall if wall and wall > 0 else np.nan,
                "step_p50_s": q.loc[key, 0.5] if has_q else np.nan,
                "step_p90_s": q.loc[key, 0.9] if has_q else np.nan,
                "step_p95_s": q.loc[key, 0.95] if has_q else np.nan,
                "step_p99_s": q.loc[key, 0.99] if has_q else np.nan,
                "rank_skew": skew.get(key, np.nan),
                **final.get(key, NO_LOSS),
                **{
                    c: run.get(c, np.nan)
                    for c in (
                        *MEMORY_COLUMNS,
                        *VALIDATION_COLUMNS,
                        "val_most_on_a_rank",
                        "state_mb_min",
                        "state_mb_max",
                    )
                },
                # An --eval-only run trains nothing timed: its empty window is no short run.
                "warning": ""
                if run.get("eval_only") is True
                else run_warning(n_steps, np.nan if wall is None else wall),
                "error": run.get("error"),
            }
        )
    for run in rs.left_out.to_dict("records"):
        launch = dict(zip(LAUNCH, _launch(run), strict=True))
        rows.append(
            {
                **{c: run.get(c) for c in ("run_key", "run_id", "backend", "variant")},
                **launch,
                **{c: run.get(c) for c in (*SETUP, "status", "error", *PLAN, *VALIDATION_KEYS)},
            }
        )
    per_run = pd.DataFrame(rows)
    if len(per_run):
        per_run["backend"] = _split_launchers(per_run)
        if "val_strategy" in per_run:  # each strategy its own row (the variant says it already)
            named = zip(per_run["backend"], per_run["val_strategy"], strict=True)
            per_run["backend"] = [with_strategy(b, s) for b, s in named]
    return per_run


def backend_labels(rows: pd.DataFrame) -> pd.Series:
    """`backend`, or `backend (launcher)` / `backend (controller)` where a backend's runs in one setup come
    from several launchers (rows need `backend`, `launcher`, `controller` and the setup columns)."""
    return _split_launchers(rows)


def _final_losses(loss: pd.DataFrame) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if not len(loss):
        return out
    for (key, split), rows in loss.groupby(["run_key", "split"], sort=False):
        last = rows.iloc[-1]
        entry = out.setdefault(key, dict(NO_LOSS))
        if split == "train":
            entry["final_train_loss"] = last["loss"]
        else:
            entry["final_val_loss"], entry["final_val_accuracy"] = last["loss"], last["accuracy"]
    return out


def setup_label(rows: pd.DataFrame, backends: dict[str, str] | None = None) -> pd.Series:
    """Backend name, plus workload and world size where the rows span several, so that figures never
    pool different setups into one bar or curve. `backends` maps run_key to the backend's name in the
    tables (`per_run_stats`'s `backend`, which names the launcher where a backend had several)."""
    label = rows["backend"].astype(str)
    if backends:
        label = rows["run_key"].astype(str).map(backends).fillna(label).astype(str)
    for column, fmt in (("workload", " {}"), ("world_size", " w{}"), ("step_config", " ({})")):
        if column in rows and rows[column].nunique() > 1:
            label = label + rows[column].map(lambda v, f=fmt: f.format(v))
    return label


def phase_breakdown(rs: RunSet, backends: dict[str, str] | None = None) -> pd.DataFrame:
    """Mean seconds per timed step in each phase, per backend (per backend and setup when runs differ),
    over completed runs. `backends` as in `setup_label`."""
    phases = ["data_s", "forward_s", "backward_s", "optimizer_s"]
    timed = completed(rs.timing)
    timed = timed[~timed["warmup"].astype(bool)] if len(timed) else timed
    if not len(timed):
        return pd.DataFrame(columns=["backend", *phases])
    by = setup_label(timed, backends).rename("backend")
    return timed[phases].groupby(by, sort=False).mean().reset_index()


def completed(rows: pd.DataFrame) -> pd.DataFrame:
    """The timing or loss rows of completed runs (`--include-failed` also loads the others)."""
    return rows[rows["status"] == "completed"] if len(rows) and "status" in rows else rows


def run_counts(per_run: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per variant (`variant`, else `backend`), in order: its runs `completed`, `failed` and `interrupted` (by a
    signal; compare's comparison.csv or `load_runs`' status), so a line counts the runs there are, never the
    runs planned."""
    if not len(per_run):
        return {}
    name = per_run["variant"].fillna(per_run["backend"]) if "variant" in per_run else per_run["backend"]
    counts: dict[str, dict[str, int]] = {}
    for variant, status in zip(name.astype(str), per_run["status"], strict=True):
        mine = counts.setdefault(variant, {"completed": 0, "failed": 0, INTERRUPTED: 0})
        mine[status if status in ("completed", INTERRUPTED) else "failed"] += 1
    return counts


def with_setup(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every SETUP column: rows from before the step options (no `step_config`) trained the plain step."""
    return frame if "step_config" in frame or not len(frame.columns) else frame.assign(step_config=PLAIN_STEP)


def setups(per_run: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """Split runs by setup (the SETUP columns present), in order of appearance.

    A row missing its setup (a run that failed before recording it) joins its backend's first setup.
    """
    keys = [c for c in SETUP if c in per_run]
    if not keys or not len(per_run):
        return [({}, per_run)]
    known = per_run[keys].notna().all(axis=1)
    setup = pd.Series([tuple(r) for r in per_run[keys].itertuples(index=False)], index=per_run.index, dtype=object)
    first_of = dict(zip(per_run.backend[known][::-1], setup[known][::-1], strict=True))
    fallback = setup[known].iloc[0] if known.any() else setup.iloc[0]
    setup[~known] = [first_of.get(b, fallback) for b in per_run.backend[~known]]
    return [(dict(zip(keys, s, strict=True)), per_run[setup.map(s.__eq__)]) for s in dict.fromkeys(setup)]


def backend_table(per_run: pd.DataFrame, plan: dict | None = None) -> pd.DataFrame:
    """Per setup and backend: geometric-mean throughput with a 95 % CI, ratio to the setup's first backend.

    Intervals are on log throughput (never a negative bound) and absent with fewer than 3 runs, which the
    `interval` column then says; a ratio's is the decision's (`intervals.interval_of`: after a second stage, from
    its `plan`). `warning` flags runs too short to time well, `error` a failed run's.
    """
    rows: list[dict] = []
    if not len(per_run):
        return pd.DataFrame(columns=["backend", "runs_ok", "runs_failed", "runs_interrupted"])
    for setup, group in setups(per_run):
        order = list(dict.fromkeys(group["backend"]))
        ok = group[group.status == "completed"]
        base_name = next((b for b in order if (ok.backend == b).any()), None)
        base = ok[ok.backend == base_name]
        for backend in order:
            mine, all_mine = ok[ok.backend == backend], group[group.backend == backend]
            # A run a signal stopped is counted apart: it says nothing about the backend (`interrupted` names one).
            stopped = all_mine[all_mine.status == INTERRUPTED]
            failures = len(all_mine) - len(mine) - len(stopped)
            row: dict = {**setup, "backend": backend, "runs_ok": len(mine), "runs_failed": failures}
            row["runs_interrupted"] = len(stopped)
            # The variant and its launch, where known: one of each per row, since launchers are never pooled.
            row.update({c: all_mine[c].iloc[0] for c in ("variant", *LAUNCH) if c in all_mine})
            if "oversubscribed" in all_mine and all_mine["oversubscribed"].fillna(False).astype(bool).any():
                cpus = all_mine["cpus"].dropna() if "cpus" in all_mine else pd.Series([], dtype=float)
                row["oversubscribed"] = oversubscribed_words(int(setup.get("world_size", 0)), cpus)
            failed = all_mine[(all_mine.status != "completed") & (all_mine.status != INTERRUPTED)]
            if len(failed) and "run_key" in failed:  # without the run's directory there is nothing to point at
                error = failed["error"].iloc[0] if "error" in failed else None
                error = error if pd.notna(error) else "no error recorded"
                row["error"] = f"{failed['run_key'].iloc[0]}/run.json: {error}"
            if len(stopped) and "run_key" in stopped:  # compare records the signal in run.json, if there is one
                said, first = stopped["error"].iloc[0] if "error" in stopped else None, stopped["run_key"].iloc[0]
                said = f"/run.json: {said}" if pd.notna(said) else ": stopped before it wrote run.json"
                row["interrupted"] = f"{first}{said}"
            if len(mine):
                mean, lo, hi = stats.log_ci(mine["samples_per_s"])
                row.update(
                    samples_per_s=mean,
                    ci_low=lo,
                    ci_high=hi,
                    interval=stats.no_interval_reason(stats.usable(mine["samples_per_s"])),
                    step_p50_s=mine["step_p50_s"].mean(),
                    step_p99_s=mine["step_p99_s"].mean(),
                    final_train_loss=mine["final_train_loss"].mean(),
                    final_val_loss=mine["final_val_loss"].mean(),
                )
                # Peak memory per rank: the smallest and the largest rank, means over runs (NaN before schema 3).
                row.update({c: mine[c].mean() for c in RANGE_COLUMNS if c in mine})
                if backend == base_name:
                    row.update(ratio=1.0, ratio_low=np.nan, ratio_high=np.nan)  # the base of the ratios
                else:
                    ratio, rlo, rhi = intervals.interval_of(mine, base, plan)  # the decision's interval
                    row.update(ratio=ratio, ratio_low=rlo, ratio_high=rhi)
                if "warning" in mine:
                    warned = mine[mine.warning.fillna("") != ""]
                    if len(warned):
                        row["warning"] = f"{len(warned)} of {len(mine)} runs short: {warned.warning.iloc[0]}"
            rows.append(row)
    return pd.DataFrame(rows)


SCALING_COLUMNS = [
    "workload",
    "variant",
    "backend",
    "scaling",
    "world_size",
    "global_batch",
    "runs",
    "samples_per_s",
    "ci_low",
    "ci_high",
    "speedup",
    "speedup_low",
    "speedup_high",
    "efficiency",
    "efficiency_low",
    "efficiency_high",
    "vs_single",
    "vs_single_low",
    "vs_single_high",
    "oversubscribed",
    "step_config",
    "note",
]


def scaling(per_run: pd.DataFrame) -> pd.DataFrame:
    """Throughput per world size of each variant, and its scaling efficiency T(n) / (n × T(1)).

    T(1) is the same variant's own 1-rank runs (`efficiency`, with `speedup` = T(n) / T(1)) and, where
    there are any, `single`'s runs of the same per-rank work (`vs_single`). A variant's runs scale
    together when they share the workload, the scaling mode and the batch of one rank at 1 rank: the
    per-rank batch in weak scaling (compare's default), the global batch in strong (`--global-batch`).
    Intervals: throughput's is the t-interval on log throughput; a ratio of two sets of runs gets a Welch
    interval on log throughput (`stats.ratio_ci`), divided by n for an efficiency; none from < 3 runs.
    `oversubscribed` marks world sizes with more ranks than cores: they measure time-slicing, not scaling.
    Empty unless some variant has completed runs of one workload at two or more world sizes.
    """
    ok = per_run[(per_run.status == "completed")] if "status" in per_run else per_run.iloc[:0]
    if not len(ok) or "samples_per_s" not in ok:
        return pd.DataFrame(columns=SCALING_COLUMNS)
    backend = ok["backend"].astype(str).str.split(" (", n=1, regex=False).str[0]
    variant = ok["variant"] if "variant" in ok else pd.Series(np.nan, index=ok.index)
    mode = ok["scaling"] if "scaling" in ok else pd.Series(np.nan, index=ok.index)
    mode = mode.where(mode.isin(["weak", "strong"]), "weak")
    # Runs outside a comparison: the backend name with its launcher split, as in the other tables.
    labelled = backend_labels(ok.assign(backend=backend, global_batch=0, world_size=0)) if "launcher" in ok else backend
    ok = ok.assign(backend=backend, variant=variant.fillna(labelled).astype(str), scaling=mode)
    # The global batch of one rank at world size 1: what the 1-rank baselines must have trained on.
    ok = ok.assign(base_batch=np.where(ok.scaling == "strong", ok.global_batch, ok.global_batch / ok.world_size))
    one = ok.backend.isin(ONE_PROCESS)
    ok = with_setup(ok)  # a step study scales each step apart
    keys = ["workload", "variant", "scaling", "base_batch", "step_config"]
    spans = ok[~one].groupby(keys, sort=False, dropna=False)["world_size"].nunique()
    if not len(spans) or spans.max() < 2:
        return pd.DataFrame(columns=SCALING_COLUMNS)
    singles = ok[one & (ok.world_size == 1)]
    rows = []
    for (workload, name, scaling_mode, base_batch, step_config), mine in ok[~one].groupby(
        keys, sort=False, dropna=False
    ):
        if mine.world_size.nunique() < 2:
            continue
        base = mine[mine.world_size == 1]["samples_per_s"]
        single = singles[
            (singles.workload == workload) & (singles.global_batch == base_batch) & (singles.step_config == step_config)
        ]["samples_per_s"]
        for world, runs in mine.groupby("world_size"):
            n, throughput = int(world), runs["samples_per_s"]
            mean, lo, hi = stats.log_ci(throughput)
            speedup, slo, shi = stats.ratio_ci(throughput, base) if len(base) else (np.nan,) * 3
            if n == 1 and len(base):  # the base against itself: 1 by definition, not an estimate
                speedup, slo, shi = 1.0, np.nan, np.nan
            vs, vlo, vhi = stats.ratio_ci(throughput, single) if len(single) else (np.nan,) * 3
            over = bool(runs["oversubscribed"].fillna(False).astype(bool).any()) if "oversubscribed" in runs else False
            notes = [] if len(base) else [f"no 1-rank {name} run to compare with"]
            if n == 1 and len(base):
                notes.append("the base")
            elif len(base) and np.isnan(slo):
                notes.append(stats.no_interval_reason(min(stats.usable(throughput), stats.usable(base))))
            if over:
                notes.append("oversubscribed: more ranks than cores, measures time-slicing, not scaling")
            rows.append(
                {
                    "workload": workload,
                    "variant": name,
                    "backend": runs.backend.iloc[0],
                    "scaling": scaling_mode,
                    "world_size": n,
                    "global_batch": runs.global_batch.iloc[0],
                    "runs": len(runs),
                    "samples_per_s": mean,
                    "ci_low": lo,
                    "ci_high": hi,
                    "speedup": speedup,
                    "speedup_low": slo,
                    "speedup_high": shi,
                    "efficiency": speedup / n,
                    "efficiency_low": slo / n,
                    "efficiency_high": shi / n,
                    "vs_single": vs / n,
                    "vs_single_low": vlo / n,
                    "vs_single_high": vhi / n,
                    "oversubscribed": over,
                    "note": "; ".join(n_ for n_ in notes if n_),
                    "step_config": step_config,
                }
            )
    return pd.DataFrame(rows, columns=SCALING_COLUMNS)


def oversubscribed_words(world_size: int, cpus: pd.Series) -> str:
    """'3 ranks on 2 cores: this measures time-slicing, not scaling' (cores from run.json `cpus`)."""
    cores = f"{int(cpus.iloc[0])} cores" if len(cpus) else "fewer cores"
    return f"{world_size} ranks on {cores}: this measures time-slicing, not scaling"
