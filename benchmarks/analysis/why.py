"""The report's "why": where each variant's step time goes, and what its gradient allreduce costs alone.

A step is split three ways, per run, from summary.csv: `compute` (the compute baseline: the same steps on
a bare copy of the model, no gradient communication), `exposed communication` (the median step minus
compute: communication and framework overhead not hidden behind backward) and `other` (the timed window
per step minus the median step: slow steps and the gaps between steps). When `distbench allreduce`
results for the same world size are among the report's paths, each variant's gradient allreduce is
looked up at its size (interpolated on log–log), which says how much of it the framework hides; only
allreduce results serve there, and reduce-scatter / all-gather results (FSDP2's collectives) are shown
beside them at each setup's gradient size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import backends
from benchmarks.analysis import collectives, rundir, stats, timeline
from benchmarks.analysis.load import RunSet
from benchmarks.analysis.tables import SETUP, with_setup
from benchmarks.config import PLAIN_STEP
from benchmarks.run import collectives as rank_side
from benchmarks.run import recorder as results

PARTS = ("compute_ms", "exposed_comm_ms", "other_ms")


@dataclass
class Section:
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)
    images: list[Path] = field(default_factory=list)


MPI_PROGRESS = " and MPI's progress"
"""What a variant under MPI (a controller or launcher of it) adds to its backend's threads."""


def threads_words(variant: str) -> str:
    """Why the same compute can take longer under `variant`, in its framework's words ('' for one without any)."""
    plain = str(variant).split(" (", 1)[0]
    known = backends.BY_NAME.get(plain)
    backend = known.backend if known else plain.split("@", 1)[0]
    said = backends.DECLARED[backend].threads if backend in backends.DECLARED else ""
    if said and known is not None and known.controller == "mpi":
        said += MPI_PROGRESS
    return f": {said} share the cores during compute" if said else ""


def impl_of(meta: dict[str, Any]) -> str | None:
    """The `distbench allreduce` implementation that does this run's gradient allreduce."""
    name = meta.get("backend")
    return backends.DECLARED[name].allreduce_of(meta.get("knobs") or {}) if name in backends.DECLARED else None


def per_run(rs: RunSet) -> pd.DataFrame:
    """One row per completed run with a step breakdown in ms (NaN parts when the run had no baseline)."""
    rows = []
    for run in rs.runs.to_dict("records"):
        run_dir = Path(run["run_key"])
        summary_path = run_dir / results.SUMMARY_CSV
        if run.get("status") != "completed" or not summary_path.is_file():
            continue
        summary = pd.read_csv(summary_path).iloc[0]
        meta = rundir.read(run_dir)
        step = summary["step_p50_s"] * 1000
        window = summary["wall_s"] / summary["timed_steps"] * 1000 if summary["timed_steps"] else np.nan
        compute = summary.get("compute_s", np.nan) * 1000
        trace = meta.get("trace") or {}
        row = {
            "run_key": run["run_key"],
            **{k: run.get(k, PLAIN_STEP) if k == "step_config" else run[k] for k in SETUP},
            "variant": run["variant"],
            "impl": impl_of(meta),
            "dtype": "float16" if meta.get("config", {}).get("fp16_allreduce") else "float32",
            "gradient_bytes": meta.get("gradient_bytes_per_step"),
            "step_ms": step,
            "compute_ms": compute,
            "exposed_comm_ms": step - compute,
            "other_ms": window - step,
            "trace_files": trace.get("files", []),
            "trace_steps": trace.get("steps"),
        }
        rows.append(row)
    return pd.DataFrame(rows)


def _ms(value: float, lo: float = np.nan, hi: float = np.nan) -> str:
    if np.isnan(value):
        return "—"
    return f"{value:.1f}" if np.isnan(lo) else f"{value:.1f} ({lo:.1f}–{hi:.1f})"


def alone_ms(
    allreduce: pd.DataFrame | None,
    impl: str | None,
    world_size: int,
    dtype: str,
    nbytes: Any,
    collective: str = "allreduce",
) -> float:
    """`impl`'s `collective` of `nbytes` alone in ms, from `distbench allreduce` runs of that world size and
    dtype; NaN when there are none or the size is outside the measured range."""
    if allreduce is None or impl is None or pd.isna(nbytes) or not nbytes:
        return np.nan
    rows = allreduce[(allreduce.impl == impl) & (allreduce.world_size == world_size) & (allreduce.dtype == dtype)]
    rows = rows[_collective(rows) == collective]
    if not len(rows):
        return np.nan
    times = [t for t in collectives.time_at_size(rows.assign(label=impl), float(nbytes)).values() if t is not None]
    return times[0] * 1000 if times else np.nan


def _collective(frame: pd.DataFrame) -> pd.Series:
    """Each row's collective (frames without the column, schema 1's, are allreduce)."""
    return frame["collective"] if "collective" in frame else pd.Series("allreduce", index=frame.index)


def breakdown(runs: pd.DataFrame, allreduce: pd.DataFrame | None) -> pd.DataFrame:
    """Per setup and variant: each part's mean over runs with its 95 % interval, the share of the step
    that is exposed communication, and the gradient allreduce alone with the share of it hidden."""
    rows = []
    for key, group in with_setup(runs).groupby([*SETUP, "variant"], sort=False):
        setup, variant = key[:-1], key[-1]
        first = group.iloc[0]
        parts = {p: stats.mean_ci(group[p]) for p in ("step_ms", *PARTS)}
        alone = alone_ms(allreduce, first["impl"], int(first["world_size"]), first["dtype"], first["gradient_bytes"])
        exposed = parts["exposed_comm_ms"][0]
        hidden = min(1.0, max(0.0, 1 - exposed / alone)) if alone > 0 and not np.isnan(exposed) else np.nan
        rows.append(
            {
                **dict(zip(SETUP, setup, strict=True)),
                "variant": variant,
                "runs": len(group),
                **{p: _ms(*parts[p]) for p in ("step_ms", *PARTS)},
                "exposed_share": f"{exposed / parts['step_ms'][0]:.0%}" if not np.isnan(exposed) else "—",
                "gradient_mb": first["gradient_bytes"] / 1e6 if pd.notna(first["gradient_bytes"]) else np.nan,
                "allreduce_alone_ms": alone,
                "hidden_share": "—" if np.isnan(hidden) else f"{hidden:.0%}",
                # The fewest runs behind any part: a run without a compute baseline has no compute_ms.
                "interval": "no compute baseline (--compute-baseline-steps 0): the step is not split"
                if group["compute_ms"].isna().all()
                else stats.no_interval_reason(int(group[list(PARTS)].notna().sum().min()))
                or "95 % t-interval over runs",
                **{f"raw_{p}": parts[p][0] for p in ("step_ms", *PARTS)},
                "raw_impl": first["impl"],
                "raw_dtype": first["dtype"],
            }
        )
    return pd.DataFrame(rows)


def _of_setup(runs: pd.DataFrame, row: Any) -> pd.DataFrame:
    """The runs of `row`'s setup (workload, global batch, world size)."""
    runs = with_setup(runs)
    for key in SETUP:
        runs = runs[runs[key] == getattr(row, key, PLAIN_STEP if key == "step_config" else None)]
    return runs


def _difference(runs: pd.DataFrame | None, row: Any, base: Any, part: str) -> tuple[float, float, float, int]:
    """`part`'s mean difference (row − base) over the setup's runs, its Welch interval and the fewest runs."""
    if runs is None or not len(runs):
        return np.nan, np.nan, np.nan, 0
    here = _of_setup(runs, row)
    a, b = here[here.variant == row.variant][part].dropna(), here[here.variant == base.variant][part].dropna()
    return (*stats.diff_ci(a, b), min(len(a), len(b)))


def _exposed_low(runs: pd.DataFrame | None, row: Any) -> float:
    """The lower bound of `row`'s variant's exposed communication (95 % t-interval over its runs); NaN with
    fewer than stats.MIN_RUNS runs."""
    if runs is None or not len(runs):
        return np.nan
    here = _of_setup(runs, row)
    return stats.mean_ci(here[here.variant == row.variant]["exposed_comm_ms"])[1]


def sentences(table: pd.DataFrame, allreduce: pd.DataFrame | None, runs: pd.DataFrame | None = None) -> list[str]:
    """One plain sentence per variant against the first variant of its setup. It gives the numbers, and
    names a cause only when that quantity's 95 % interval over `runs` (this module's `per_run`, at least
    stats.MIN_RUNS runs of each variant) excludes zero; otherwise it says the cause is not resolved."""
    said = []
    for _, group in with_setup(table).groupby(list(SETUP), sort=False):
        base = group.iloc[0]
        for row in group.iloc[1:].itertuples():
            setup = f"{row.workload}, {row.world_size} ranks, global batch {row.global_batch}"
            if getattr(row, "step_config", PLAIN_STEP) != PLAIN_STEP:
                setup += f", {row.step_config}"
            if np.isnan(row.raw_exposed_comm_ms) or np.isnan(base.raw_exposed_comm_ms):
                said.append(
                    f"{setup}: no compute baseline in some runs (--compute-baseline-steps 0 or an older "
                    "run), so their step cannot be split"
                )
                continue
            text = (
                f"{setup}: a {row.variant} step takes {row.raw_step_ms:.1f} ms vs {base.raw_step_ms:.1f} ms for "
                f"{base.variant}; compute alone {row.raw_compute_ms:.1f} vs {base.raw_compute_ms:.1f} ms, exposed "
                f"communication and overhead {row.raw_exposed_comm_ms:.1f} vs {base.raw_exposed_comm_ms:.1f} ms "
                f"({row.exposed_share} vs {base.exposed_share} of the step)"
            )
            compute = _difference(runs, row, base, "compute_ms")
            exposed = _difference(runs, row, base, "exposed_comm_ms")
            fewest = min(compute[3], exposed[3])
            unresolved = []
            if fewest >= stats.MIN_RUNS:
                for name, (diff, lo, hi, _) in (("compute", compute), ("exposed communication", exposed)):
                    if not stats.excludes_zero(lo, hi):
                        unresolved.append(f"{name} {diff:+.1f} ms ({lo:+.1f} to {hi:+.1f})")
                # Slower compute is named only when resolved and well beyond a median step's noise.
                diff, lo, hi, _ = compute
                if stats.excludes_zero(lo, hi) and diff > 0.2 * base.raw_compute_ms:
                    text += (
                        f"; the same compute takes {diff:.1f} ms longer under {row.variant} ({lo:.1f} to {hi:.1f} ms)"
                        f"{threads_words(row.variant)}"
                    )
                diff, lo, hi, _ = exposed
                if stats.excludes_zero(lo, hi):
                    more = "more" if diff > 0 else "less"
                    text += (
                        f"; {row.variant} leaves {abs(diff):.1f} ms {more} communication exposed per step "
                        f"({lo:+.1f} to {hi:+.1f} ms)"
                    )
            if row.allreduce_alone_ms == row.allreduce_alone_ms and base.allreduce_alone_ms == base.allreduce_alone_ms:
                text += (
                    f". Alone, its {row.gradient_mb:.2g} MB gradient allreduce takes {row.allreduce_alone_ms:.1f} ms "
                    f"with {row.raw_impl} vs {base.allreduce_alone_ms:.1f} ms with {base.raw_impl}; "
                    f"hidden behind compute: {row.variant} {row.hidden_share}, {base.variant} {base.hidden_share}"
                )
                beyond = [
                    f"{r.variant} {r.raw_exposed_comm_ms - r.allreduce_alone_ms:.1f} ms"
                    for r in (row, base)
                    if r.raw_exposed_comm_ms > r.allreduce_alone_ms
                ]
                if beyond:
                    # Overhead is named only when the whole interval of a variant's exposed time lies beyond it.
                    named = [r for r in (row, base) if _exposed_low(runs, r) > r.allreduce_alone_ms]
                    overhead = " (framework overhead)" if named else ""
                    text += f"; exposed time beyond the allreduce alone{overhead}: {', '.join(beyond)}"
            else:
                text += (
                    f"; no `distbench allreduce` results for {row.world_size} ranks ({row.raw_dtype}) among the "
                    "report's paths to say what the allreduce costs alone"
                )
            if fewest < stats.MIN_RUNS:
                text += (
                    f"; from {fewest} run{'s' * (fewest != 1)} of each: numbers only, no cause named "
                    f"(use --repeats {stats.MIN_RUNS} or more)"
                )
            elif unresolved:
                text += f"; not resolved from {fewest} runs: {', '.join(unresolved)}"
            said.append(text + f" (means of {row.runs} and {base.runs} runs; intervals in the table).")
    return said


def alone_table(table: pd.DataFrame, allreduce: pd.DataFrame) -> pd.DataFrame:
    """Each setup's gradient size through every measured implementation (the reference mpi4py included) and
    collective (`torch-gloo reduce_scatter_ms`: what FSDP2's reduce-scatter of the whole gradient costs)."""
    rows = []
    pairs = dict.fromkeys(zip(allreduce.impl, _collective(allreduce), strict=True))
    for (world, dtype, mb), _ in table.groupby(["world_size", "raw_dtype", "gradient_mb"], sort=False):
        if not mb or pd.isna(mb):
            continue
        row: dict[str, Any] = {"world_size": world, "dtype": dtype, "gradient_mb": mb}
        for impl, collective in pairs:
            ms = alone_ms(allreduce, impl, int(world), dtype, mb * 1e6, collective)
            name = impl if collective == "allreduce" else f"{impl} {collective}"
            row[f"{name}_ms"] = ms
            busbw = rank_side.busbw_gbps(int(mb * 1e6), ms / 1000, int(world), collective) if ms > 0 else np.nan
            row[f"{name}_busbw_gbps"] = busbw
        rows.append(row)
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars per variant (and setup, where several): compute, exposed communication, other."""
    shown = table.dropna(subset=["raw_compute_ms"])
    if not len(shown):
        return None
    from benchmarks.analysis import figures  # matplotlib only once a figure is drawn

    plt = figures.plt

    several = len(shown[list(SETUP)].drop_duplicates()) > 1
    labels = [
        f"{r.variant}\n{r.workload} w{r.world_size}" + (f"\n{r.step_config}" if r.step_config != PLAIN_STEP else "")
        if several
        else r.variant
        for r in with_setup(shown).itertuples()
    ]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(shown)), 3.8))
    bottom = np.zeros(len(shown))
    for part, colour in zip(PARTS, figures.PHASE_SHADES[1:], strict=True):
        values = shown[f"raw_{part}"].to_numpy(dtype=float).clip(min=0)
        ax.bar(labels, values, bottom=bottom, color=colour, label=part.removesuffix("_ms").replace("_", " "))
        bottom += values
    ax.set_ylabel("ms per step (mean over runs)")
    ax.set_title("Where a step goes: compute vs exposed communication vs other")
    ax.legend(fontsize=8)
    return figures.save(fig, path)


def traces(runs: pd.DataFrame, out: Path) -> pd.DataFrame:
    """The traced runs: their files (linked from the report) and, for a Horovod timeline, ms per step."""
    rows = []
    for run in runs[runs.trace_files.map(len) > 0].to_dict("records"):
        row: dict[str, Any] = {"variant": run["variant"], "run": Path(run["run_key"]).name}
        for name in run["trace_files"]:
            path = Path(run["run_key"]) / name
            row["file"] = f"[{path.name}]({os.path.relpath(path, out)})"
            if path.name.startswith("horovod_timeline") and path.is_file():
                per_step = timeline.summarize(path, int(run["trace_steps"] or 1))
                row.update({f"{k}_ms_per_step": v for k, v in per_step.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def section(
    rs: RunSet, per_run_stats: pd.DataFrame, paths: list[str | Path], out: Path, runs: pd.DataFrame | None = None
) -> Section:
    """Tables, plain sentences and figures that say why one variant is faster than another (`runs`: this
    module's `per_run(rs)`, when the caller has it already)."""
    runs = per_run(rs) if runs is None else runs
    found = Section()
    allreduce = None
    try:
        allreduce = collectives.load(*paths)
    except FileNotFoundError:
        pass
    part = collectives.report_section(paths, out)
    if part is not None:
        only = set(part.runs["collective"]) <= {"allreduce"}
        what, per = ("Allreduce", "allreduce") if only else ("Collectives", "call")
        found.tables.update(
            {f"{what} alone: bus bandwidth (GB/s)": part.busbw, f"{what} alone: time per {per} (µs)": part.time_us}
        )
        found.images += part.figures
    if not len(runs):
        return found
    table = breakdown(runs, allreduce)
    shown = table[[c for c in table.columns if not c.startswith("raw_")]]
    if allreduce is None:
        shown = shown.drop(columns=["allreduce_alone_ms", "hidden_share"])
    found.tables = {"Why: where a step goes (ms per step)": shown, **found.tables}
    if allreduce is not None and len(alone := alone_table(table, allreduce)):
        found.tables["Why: each setup's gradient allreduce alone"] = alone
    traced = traces(runs, out)
    if len(traced):
        found.tables["Traces (open in chrome://tracing or ui.perfetto.dev)"] = traced
    found.sentences = sentences(table, allreduce, runs)
    image = figure(table, out / "why_breakdown.png")
    found.images = [image, *found.images] if image is not None else found.images
    return found
