"""Report figures (matplotlib, PNG)."""

from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks import files  # noqa: E402
from benchmarks.analysis.load import RunSet  # noqa: E402
from benchmarks.analysis.tables import completed, setup_label  # noqa: E402


def save(fig: plt.Figure, path: Path) -> Path:
    """Every report figure is written the same way: tight layout, PNG at 110 dpi, whole or not at all, figure
    closed."""
    fig.tight_layout()
    try:
        files.write_atomic(path, lambda handle: fig.savefig(handle, format="png", dpi=110), binary=True)
    finally:
        plt.close(fig)  # a failed write must not leave the figure open in a long-lived process
    return path


COLOURS = {
    "ddp": "C0",
    "horovod (gloo)": "C1",
    "horovod": "C1",
    "horovod (mpi)": "C2",
    "fsdp": "C3",
    "horovod (mpirun)": "C4",
    "ddp (mpirun)": "C5",
    "fsdp (mpirun)": "C6",
    "single": "C7",
}
"""One colour per variant in every plot, whichever names it: the table's label (`horovod (gloo)`) or compare's
(`horovod@gloo`)."""


PHASE_SHADES = ("#c7c7c7", "#9edae5", "#dbdb8d", "#c49c94")
"""The phases' colours: light shades no variant is drawn in, so a phase never reads as a variant."""


def colour(label: str) -> str:
    """The colour of the variant a plot's label names (its first line, any ` wN` or ` (val …)` left out)."""
    name = str(label).split("\n")[0].split(" w")[0].split(" (val ")[0].strip()
    name = name.replace("@torchrun", "").replace("@gloo", " (gloo)").replace("@mpirun", " (mpirun)")
    name = name.replace("@mpi", " (mpi)")
    return COLOURS.get(name) or f"C{8 + zlib.crc32(name.encode()) % 2}"


def in_order(names: list[str], order: list[str] | None) -> list[str]:
    """`names` in the table's order (`order`: its labels), the rest after them as they came."""
    if not order:
        return names
    rank = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda n: rank.get(n, len(rank)))


def throughput(table: pd.DataFrame, path: Path) -> Path | None:
    """Bars of the backends with completed runs; None (no figure) when none completed."""
    ok = table[table.runs_ok > 0]
    if not len(ok) or "samples_per_s" not in ok:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # No error bar where there is no interval (< 3 runs): a zero-length bar would claim certainty.
    err = [(ok.samples_per_s - ok.ci_low).fillna(0), (ok.ci_high - ok.samples_per_s).fillna(0)]
    setup = [c for c in ("workload", "global_batch", "world_size") if c in ok]
    several = bool(setup) and len(ok[setup].drop_duplicates()) > 1  # label bars by world size too
    steps = "step_config" in ok and ok["step_config"].nunique() > 1  # and by step, in a step study
    rows = ok.to_dict("records")
    labels = [
        r["backend"]
        + (f"\n{r.get('world_size')} rank(s)" if several else "")
        + (f"\n{r['step_config']}" if steps else "")
        for r in rows
    ]
    ax.bar(range(len(ok)), ok.samples_per_s, yerr=err, capsize=6, color=[colour(r["backend"]) for r in rows])
    ax.set_xticks(range(len(ok)), labels)
    no_ci = ok.ci_low.isna().any()
    ax.set_ylabel("samples/s (geo. mean, 95% CI)")
    ax.set_title("Throughput per backend" + (" (no error bar: < 3 runs)" if no_ci else ""))
    return save(fig, path)


def step_times(
    rs: RunSet, path: Path, backends: dict[str, str] | None = None, order: list[str] | None = None
) -> Path | None:
    """Completed runs' timed steps per backend (`backends` as in `setup_label`), in the table's `order`; None when
    there are none."""
    timed = completed(rs.timing)
    timed = timed[~timed["warmup"].astype(bool)] if len(timed) else timed
    if not len(timed):
        return None
    timed = timed.assign(backend=setup_label(timed, backends))
    slowest = timed.groupby(["backend", "run_key", "step"], sort=False, observed=True)["step_s"].max().reset_index()
    names = in_order(list(dict.fromkeys(slowest.backend)), order)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    boxes = ax.boxplot(
        [slowest[slowest.backend == b]["step_s"] * 1000 for b in names], showfliers=True, patch_artist=True
    )
    for box, name in zip(boxes["boxes"], names, strict=True):
        box.set_facecolor(colour(name))
        box.set_alpha(0.6)
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel("step time, slowest rank (ms)")
    ax.set_title("Step-time distribution (warm-up excluded)")
    return save(fig, path)


def loss_curves(
    rs: RunSet, path: Path, backends: dict[str, str] | None = None, order: list[str] | None = None
) -> Path | None:
    """The first completed run of each backend, in the table's `order`; None when no completed run recorded a
    loss."""
    loss = completed(rs.loss)
    if not len(loss):
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    groups = dict(list(loss.groupby(setup_label(loss, backends), sort=False)))
    for backend in in_order(list(groups), order):
        rows = groups[backend]
        first = rows[rows.run_key == rows.run_key.min()]
        train, val = first[first.split == "train"], first[first.split == "val"]
        ax.plot(train.step, train.loss, color=colour(backend), alpha=0.8, label=f"{backend} train")
        ax.plot(val.step, val.loss, "o--", color=colour(backend), label=f"{backend} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Loss curves (first run of each backend)")
    ax.legend(fontsize=8)
    return save(fig, path)


def scaling_efficiency(table: pd.DataFrame, path: Path) -> Path:
    return save(scaling_figure(table), path)


def scaling_figure(table: pd.DataFrame) -> plt.Figure:
    """Throughput against ranks (left) and scaling efficiency T(n) / (n × T(1)) (right), per variant, with
    95 % intervals where there are any; oversubscribed world sizes get a hollow marker. With the scaling
    table's evaluation columns (evaluation.eval_scaling), evaluation's efficiency is dashed beside it."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    name = "variant" if "variant" in table else "backend"
    over_any = False
    for variant, rows in table.groupby(name, sort=False):
        color = colour(variant)
        rows = rows.sort_values("world_size")
        for ax, column in ((left, "samples_per_s"), (right, "efficiency")):
            if column not in rows or rows[column].isna().all():
                continue
            low, high = ("ci_low", "ci_high") if column == "samples_per_s" else ("efficiency_low", "efficiency_high")
            err = None
            if low in rows and high in rows:
                err = [(rows[column] - rows[low]).fillna(0).clip(lower=0), (rows[high] - rows[column]).fillna(0)]
            ax.errorbar(rows.world_size, rows[column], yerr=err, fmt="-", color=color, capsize=4, label=variant)
            over = rows["oversubscribed"].fillna(False).astype(bool) if "oversubscribed" in rows else rows[column] < 0
            over_any |= bool(over.any())
            ax.plot(rows.world_size[~over], rows[column][~over], "o", color=color)
            ax.plot(rows.world_size[over], rows[column][over], "o", mfc="white", mec=color, mew=1.5)
        if "val_efficiency" in rows and rows["val_efficiency"].notna().any():  # evaluation's, dashed
            right.plot(
                rows.world_size,
                rows["val_efficiency"],
                "--",
                marker="^",
                ms=4,
                color=color,
                label=f"{variant} evaluation",
            )
        if "vs_single" in rows and rows["vs_single"].notna().any():
            right.plot(
                rows.world_size, rows["vs_single"], ":", marker="s", ms=4, color=color, label=f"{variant} vs single"
            )
    ticks = sorted(int(w) for w in table.world_size.unique())  # world sizes are whole ranks
    for ax in (left, right):
        ax.set_xticks(ticks)
        ax.set_xlabel("world size (ranks)")
    right.axhline(1.0, color="grey", linewidth=0.8)
    left.set_ylabel("samples/s (geo. mean, 95% CI)")
    right.set_ylabel("scaling efficiency T(n) / (n·T(1))")
    note = "; hollow: oversubscribed (time-slicing)" if over_any else ""
    left.set_title("Throughput vs ranks")
    right.set_title("Scaling efficiency" + note, fontsize=9 if note else None)
    for ax, size in ((left, 8), (right, 7)):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=size)
    return fig


def phases(table: pd.DataFrame, path: Path, order: list[str] | None = None) -> Path | None:
    """Stacked mean phases per backend, in the table's `order`."""
    if not len(table):
        return None
    position = {name: i for i, name in enumerate(in_order(list(table.backend.astype(str)), order))}
    table = table.assign(_at=table.backend.astype(str).map(position)).sort_values("_at")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = pd.Series(0.0, index=table.index)
    for column, shade in zip(("data_s", "forward_s", "backward_s", "optimizer_s"), PHASE_SHADES, strict=True):
        ax.bar(table.backend, table[column] * 1000, bottom=bottom * 1000, label=column.removesuffix("_s"), color=shade)
        bottom += table[column]
    ax.set_ylabel("mean ms per step")
    ax.set_title("Where a step's time goes")
    ax.legend(fontsize=8)
    return save(fig, path)
