"""Write a report: the PNG figures and report.md / a self-contained report.html around them.

It opens with what was compared (`context`), then the summary table with its warnings and verdicts,
then the tables behind it and the plots.
"""

from __future__ import annotations

import base64
import html
import sys
from pathlib import Path

import pandas as pd

from benchmarks.analysis import collectives, context, figures, load, tables, why
from benchmarks.analysis.load import RunSet

__all__ = ["RunSet", "write"]


def write(
    paths: list[str | Path],
    out: Path,
    formats: set[str],
    include_failed: bool = False,
    extra: dict[str, pd.DataFrame] | None = None,
) -> str:
    """Write PNGs and report.md/report.html into `out`; return what was compared and the summary table.
    `extra` adds tables of the caller's own at the end (tune's default vs tuned). Paths holding only
    `distbench allreduce` runs give a report of those alone."""
    if not any(not load.is_allreduce_dir(d) for d in load.find_run_dirs(*paths)):
        allreduce = collectives.report_section(paths, out)
        if allreduce is not None:
            sections = {"Allreduce runs": allreduce.runs.drop(columns=["run_key"]),
                        "Allreduce: bus bandwidth (GB/s)": allreduce.busbw,
                        "Allreduce: time per allreduce (µs)": allreduce.time_us}  # fmt: skip
            text = "\n".join([allreduce.text, *allreduce.notes])
            _write_files(sections, ("Allreduce runs", text), allreduce.figures, out, formats)
            return text
    rs = load.load_runs(*paths, include_failed=include_failed)
    for line in rs.skipped:
        print(f"distbench: left out {line}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    per_run = tables.per_run_stats(rs)  # left-out runs included, so a failed backend shows as FAILED
    table = tables.backend_table(per_run)
    summary = context.headline(rs, per_run) + "\n" + tables.format_table(table, tables.loss_agreement(rs))
    scale = tables.scaling(per_run)
    if len(scale):
        summary += "\n\n" + tables.format_scaling(scale)
    names = dict(zip(per_run.run_key.astype(str), per_run.backend.astype(str), strict=True))  # launchers split
    # Plots of what completed: each is None when nothing it would show did.
    images = [
        figures.throughput(table, out / "throughput.png"),
        figures.step_times(rs, out / "step_times.png", names),
        figures.phases(tables.phase_breakdown(rs, names), out / "phases.png"),
        figures.loss_curves(rs, out / "loss_curves.png", names),
    ]
    if len(scale):  # some variant at two or more world sizes: a curve, never a lone point
        images.append(figures.scaling_efficiency(scale, out / "scaling.png"))
    explained = why.section(rs, per_run, paths, out)
    images = [image for image in [*images, *explained.images] if image is not None]
    sections = {
        "What was compared": context.setup_table(rs, per_run),
        "Backends: launch, threads, versions": context.backend_facts(rs),
        "Knobs and options that differ between the backends": context.differing_options(rs),
        "Per backend": table,
        "Per run": per_run,
    }
    if len(scale):
        sections[
            "Scaling (efficiency T(n) / (n × T(1)): each variant against its own 1-rank runs and against single)"
        ] = scale
    sections.update(explained.tables)
    sections.update(extra or {})
    pooled = context.pooled_settings(rs)
    if pooled:
        summary += "\n" + "\n".join(pooled)
    if explained.sentences:
        summary += "\n\nWhy:\n" + "\n".join(f"- {line}" for line in explained.sentences)
    _write_files(sections, ("Knobs", summary), images, out, formats)
    return summary


def _write_files(
    sections: dict[str, pd.DataFrame], summary: tuple[str, str], images: list[Path], out: Path, formats: set[str]
) -> None:
    """report.md and/or report.html: the tables in order, the summary text after the section whose title
    starts with summary[0], then the images."""
    after, text = summary
    if "md" in formats:
        md = ["# distbench report", ""]
        for title, frame in sections.items():
            md += [f"## {title}", "", tables.markdown_table(frame), ""]
            if title.startswith(after):
                md += ["## Summary", "", "```", text, "```", ""]
        md += [f"![{p.stem}]({p.name})" for p in images]
        (out / "report.md").write_text("\n".join(md) + "\n")
    if "html" in formats:
        parts = ["<!doctype html><meta charset='utf-8'><title>distbench report</title>", "<h1>distbench report</h1>"]
        for title, frame in sections.items():
            parts += [f"<h2>{html.escape(title)}</h2>", frame.to_html(index=False, float_format="%.4g", na_rep="")]
            if title.startswith(after):
                parts += ["<h2>Summary</h2>", f"<pre>{html.escape(text)}</pre>"]
        for p in images:
            data = base64.b64encode(p.read_bytes()).decode()
            parts.append(f"<p><img alt='{p.stem}' src='data:image/png;base64,{data}'></p>")
        (out / "report.html").write_text("\n".join(parts) + "\n")
