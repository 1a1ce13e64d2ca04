"""`distbench allreduce` results (allreduce, reduce-scatter, all-gather): find, load, check, plot and tabulate.

from benchmarks.analysis import collectives
frame = collectives.load("results/reference/2026-12-01-cpu-2core-allreduce")  # one row per run and size
collectives.time_at_size(frame, 4 * 1_000_000)   # {label: seconds or None}, interpolated on log-log
section = collectives.report_section(["results/allreduce"], out_dir)     # tables + PNG for a report

An allreduce run directory holds run.json (`kind: allreduce`) and allreduce.csv; the training loader
skips these directories; their contract is `check.allreduce_problems`, which `distbench check` applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import files
from benchmarks.analysis import rundir, terminal
from benchmarks.analysis.load import find_run_dirs
from benchmarks.config import format_size
from benchmarks.run import collectives as rank_side

COMPARISON_CSV = "allreduce-comparison.csv"
FIGURE = "allreduce_bandwidth.png"
RUN_COLUMNS = (
    "run_key",
    "run_id",
    "impl",
    "collective",
    "launcher",
    "launcher_detail",
    "controller",
    "world_size",
    "device",
    "dtype",
    "threads",
    "status",
    "error",
    "wall_s",
)


def find_dirs(*paths: str | Path) -> list[Path]:
    """allreduce run directories at or below the paths (or globs), in path order."""
    return [d for d in find_run_dirs(*paths) if rundir.is_allreduce(d)]


def _runs(dirs: list[Path]) -> pd.DataFrame:
    rows = []
    for run_dir in dirs:
        meta = rundir.read_or_none(run_dir) or {}
        row = {key: meta.get(key) for key in RUN_COLUMNS}
        row["collective"] = meta.get("collective", "allreduce")
        rows.append({**row, "run_key": str(run_dir), "status": rundir.status(meta)})
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def _labels(frame: pd.DataFrame) -> pd.Series:
    """The impl and its collective unless allreduce ("torch-gloo reduce_scatter"), plus whatever else varies
    among its runs (launcher, world size, dtype), as a line's name."""
    labels = pd.Series("", index=frame.index, dtype=object)
    for (impl, collective), group in frame.groupby(["impl", "collective"], sort=False):
        name = str(impl) if collective == "allreduce" else f"{impl} {collective}"
        extra = [c for c in ("launcher", "world_size", "dtype") if group[c].nunique() > 1]
        for i, row in group.iterrows():
            labels[i] = ", ".join([name, *(f"w{row[c]}" if c == "world_size" else str(row[c]) for c in extra)])
    return labels


def load(*paths: str | Path, include_failed: bool = False) -> pd.DataFrame:
    """Every size row of the allreduce runs under the paths, with `run_key`, `status` and `label`.

    Runs that did not complete are left out unless `include_failed` (their rows before the failure, and
    the failing size's row with `correct` False and no time, come in). Raises FileNotFoundError when
    there is nothing to load.
    """
    dirs = find_dirs(*paths)
    runs = _runs(dirs)
    if not include_failed:
        runs = runs[runs.status == "completed"]
    frames = []
    for run in runs.to_dict("records"):
        path = Path(run["run_key"]) / rank_side.CSV_NAME
        if path.is_file():
            rows = pd.read_csv(path)
            if "collective" not in rows.columns:  # schema 1
                rows.insert(2, "collective", "allreduce")
            frames.append(rows.assign(run_key=run["run_key"], status=run["status"]))
    frames = [f for f in frames if len(f)]
    if not frames:
        raise FileNotFoundError(
            f"no {'' if include_failed else 'completed '}allreduce runs under {', '.join(map(str, paths))}"
        )
    frame = pd.concat(frames, ignore_index=True)
    frame["correct"] = frame["correct"].astype(str) == "True"
    return frame.assign(label=_labels(frame))


def time_at_size(frame: pd.DataFrame, size_bytes: float) -> dict[str, float | None]:
    """Each line's (`label`'s) time per call in seconds for a message of `size_bytes`.

    Between two measured sizes the time is interpolated linearly in log(size)–log(time); a measured size
    gives its own time (the median over runs); outside the measured range, or for a size ≤ 0, None.
    """
    result: dict[str, float | None] = {}
    ok = frame[frame["correct"] & frame["time_mean_s"].notna()]
    for label, group in ok.groupby("label", sort=False):
        times = group.groupby("size_bytes")["time_mean_s"].median().sort_index()
        sizes = times.index.to_numpy(dtype=float)
        if size_bytes <= 0 or size_bytes < sizes[0] or size_bytes > sizes[-1]:
            result[str(label)] = None
            continue
        log_t = np.interp(math.log(size_bytes), np.log(sizes), np.log(times.to_numpy(dtype=float)))
        result[str(label)] = float(math.exp(log_t))
    return result


def figure(frame: pd.DataFrame, path: Path) -> Path | None:
    """Bus bandwidth and time against message size, log–log, one line per label (impl and collective); None
    when nothing is timed."""
    from benchmarks.analysis import figures  # matplotlib only once a figure is drawn

    plt = figures.plt
    from matplotlib.ticker import FuncFormatter

    ok = frame[frame["correct"] & frame["time_mean_s"].notna()]
    if not len(ok):
        return None
    fig, (bw_ax, t_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, group) in enumerate(ok.groupby("label", sort=False)):
        by_size = group.groupby("size_bytes")[["busbw_gbps", "time_mean_s"]].median()
        style = {"marker": "o", "markersize": 3, "color": f"C{i % 10}", "label": str(label)}
        bw_ax.plot(by_size.index, by_size["busbw_gbps"], **style)
        t_ax.plot(by_size.index, by_size["time_mean_s"] * 1e6, **style)
    ticks = FuncFormatter(lambda x, _: format_size(int(x)) if x >= 1 and float(x).is_integer() else "")
    low, high = (int(math.log2(s)) for s in (ok["size_bytes"].min(), ok["size_bytes"].max()))
    step = max(1, math.ceil((high - low) / 9))  # at most ~10 labelled sizes, every one a measured power of two
    what = "/".join(dict.fromkeys(ok["collective"]))
    for ax, ylabel in ((bw_ax, "bus bandwidth (GB/s)"), (t_ax, f"time per {what} (µs)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([2**e for e in range(low, high + 1, step)])
        ax.xaxis.set_major_formatter(ticks)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.set_xlabel("message size")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    worlds = ", ".join(sorted({f"{w} ranks" for w in ok["world_size"]}))
    bw_ax.set_title(f"{what} bus bandwidth ({', '.join(sorted(set(ok['dtype'])))}, {worlds})")
    t_ax.set_title(f"{what} time (mean over ranks)")
    bw_ax.legend(fontsize=8)
    return figures.save(fig, path)


@dataclass
class AllreduceSection:
    """What a report shows of allreduce runs; every frame is ready for a markdown table."""

    runs: pd.DataFrame
    """One row per run: run_key, run_id, impl, collective, launcher, launcher_detail, controller, world_size, device,
    dtype, threads, status, error, wall_s (the sweep's seconds)."""
    busbw: pd.DataFrame
    """Bus bandwidth in GB/s: one row per size (`size`, e.g. '64 KiB'), one column per label."""
    time_us: pd.DataFrame
    """Mean time per call in µs, shaped like `busbw`."""
    figures: list[Path] = field(default_factory=list)
    """The PNG(s) written into out_dir (bandwidth and time against size, log–log)."""
    notes: list[str] = field(default_factory=list)
    """Lines worth saying: runs left out and why."""

    def markdown(self, figure_dir: Path | None = None) -> str:
        """The section as markdown; figures linked relative to `figure_dir` (default: by file name)."""
        only_allreduce = set(self.runs["collective"]) <= {"allreduce"}
        parts = [
            "## Allreduce" if only_allreduce else "## Collectives",
            "",
            "Bus bandwidth = size / time × 2(n−1)/n for allreduce, × (n−1)/n for reduce_scatter and all_gather "
            "(nccl-tests; size is the whole buffer); time is the mean over ranks of each rank's mean per call. "
            "Every result was checked exact.",
            "",
        ]
        parts += [f"- {note}" for note in self.notes] + ([""] if self.notes else [])
        for title, frame in (
            ("Runs", self.runs.drop(columns=["run_key"])),
            ("Bus bandwidth (GB/s)", self.busbw),
            ("Time per allreduce (µs)" if only_allreduce else "Time per call (µs)", self.time_us),
        ):
            parts += [f"### {title}", "", terminal.markdown_table(frame, missing="—"), ""]
        for png in self.figures:
            rel = png.relative_to(figure_dir) if figure_dir and png.is_relative_to(figure_dir) else png.name
            parts += [f"![{png.stem}]({rel})", ""]
        return "\n".join(parts)

    @property
    def text(self) -> str:
        """The terminal table: bus bandwidth (and time) per size and label."""
        joined = self.busbw.copy()
        for column in self.busbw.columns[1:]:
            joined[column] = [
                f"{b:.3g} ({t:.1f})" if b == b else "—"
                for b, t in zip(self.busbw[column], self.time_us[column], strict=True)
            ]
        what = "allreduce" if set(self.runs["collective"]) <= {"allreduce"} else "call"
        return f"bus bandwidth GB/s (time µs) per {what}\n" + joined.to_string(index=False)


def _wide(frame: pd.DataFrame, column: str, scale: float = 1.0) -> pd.DataFrame:
    ok = frame[frame["correct"]]
    wide = ok.pivot_table(index="size_bytes", columns="label", values=column, aggfunc="median", sort=False) * scale
    wide = wide.reindex(columns=list(dict.fromkeys(frame["label"]))).sort_index()
    wide.columns.name = None
    wide.insert(0, "size", [format_size(int(s)) for s in wide.index])
    return wide.reset_index(drop=True)


def report_section(paths: list[str | Path], out_dir: Path, order: list[str] | None = None) -> AllreduceSection | None:
    """The allreduce part of a report for the runs under `paths`, its figure written into `out_dir`.

    Returns None when no allreduce run directory is under the paths. Completed runs make the tables and
    the figure; the others are listed in `runs` with their error and named in `notes`. Lines (columns)
    follow `order` (impl names) where given, otherwise the run directories' path order.
    """
    dirs = find_dirs(*paths)
    if not dirs:
        return None
    runs = _ordered(_runs(dirs), order or [])
    notes = [
        f"{r['run_key']}: {r['status']}" + (f": {r['error']}" if r["error"] else "") + " (left out)"
        for r in runs.to_dict("records")
        if r["status"] != "completed"
    ]
    try:
        frame = _ordered(load(*dirs), order or [])
    except FileNotFoundError:
        empty = pd.DataFrame(columns=["size"])
        return AllreduceSection(runs, empty, empty.copy(), [], [*notes, "no completed allreduce run"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = figure(frame, out_dir / FIGURE)
    return AllreduceSection(
        runs, _wide(frame, "busbw_gbps"), _wide(frame, "time_mean_s", 1e6), [png] if png else [], notes
    )


def _ordered(frame: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    rank = frame["impl"].map(lambda impl: order.index(impl) if impl in order else len(order))
    return frame.iloc[rank.argsort(kind="stable")].reset_index(drop=True)


def write_compare_outputs(root: Path, order: list[str]) -> AllreduceSection:
    """`allreduce --compare`'s outputs: the combined CSV in `root`, report/allreduce.md and the figure,
    implementations in `order` (impl names, as --impls gave them)."""
    frame = _ordered(load(root, include_failed=True), order)
    files.write_csv(frame.drop(columns=["label"]), root / COMPARISON_CSV, index=False)
    section = report_section([root], root / "report", order)
    assert section is not None  # load found runs
    files.write_text(root / "report" / "allreduce.md", section.markdown(root / "report"))
    return section
