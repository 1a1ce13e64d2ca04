"""What the terminal and report.md print of the tables: the per-backend block, the scaling lines, the
intervals in words and pipe tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.analysis import stats
from benchmarks.analysis.agreement import Agreement, setup_words
from benchmarks.analysis.tables import SHORT_RUN_FIX, setups


def interval(value: float, lo: float, hi: float, spec: str, base: bool = False) -> str:
    """'1.23 (1.10–1.37)' in format `spec` (".1f", ".4g"); "(base)" for the base a ratio is against, and why
    there is no interval where there is none."""
    if pd.isna(value):
        return "-"
    if base:
        return f"{value:.2f} (base)"
    if pd.isna(lo):
        return f"{value:{spec}} (no CI: n<{stats.MIN_RUNS})"
    return f"{value:{spec}} ({lo:{spec}}–{hi:{spec}})"


AUTOTUNED = "autotune:"
"""How tuned.csv's `best` starts on an autotune row (tune.autotune_row)."""


def format_tuned(table: pd.DataFrame) -> str:
    """tune's tuned.csv for a terminal: a line per setting tried (its gain over the default with the keep
    rule's interval, what was kept), then each variant's reason and what Horovod's autotuner settled on,
    on lines of their own (an autotuned run's settings are longer than a table's column)."""
    autotuned = table.best.astype(str).str.startswith(AUTOTUNED)
    slim = pd.DataFrame(
        {
            "variant": table.variant,
            "tried": table.best.where(~autotuned, "autotune"),
            "gain (95% CI)": [
                "-" if pd.isna(lo) else interval(gain, lo, hi, ".2f")
                for gain, lo, hi in zip(table.gain, table.gain_low, table.gain_high, strict=True)
            ],
            "kept": table.kept,
        }
    )
    lines = [slim.to_string(index=False)]
    lines += [f"  {variant}: {why}" for variant, why in dict.fromkeys(zip(table.variant, table.why, strict=True))]
    for variant, best in zip(table.variant[autotuned], table.best[autotuned], strict=True):
        settled = best.removeprefix(AUTOTUNED).strip().split(" | ")
        lines += [f"  {variant} autotune settled on: {one}" for one in settled]
    return "\n".join(lines)


def memory_range(row: dict) -> str:
    """Peak memory per rank, smallest–largest rank, in MB: CUDA's allocated peak on GPU, else the RSS peak."""
    for low, high in (
        ("cuda_max_allocated_mb_min", "cuda_max_allocated_mb_max"),
        ("peak_rss_mb_min", "peak_rss_mb_max"),
    ):
        if pd.notna(row.get(low)) and pd.notna(row.get(high)):
            return f"{row[low]:.0f}" if round(row[low]) == round(row[high]) else f"{row[low]:.0f}–{row[high]:.0f}"
    return "-"


def format_scaling(table: pd.DataFrame) -> str:
    """The scaling table for the terminal: throughput and efficiency per variant and world size."""
    width = max([10, *(len(str(v)) for v in table.variant)])
    lines = [
        "scaling (efficiency = T(n) / (n × T(1)), against the variant's own 1-rank runs and against single):",
        f"{'variant':<{width}} {'ranks':>5} {'samples/s (95% CI)':>26} {'efficiency (95% CI)':>22} "
        f"{'vs single (95% CI)':>22}",
    ]
    for row in table.to_dict("records"):
        sps = interval(row["samples_per_s"], row["ci_low"], row["ci_high"], ".1f")
        is_base = str(row["note"]).startswith("the base")
        eff = interval(row["efficiency"], row["efficiency_low"], row["efficiency_high"], ".2f", is_base)
        vs = interval(row["vs_single"], row["vs_single_low"], row["vs_single_high"], ".2f")
        mark = "  oversubscribed" if row["oversubscribed"] else ""
        lines.append(f"{row['variant']:<{width}} {row['world_size']:>5} {sps:>26} {eff:>22} {vs:>22}{mark}")
    modes = " and ".join(dict.fromkeys(table.scaling))
    over = "; oversubscribed: more ranks than cores, so time-slicing, not scaling" if table.oversubscribed.any() else ""
    lines.append(f"{modes} scaling; intervals as above (ratios: Welch on log throughput, ÷ ranks){over}.")
    return "\n".join(lines)


def format_table(table: pd.DataFrame, agreement: Agreement | float) -> str:
    """The terminal table `compare` and `report` print: one block per setup, then what to read into it."""
    width = max([10, *(len(str(b)) for b in table.get("backend", []))])  # `ddp (torchrun)` is longer than 10
    header = (
        f"{'backend':<{width}} {'ok/fail':>7} {'samples/s (95% CI)':>26} {'ratio (95% CI)':>24} "
        f"{'p50 step':>9} {'p99 step':>9} {'train loss':>10} {'val loss':>9} {'peak MB/rank':>13}"
    )
    lines, verdicts, warnings = [], [], []
    blocks = setups(table)
    for setup, group in blocks:
        over = group["oversubscribed"].dropna() if "oversubscribed" in group else pd.Series([], dtype=object)
        if setup:
            lines.append(setup_words(setup) + (f" — OVERSUBSCRIBED: {over.iloc[0]}" if len(over) else ""))
        where = f"{setup_words(setup)}: " if len(blocks) > 1 else ""  # which block a line below is about
        if len(over):
            where = f"{where}(oversubscribed, {over.iloc[0]}) "
        lines.append(header)
        base = None
        for row in group.to_dict("records"):
            okfail = f"{row['runs_ok']}/{row['runs_failed']}"
            stopped = _count(row.get("runs_interrupted"))
            if stopped:
                said = row.get("interrupted") if isinstance(row.get("interrupted"), str) else "see comparison.csv"
                warnings.append(f"{where}{row['backend']}: {stopped} run(s) interrupted, not failed (left out): {said}")
            if not row["runs_ok"]:
                if row["runs_failed"] or not stopped:
                    said = row.get("error") if isinstance(row.get("error"), str) else "see the run's run.json"
                    lines.append(f"{row['backend']:<{width}} {okfail:>7}   FAILED: {said}")
                else:
                    lines.append(f"{row['backend']:<{width}} {okfail:>7}   INTERRUPTED: no run completed")
                continue
            is_base = base is None
            base = base or row["backend"]
            sps = interval(row["samples_per_s"], row["ci_low"], row["ci_high"], ".1f")
            low, high = row.get("ratio_low", np.nan), row.get("ratio_high", np.nan)
            digits = stats.interval_digits(low, high) if pd.notna(low) and pd.notna(high) else 2  # 1 never blurred
            ratio = interval(row.get("ratio", np.nan), low, high, f".{digits}f", is_base)
            lines.append(
                f"{row['backend']:<{width}} {okfail:>7} {sps:>26} {ratio:>24} {row['step_p50_s']:>9.4f} "
                f"{row['step_p99_s']:>9.4f} {row['final_train_loss']:>10.4f} {row['final_val_loss']:>9.4f} "
                f"{memory_range(row):>13}"
            )
            if not is_base:
                verdict = stats.verdict(row["backend"], base, row["ratio"], row["ratio_low"], row["ratio_high"])
                verdicts.append(where + verdict)
            if isinstance(row.get("warning"), str) and row["warning"]:
                warnings.append(f"warning: {where}{row['backend']}: {row['warning']}: {SHORT_RUN_FIX}")
            if row["runs_failed"] and isinstance(row.get("error"), str):
                warnings.append(f"{where}{row['backend']}: {row['runs_failed']} run(s) failed: {row['error']}")
    if not isinstance(agreement, Agreement):
        agreement = Agreement(train=float(agreement))
    lines += [*agreement.lines(), *verdicts, *warnings]
    lines.append(
        "samples/s: geometric mean over runs, 95% CI on log throughput; ratio: the decision's 95% CI (Welch on log "
        "throughput, or two-stage after a planned second stage); "
        f"no CI from < {stats.MIN_RUNS} runs. p50/p99 step (slowest rank, s) and final losses: means over runs, "
        "descriptive, no interval. peak MB/rank: the smallest–largest rank's peak memory (RSS on CPU, CUDA "
        "allocated on GPU), means over runs."
    )
    return "\n".join(lines)


def _count(value: object) -> int:
    """A count from a table cell: 0 for a missing one (tables from before the column existed)."""
    return int(value) if isinstance(value, (int, float, np.integer, np.floating)) and pd.notna(value) else 0


def markdown_table(frame: pd.DataFrame, missing: str = "") -> str:
    """A pipe table for report.md: floats to 4 significant digits, `missing` for NaN/None."""

    def cell(value: object) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return missing if text in ("nan", "None") else text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)
