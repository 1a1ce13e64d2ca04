"""Statistics over loaded runs: per-run numbers, per-backend tables with intervals, scaling, the
terminal table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.analysis import stats
from benchmarks.analysis.load import RunSet


def per_run_stats(rs: RunSet) -> pd.DataFrame:
    """Per run: throughput over the timed window, step percentiles (slowest rank per step), rank skew.

    Throughput is recomputed from the rows: samples of all ranks in non-warm-up steps ÷ the run's
    timed window (`timed_wall_s` in run.json, also summary.csv's `wall_s`).
    """
    timing = rs.timing
    timed = timing[~timing["warmup"].astype(bool)] if len(timing) else timing
    if len(timed):
        slowest = timed.groupby(["run_id", "step"], observed=True)["step_s"].max()
        q = slowest.groupby(level="run_id", observed=True).quantile([0.5, 0.9, 0.95, 0.99]).unstack()
        samples = timed.groupby("run_id", observed=True)["samples"].sum()
        rank_total = (
            timed.groupby(["run_id", "rank"], observed=True)["step_s"].sum().groupby(level="run_id", observed=True)
        )
        skew = rank_total.max() / rank_total.min()
    else:
        q, samples, skew = pd.DataFrame(columns=[0.5, 0.9, 0.95, 0.99]), pd.Series(dtype=float), pd.Series(dtype=float)
    final = _final_losses(rs.loss)
    rows = []
    for run in rs.runs.itertuples():
        rid, wall = run.run_id, run.timed_wall_s
        has_q = rid in q.index
        rows.append({
            "run_id": rid, "backend": run.backend, "world_size": run.world_size, "status": run.status,
            "samples_per_s": samples.get(rid, np.nan) / wall if wall and wall > 0 else np.nan,
            "step_p50_s": q.loc[rid, 0.5] if has_q else np.nan, "step_p90_s": q.loc[rid, 0.9] if has_q else np.nan,
            "step_p95_s": q.loc[rid, 0.95] if has_q else np.nan, "step_p99_s": q.loc[rid, 0.99] if has_q else np.nan,
            "rank_skew": skew.get(rid, np.nan),
            **final.get(rid, {"final_train_loss": np.nan, "final_val_loss": np.nan, "final_val_accuracy": np.nan}),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _final_losses(loss: pd.DataFrame) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if not len(loss):
        return out
    for (rid, split), rows in loss.groupby(["run_id", "split"], sort=False):
        last = rows.iloc[-1]
        entry = out.setdefault(
            rid, {"final_train_loss": np.nan, "final_val_loss": np.nan, "final_val_accuracy": np.nan}
        )
        if split == "train":
            entry["final_train_loss"] = last["loss"]
        else:
            entry["final_val_loss"], entry["final_val_accuracy"] = last["loss"], last["accuracy"]
    return out


def scaling(per_run: pd.DataFrame) -> pd.DataFrame:
    """Speed-up and efficiency vs world size 1, per backend and world size (empty without a baseline)."""
    ok = per_run[per_run.status == "completed"]
    base = ok[ok.world_size == 1]["samples_per_s"].mean()
    if np.isnan(base) or ok.world_size.nunique() < 2:
        return pd.DataFrame(columns=["backend", "world_size", "samples_per_s", "speedup", "efficiency"])
    table = ok.groupby(["backend", "world_size"], as_index=False)["samples_per_s"].mean()
    table["speedup"] = table["samples_per_s"] / base
    table["efficiency"] = table["speedup"] / table["world_size"]
    return table


def phase_breakdown(rs: RunSet) -> pd.DataFrame:
    """Mean seconds per timed step in each phase, per backend."""
    phases = ["data_s", "forward_s", "backward_s", "optimizer_s"]
    if not len(rs.timing):
        return pd.DataFrame(columns=["backend", *phases])
    timed = rs.timing[~rs.timing["warmup"].astype(bool)]
    return timed.groupby("backend", sort=False, observed=True)[phases].mean().reset_index()


def backend_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Across repeats, per backend: mean throughput with a 95 % CI, ratio to the first backend."""
    rows = []
    order = list(dict.fromkeys(per_run["backend"]))
    ok = per_run[per_run.status == "completed"]
    base = ok[ok.backend == order[0]]["samples_per_s"] if order else pd.Series(dtype=float)
    for backend in order:
        mine = ok[ok.backend == backend]
        failed = int((per_run.backend == backend).sum() - len(mine))
        row: dict = {"backend": backend, "runs_ok": len(mine), "runs_failed": failed}
        if len(mine):
            mean, lo, hi = stats.mean_ci(mine["samples_per_s"])
            row.update(
                samples_per_s=mean,
                ci_low=lo,
                ci_high=hi,
                step_p50_s=mine["step_p50_s"].mean(),
                step_p99_s=mine["step_p99_s"].mean(),
                final_train_loss=mine["final_train_loss"].mean(),
                final_val_loss=mine["final_val_loss"].mean(),
            )
            if backend == order[0]:
                row.update(ratio=1.0, ratio_low=np.nan, ratio_high=np.nan)  # the base of the ratios
            elif len(base):
                ratio, rlo, rhi = stats.bootstrap_ratio_ci(mine["samples_per_s"], base)
                row.update(ratio=ratio, ratio_low=rlo, ratio_high=rhi)
        rows.append(row)
    return pd.DataFrame(rows)


def loss_agreement(rs: RunSet) -> float:
    """Max abs difference between the backends' global train-loss curves (first run of each)."""
    train = rs.loss[(rs.loss.split == "train") & (rs.loss.status == "completed")] if len(rs.loss) else rs.loss
    if not len(train):
        return float("nan")
    firsts = train.groupby("backend")["run_id"].min()
    curves = [train[train.run_id == rid].set_index("step")["loss"] for rid in firsts]
    worst = 0.0
    for curve in curves[1:]:
        common = curves[0].index.intersection(curve.index)
        worst = max(worst, float((curves[0][common] - curve[common]).abs().max()))
    return worst


def format_table(table: pd.DataFrame, agreement: float) -> str:
    """The terminal table `compare` and `report` print."""
    lines = [
        f"{'backend':<10} {'ok/fail':>7} {'samples/s ± 95% CI':>20} {'ratio (95% CI)':>20} "
        f"{'p50 step':>9} {'p99 step':>9} {'train loss':>10} {'val loss':>9}"
    ]
    for row in table.to_dict("records"):
        okfail = f"{row['runs_ok']}/{row['runs_failed']}"
        if not row["runs_ok"]:
            lines.append(f"{row['backend']:<10} {okfail:>7}   FAILED (see the run's run.json / output above)")
            continue
        sps = f"{row['samples_per_s']:.1f} ± {row['ci_high'] - row['samples_per_s']:.1f}"
        if pd.isna(row.get("ratio")):
            ratio = "-"
        elif pd.isna(row.get("ratio_low")):
            ratio = f"{row['ratio']:.2f} (base)"
        else:
            ratio = f"{row['ratio']:.2f} ({row['ratio_low']:.2f}-{row['ratio_high']:.2f})"
        lines.append(
            f"{row['backend']:<10} {okfail:>7} {sps:>20} {ratio:>20} {row['step_p50_s']:>9.4f} "
            f"{row['step_p99_s']:>9.4f} {row['final_train_loss']:>10.4f} {row['final_val_loss']:>9.4f}"
        )
    lines.append(f"loss curves: max abs difference between backends {agreement:.2e}")
    ok = table[table.runs_ok > 0]
    if len(ok) >= 2 and ok.iloc[0]["backend"] == table.iloc[0]["backend"]:
        base = ok.iloc[0]["backend"]
        for other in ok.iloc[1:].to_dict("records"):
            lines.append(stats.verdict(other["backend"], base, other["ratio"], other["ratio_low"], other["ratio_high"]))
    return "\n".join(lines)
