"""Statistics over loaded runs: per-run numbers, per-backend tables with intervals, scaling, the
terminal table.

Runs are keyed by `run_key` (their directory). Throughput ratios are taken only between runs of the
same setup — workload, global batch and world size — so a table never mixes them in one ratio.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.analysis import stats
from benchmarks.analysis.agreement import Agreement, loss_agreement, setup_words
from benchmarks.analysis.load import RunSet

# loss_agreement lives in `agreement`; callers (compare, the notebook) find it here with the other tables.
__all__ = [
    "Agreement", "backend_table", "format_table", "loss_agreement", "per_run_stats", "phase_breakdown", "scaling",
]  # fmt: skip

SETUP = ("workload", "global_batch", "world_size")
MIN_TIMED_STEPS = 20
MIN_WINDOW_S = 2.0
LAUNCH = ("launcher", "controller")
NO_LOSS = {"final_train_loss": np.nan, "final_val_loss": np.nan, "final_val_accuracy": np.nan}


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
        rows.append({
            **{c: run.get(c) for c in ("run_key", "run_id", "backend")}, **dict(zip(LAUNCH, _launch(run), strict=True)),
            **{c: run.get(c) for c in (*SETUP, "status")},
            "timed_steps": n_steps, "timed_wall_s": wall,
            "samples_per_s": samples.get(key, np.nan) / wall if wall and wall > 0 else np.nan,
            "step_p50_s": q.loc[key, 0.5] if has_q else np.nan, "step_p90_s": q.loc[key, 0.9] if has_q else np.nan,
            "step_p95_s": q.loc[key, 0.95] if has_q else np.nan, "step_p99_s": q.loc[key, 0.99] if has_q else np.nan,
            "rank_skew": skew.get(key, np.nan), **final.get(key, NO_LOSS),
            "warning": run_warning(n_steps, wall if wall is not None else np.nan), "error": run.get("error"),
        })  # fmt: skip
    for run in rs.left_out.to_dict("records"):
        launch = dict(zip(LAUNCH, _launch(run), strict=True))
        rows.append({**{c: run.get(c) for c in ("run_key", "run_id", "backend")}, **launch,
                     **{c: run.get(c) for c in (*SETUP, "status", "error")}})  # fmt: skip
    per_run = pd.DataFrame(rows)
    if len(per_run):
        per_run["backend"] = _split_launchers(per_run)
    return per_run


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
    for column, fmt in (("workload", " {}"), ("world_size", " w{}")):
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


def backend_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per setup and backend: geometric-mean throughput with a 95 % CI, ratio to the setup's first backend.

    Intervals are on log throughput (never a negative bound) and absent with fewer than 3 runs; the
    `interval` column then says why. `warning` flags runs too short to time well, `error` a failed run's.
    """
    rows: list[dict] = []
    if not len(per_run):
        return pd.DataFrame(columns=["backend", "runs_ok", "runs_failed"])
    for setup, group in setups(per_run):
        order = list(dict.fromkeys(group["backend"]))
        ok = group[group.status == "completed"]
        base_name = next((b for b in order if (ok.backend == b).any()), None)
        base = ok[ok.backend == base_name]["samples_per_s"]
        for backend in order:
            mine, all_mine = ok[ok.backend == backend], group[group.backend == backend]
            row: dict = {**setup, "backend": backend, "runs_ok": len(mine), "runs_failed": len(all_mine) - len(mine)}
            failed = all_mine[all_mine.status != "completed"]
            if len(failed) and "run_key" in failed:  # without the run's directory there is nothing to point at
                error = failed["error"].iloc[0] if "error" in failed else None
                error = error if pd.notna(error) else "no error recorded"
                row["error"] = f"{failed['run_key'].iloc[0]}/run.json: {error}"
            if len(mine):
                mean, lo, hi = stats.log_ci(mine["samples_per_s"])
                row.update(
                    samples_per_s=mean, ci_low=lo, ci_high=hi,
                    interval=stats.no_interval_reason(stats.usable(mine["samples_per_s"])),
                    step_p50_s=mine["step_p50_s"].mean(), step_p99_s=mine["step_p99_s"].mean(),
                    final_train_loss=mine["final_train_loss"].mean(), final_val_loss=mine["final_val_loss"].mean(),
                )  # fmt: skip
                if backend == base_name:
                    row.update(ratio=1.0, ratio_low=np.nan, ratio_high=np.nan)  # the base of the ratios
                else:
                    ratio, rlo, rhi = stats.ratio_ci(mine["samples_per_s"], base)
                    row.update(ratio=ratio, ratio_low=rlo, ratio_high=rhi)
                if "warning" in mine:
                    warned = mine[mine.warning.fillna("") != ""]
                    if len(warned):
                        row["warning"] = f"{len(warned)} of {len(mine)} runs short: {warned.warning.iloc[0]}"
            rows.append(row)
    return pd.DataFrame(rows)


def scaling(per_run: pd.DataFrame) -> pd.DataFrame:
    """Speed-up and efficiency of each backend against its own 1-rank runs, per world size.

    `single` is its own backend, so it is its own row, never a baseline for the others; a backend
    without 1-rank runs gets no speed-up (`note` says so). A backend run under several launchers gets
    a row per launcher, each against its own 1-rank runs. Empty (no rows, no note) unless some backend
    has completed runs of one workload at two or more world sizes.
    """
    columns = ["workload", "backend", "world_size", "runs", "samples_per_s", "speedup", "speedup_low",
               "speedup_high", "efficiency", "note"]  # fmt: skip
    ok = per_run[per_run.status == "completed"]
    if not len(ok):
        return pd.DataFrame(columns=columns)
    # per_run names a launcher per setup; across world sizes a backend's launchers are told apart again.
    name = ok["backend"].astype(str).str.split(" (", n=1, regex=False).str[0]
    if all(c in ok for c in LAUNCH):
        name = _split_launchers(ok.assign(backend=name, global_batch=0, world_size=0))
    ok = ok.assign(backend=name)
    if ok.groupby(["workload", "backend"], dropna=False)["world_size"].nunique().max() < 2:
        return pd.DataFrame(columns=columns)
    rows = []
    for (workload, backend), mine in ok.groupby(["workload", "backend"], sort=False, dropna=False):
        base = mine[mine.world_size == 1]["samples_per_s"]
        for world, runs in mine.groupby("world_size"):
            speedup, lo, hi = stats.ratio_ci(runs["samples_per_s"], base) if len(base) else (np.nan,) * 3
            note = "" if len(base) else f"no 1-rank {backend} run to compare with"
            if len(base) and np.isnan(lo):
                note = stats.no_interval_reason(min(len(runs), len(base)))
            rows.append({
                "workload": workload, "backend": backend, "world_size": int(world), "runs": len(runs),
                "samples_per_s": stats.log_ci(runs["samples_per_s"])[0], "speedup": speedup, "speedup_low": lo,
                "speedup_high": hi, "efficiency": speedup / world, "note": note,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def _interval(value: float, lo: float, hi: float, n: int | None, base: bool = False) -> str:
    if pd.isna(value):
        return "-"
    if base:
        return f"{value:.2f} (base)"
    digits = 1 if n is not None else 2
    if pd.isna(lo):
        return f"{value:.{digits}f} (no CI: n<{stats.MIN_RUNS})"
    return f"{value:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def format_table(table: pd.DataFrame, agreement: Agreement | float) -> str:
    """The terminal table `compare` and `report` print: one block per setup, then what to read into it."""
    width = max([10, *(len(str(b)) for b in table.get("backend", []))])  # `ddp (torchrun)` is longer than 10
    header = (
        f"{'backend':<{width}} {'ok/fail':>7} {'samples/s (95% CI)':>26} {'ratio (95% CI)':>24} "
        f"{'p50 step':>9} {'p99 step':>9} {'train loss':>10} {'val loss':>9}"
    )
    lines, verdicts, warnings = [], [], []
    blocks = setups(table)
    for setup, group in blocks:
        if setup:
            lines.append(setup_words(setup))
        where = f"{setup_words(setup)}: " if len(blocks) > 1 else ""  # which block a line below is about
        lines.append(header)
        base = None
        for row in group.to_dict("records"):
            okfail = f"{row['runs_ok']}/{row['runs_failed']}"
            if not row["runs_ok"]:
                where = row.get("error") if isinstance(row.get("error"), str) else "see the run's run.json"
                lines.append(f"{row['backend']:<{width}} {okfail:>7}   FAILED: {where}")
                continue
            is_base = base is None
            base = base or row["backend"]
            sps = _interval(row["samples_per_s"], row["ci_low"], row["ci_high"], row["runs_ok"])
            ratio = _interval(row.get("ratio", np.nan), row.get("ratio_low"), row.get("ratio_high"), None, is_base)
            lines.append(
                f"{row['backend']:<{width}} {okfail:>7} {sps:>26} {ratio:>24} {row['step_p50_s']:>9.4f} "
                f"{row['step_p99_s']:>9.4f} {row['final_train_loss']:>10.4f} {row['final_val_loss']:>9.4f}"
            )
            if not is_base:
                verdict = stats.verdict(row["backend"], base, row["ratio"], row["ratio_low"], row["ratio_high"])
                verdicts.append(where + verdict)
            if isinstance(row.get("warning"), str) and row["warning"]:
                warnings.append(f"warning: {where}{row['backend']}: {row['warning']}: throughput this short is mostly "
                                "noise; time more steps (--steps-per-epoch, --epochs)")  # fmt: skip
            if row["runs_failed"] and isinstance(row.get("error"), str):
                warnings.append(f"{where}{row['backend']}: {row['runs_failed']} run(s) failed: {row['error']}")
    if not isinstance(agreement, Agreement):
        agreement = Agreement(train=float(agreement))
    lines += [*agreement.lines(), *verdicts, *warnings]
    lines.append(
        "samples/s: geometric mean over runs, 95% CI on log throughput; ratio: Welch 95% CI on log throughput; "
        f"no CI from < {stats.MIN_RUNS} runs. p50/p99 step (slowest rank, s) and final losses: means over runs, "
        "descriptive, no interval."
    )
    return "\n".join(lines)
