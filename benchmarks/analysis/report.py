"""Write a report: the PNG figures and report.md / a self-contained report.html around them."""

from __future__ import annotations

import base64
import html
import sys
from pathlib import Path

import pandas as pd

from benchmarks.analysis import figures, load, tables


def _markdown(frame: pd.DataFrame) -> str:
    def cell(value: object) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def write(paths: list[str | Path], out: Path, formats: set[str], include_failed: bool = False) -> str:
    """Write PNGs and report.md/report.html into `out`; return the terminal summary table."""
    rs = load.load_runs(*paths, include_failed=include_failed)
    for line in rs.skipped:
        print(f"distbench: left out {line} (--include-failed takes it)", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    per_run = tables.per_run_stats(rs)
    table = tables.backend_table(per_run)
    summary = tables.format_table(table, tables.loss_agreement(rs))
    scale = tables.scaling(per_run)
    images = [figures.throughput(table, out / "throughput.png")]
    if len(rs.timing):
        images += [
            figures.step_times(rs, out / "step_times.png"),
            figures.phases(tables.phase_breakdown(rs), out / "phases.png"),
        ]
    if len(rs.loss):
        images.append(figures.loss_curves(rs, out / "loss_curves.png"))
    if len(scale):
        images.append(figures.scaling_efficiency(scale, out / "scaling.png"))
    sections = {"Per backend": table, "Per run": per_run}
    if len(scale):
        sections["Scaling"] = scale
    if "md" in formats:
        md = ["# distbench report", "", "```", summary, "```", ""]
        for title, frame in sections.items():
            md += [f"## {title}", "", _markdown(frame), ""]
        md += [f"![{p.stem}]({p.name})" for p in images]
        (out / "report.md").write_text("\n".join(md) + "\n")
    if "html" in formats:
        parts = ["<!doctype html><meta charset='utf-8'><title>distbench report</title>",
                 "<h1>distbench report</h1>", f"<pre>{html.escape(summary)}</pre>"]  # fmt: skip
        for title, frame in sections.items():
            parts += [f"<h2>{html.escape(title)}</h2>", frame.to_html(index=False, float_format="%.4g")]
        for p in images:
            data = base64.b64encode(p.read_bytes()).decode()
            parts.append(f"<p><img alt='{p.stem}' src='data:image/png;base64,{data}'></p>")
        (out / "report.html").write_text("\n".join(parts) + "\n")
    return summary
