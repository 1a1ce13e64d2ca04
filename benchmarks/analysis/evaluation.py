"""The report's Distributed validation: what each --val-strategy costs and what it gets wrong.

Per workload, variant (its strategy part of it: `ddp@torchrun (val sampler)`), world size and whether the
runs were `--eval-only`: the validation's time (each run's `val_s`, the slowest rank's median) as a
geometric mean over runs with its interval, the throughput over the whole set, the speed-up over 1 rank,
what the sharding allows at best (the set ÷ the most samples one rank evaluates: W for `exact` and
`sampler`, 1 for `replicated` and `rank0`, whatever the clock says), the samples evaluated in all and the
duplicates among them, and the loss difference from the exact loss of the same model (`loss.csv`
`val_exact_loss`, from the same pass: 0 for `exact` by construction).

The speed-up's base is the same variant's 1-rank runs of the same strategy; failing those, its 1-rank
runs of any strategy (at one rank every strategy evaluates the whole set once, the same work); failing
those, `single`'s runs; `speedup_base` says which. Intervals as everywhere (stats): Student-t on log time,
Welch on log throughput for a ratio of two sets of runs, none from fewer than 3 runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from backends import ONE_PROCESS
from benchmarks.analysis import figures, stats, terminal

COLUMNS = [
    "workload",
    "variant",
    "val_strategy",
    "eval_only",
    "world_size",
    "val_size",
    "runs",
    "val_s",
    "val_s_low",
    "val_s_high",
    "val_samples_per_s",
    "val_ci_low",
    "val_ci_high",
    "speedup",
    "speedup_low",
    "speedup_high",
    "efficiency",
    "efficiency_low",
    "efficiency_high",
    "speedup_base",
    "speedup_bound",
    "most_on_a_rank",
    "val_samples",
    "val_duplicates",
    "loss_difference",
    "exact_loss",
    "oversubscribed",
    "note",
]
KEYS = ["workload", "eval_only", "val_size", "variant"]


def plain_variant(variant: object) -> str:
    """`ddp@torchrun (val sampler)` → `ddp@torchrun`: the variant without its strategy."""
    return str(variant).split(" (val ", 1)[0]


def eval_only(per_run: pd.DataFrame) -> pd.Series:
    """Which rows are `--eval-only` runs (False for runs from before the option)."""
    if "eval_only" not in per_run:
        return pd.Series(False, index=per_run.index)
    return per_run["eval_only"].map(lambda v: v is True or str(v) == "True")


def _timed(per_run: pd.DataFrame) -> pd.DataFrame:
    """Completed runs whose validations were timed (schema 4), with the set's size and the plain variant."""
    if "val_s" not in per_run or "status" not in per_run:
        return per_run.iloc[:0]
    ok = per_run[(per_run.status == "completed") & pd.to_numeric(per_run.val_s, errors="coerce").gt(0)].copy()
    ok["val_size"] = ok.val_samples - ok.val_duplicates
    ok["eval_only"] = eval_only(ok)
    ok["variant"] = ok["variant"].fillna(ok["backend"]).astype(str)
    ok["plain"] = ok["variant"].map(plain_variant)
    return ok


def _base(ok: pd.DataFrame, workload: str, eval_only: bool, size: float, variant: str) -> tuple[pd.Series, str]:
    """The 1-rank throughputs the speed-up of `variant` is taken against, and which runs they are."""
    same = ok[(ok.workload == workload) & (ok.eval_only == eval_only) & (ok.val_size == size) & (ok.world_size == 1)]
    for rows, words in (
        (same[same.variant == variant], "its own 1-rank runs"),
        (same[same.plain == plain_variant(variant)], "its 1-rank runs of another strategy"),
        (same[same.backend.astype(str).str.split(" (", n=1, regex=False).str[0].isin(ONE_PROCESS)], "single"),
    ):
        if len(rows):
            return rows["val_samples_per_s"], words
    return pd.Series([], dtype=float), ""


def validation_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """One row per workload, --eval-only or not, variant (with its strategy) and world size (see above)."""
    ok = _timed(per_run)
    if not len(ok):
        return pd.DataFrame(columns=COLUMNS)
    if "step_config" in ok and ok["step_config"].nunique() > 1:  # a step study: each step's validation apart
        ok = ok.assign(variant=ok["variant"].astype(str) + " (" + ok["step_config"].astype(str) + ")")
    rows = []
    for (workload, eval_only, size, variant), mine in ok.groupby(KEYS, sort=False):
        base, base_words = _base(ok, workload, eval_only, size, variant)
        for world, runs in mine.groupby("world_size"):
            n = int(world)
            val_s, lo, hi = stats.log_ci(runs.val_s)
            sps, slo, shi = stats.log_ci(runs.val_samples_per_s)
            speedup, plo, phi = stats.ratio_ci(runs.val_samples_per_s, base) if len(base) else (np.nan,) * 3
            notes = [] if len(base) else ["no 1-rank run to compare with"]
            if n == 1 and base_words == "its own 1-rank runs":  # the base against itself: 1 by definition
                speedup, plo, phi = 1.0, np.nan, np.nan
                notes.append("the base")
            elif len(base) and np.isnan(plo):
                notes.append(stats.no_interval_reason(min(stats.usable(runs.val_samples_per_s), stats.usable(base))))
            over = bool(runs["oversubscribed"].fillna(False).astype(bool).any()) if "oversubscribed" in runs else False
            if over:
                notes.append("oversubscribed: more ranks than cores, measures time-slicing, not scaling")
            most = runs["val_most_on_a_rank"].max() if "val_most_on_a_rank" in runs else np.nan
            rows.append(
                {
                    "workload": workload,
                    "variant": variant,
                    "val_strategy": runs.val_strategy.iloc[0],
                    "eval_only": eval_only,
                    "world_size": n,
                    "val_size": int(size),
                    "runs": len(runs),
                    "val_s": val_s,
                    "val_s_low": lo,
                    "val_s_high": hi,
                    "val_samples_per_s": sps,
                    "val_ci_low": slo,
                    "val_ci_high": shi,
                    "speedup": speedup,
                    "speedup_low": plo,
                    "speedup_high": phi,
                    "efficiency": speedup / n,
                    "efficiency_low": plo / n,
                    "efficiency_high": phi / n,
                    "speedup_base": base_words,
                    "speedup_bound": size / most if most and most == most else np.nan,
                    "most_on_a_rank": most,
                    "val_samples": runs.val_samples.iloc[0],
                    "val_duplicates": runs.val_duplicates.iloc[0],
                    "loss_difference": (runs.final_val_loss - runs.final_val_exact_loss).mean(),
                    "exact_loss": runs.final_val_exact_loss.mean(),
                    "oversubscribed": over,
                    "note": "; ".join(n_ for n_ in notes if n_),
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def eval_scaling(scale: pd.DataFrame, per_run: pd.DataFrame) -> pd.DataFrame:
    """The scaling table with evaluation beside training: per row, the validation's throughput over the set
    with its interval, and its speed-up and efficiency against the variant's own 1-rank runs, with intervals
    (`val_samples_per_s`, `val_speedup`, `val_efficiency`, each with `_low`/`_high`)."""
    table = validation_table(per_run)
    added = [
        "val_samples_per_s",
        "val_ci_low",
        "val_ci_high",
        "val_speedup",
        "val_speedup_low",
        "val_speedup_high",
        "val_efficiency",
        "val_efficiency_low",
        "val_efficiency_high",
    ]
    if not len(scale):
        return scale
    if not len(table):
        return scale.assign(**dict.fromkeys(added, np.nan))
    # The scaling table's variants are launchers' names, its strategy included (load.with_strategy).
    mine = table.assign(
        val_speedup=table.speedup,
        val_speedup_low=table.speedup_low,
        val_speedup_high=table.speedup_high,
        val_efficiency=table.efficiency,
        val_efficiency_low=table.efficiency_low,
        val_efficiency_high=table.efficiency_high,
    )
    mine = mine[mine.speedup_base.isin(["its own 1-rank runs", ""])]  # an efficiency only against itself
    mine = mine.drop_duplicates(["workload", "variant", "world_size"])
    joined = scale.merge(
        mine[["workload", "variant", "world_size", *added]], how="left", on=["workload", "variant", "world_size"]
    )
    return joined


def format_validation(table: pd.DataFrame) -> str:
    """The Distributed validation lines for the terminal: per row the time, the speed-up, what the
    sharding allows at best, samples and duplicates, and the loss's difference from the exact loss."""
    width = max([12, *(len(str(v)) for v in table.variant)])
    lines = [
        "distributed validation (time: slowest rank, geometric mean over runs; speed-up over 1 rank; "
        "at best: the set ÷ the most samples on one rank):",
        f"{'variant':<{width}} {'ranks':>5} {'val s (95% CI)':>26} {'speed-up (95% CI)':>22} {'at best':>7} "
        f"{'samples (dup.)':>16} {'loss − exact':>12}",
    ]
    for row in table.to_dict("records"):
        time = terminal.interval(row["val_s"], row["val_s_low"], row["val_s_high"], ".4g")
        speedup = terminal.interval(row["speedup"], row["speedup_low"], row["speedup_high"], ".2g")
        if str(row["note"]).startswith("the base"):
            speedup = "1 (base)"
        samples = f"{int(row['val_samples'])} ({int(row['val_duplicates'])})"
        bound = "-" if pd.isna(row["speedup_bound"]) else f"{row['speedup_bound']:.2f}"
        mark = ("  eval-only" if row["eval_only"] else "") + ("  oversubscribed" if row["oversubscribed"] else "")
        lines.append(
            f"{row['variant']:<{width}} {row['world_size']:>5} {time:>26} {speedup:>22} {bound:>7} "
            f"{samples:>16} {row['loss_difference']:>12.3g}{mark}"
        )
    return "\n".join(lines)


def scaling_figure(table: pd.DataFrame, path: Path) -> Path | None:
    """eval_scaling.png: evaluation throughput over the set against ranks (left) and its efficiency against
    the 1-rank base (right), per variant and strategy with 95 % intervals where there are any; None unless
    some variant was validated at two or more world sizes."""
    if not len(table):
        return None
    curves = [(key, rows.sort_values("world_size")) for key, rows in table.groupby(KEYS, sort=False)]
    curves = [(key, rows) for key, rows in curves if rows.world_size.nunique() > 1]
    if not curves:
        return None
    fig, (left, right) = figures.plt.subplots(1, 2, figsize=(10, 3.8))
    for i, ((workload, only, _, variant), rows) in enumerate(curves):
        label = f"{variant}{' eval-only' if only else ''}" + (f" {workload}" if table.workload.nunique() > 1 else "")
        for ax, column, low, high in (
            (left, "val_samples_per_s", "val_ci_low", "val_ci_high"),
            (right, "efficiency", "efficiency_low", "efficiency_high"),
        ):
            err = [(rows[column] - rows[low]).fillna(0).clip(lower=0), (rows[high] - rows[column]).fillna(0)]
            ax.errorbar(rows.world_size, rows[column], yerr=err, fmt="-o", color=f"C{i % 10}", capsize=4, label=label)
    for ax in (left, right):
        ax.set_xticks(sorted(int(w) for w in table.world_size.unique()))
        ax.set_xlabel("world size (ranks)")
    right.axhline(1.0, color="grey", linewidth=0.8)
    left.set_ylabel("validation samples/s over the set")
    right.set_ylabel("evaluation efficiency S(n) / n")
    left.set_title("Evaluation throughput vs ranks")
    right.set_title("Evaluation scaling efficiency")
    left.legend(fontsize=7)
    return figures.save(fig, path)
