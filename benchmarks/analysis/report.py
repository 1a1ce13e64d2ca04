"""Write a report: decision.json, the PNG figures, and report.md / a self-contained report.html.

Both pages come from Jinja2 templates (templates/) in one order: the decision first, then the plots,
the Why sentences, the terminal summary, and the tables, long ones folded. The returned text is what
`compare` and `report` print: the decision's words first, then the summary tables.
"""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd

from benchmarks import files
from benchmarks.analysis import (
    collectives,
    context,
    decision,
    decision_words,
    evaluation,
    figures,
    load,
    projection_view,
    rundir,
    tables,
    terminal,
    why,
)
from benchmarks.analysis.load import RunSet

__all__ = ["RunSet", "write"]


FOLD_ROWS = 8
"""Tables longer than this are folded (`<details>`) in report.html; the per-run table always is."""
ALWAYS_FOLDED = ("Per run",)
PATH_COLUMNS = ("run_key", "path")
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("benchmarks.analysis", "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


@dataclass
class Page:
    """What one report shows, in its order; the templates lay it out."""

    headline: str = ""
    decision: dict[str, Any] | None = None
    images: list[Path] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    summary: str = ""
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


def write(
    paths: list[str | Path],
    out: Path,
    formats: set[str],
    include_failed: bool = False,
    extra: dict[str, pd.DataFrame] | None = None,
    known: dict[str, Any] | None = None,
) -> str:
    """Write decision.json, PNGs and report.md/report.html into `out`; return the decision in words and the
    summary tables. `extra` adds tables of the caller's own at the end (tune's default vs tuned); `known`
    is what the caller knows of the decision: "plan" (compare's precision or two-stage plan; else a
    plan.json among `paths`), "knobs" (tune's kept knobs per variant), "command" (the command to rerun),
    "memory_limit_mb" (compare's --memory-limit-mb).
    Paths holding only `distbench allreduce` runs give a report of those alone."""
    if not any(not rundir.is_allreduce(d) for d in load.find_run_dirs(*paths)):
        allreduce = collectives.report_section(paths, out)
        if allreduce is not None:
            sections = {
                "Allreduce runs": allreduce.runs.drop(columns=["run_key"]),
                "Allreduce: bus bandwidth (GB/s)": allreduce.busbw,
                "Allreduce: time per allreduce (µs)": allreduce.time_us,
            }
            text = "\n".join([allreduce.text, *allreduce.notes])
            _write_files(Page(summary=text, images=allreduce.figures, tables=sections), out, formats)
            return text
    rs = load.load_runs(*paths, include_failed=include_failed)
    for line in rs.skipped:
        print(f"distbench: left out {line}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    per_run = tables.per_run_stats(rs)  # left-out runs included, so a failed backend shows as FAILED
    validated = evaluation.validation_table(per_run)  # every run since schema 4: each validation timed
    evaluated = evaluation.eval_only(per_run)
    if evaluated.all():  # `--eval-only` runs alone: no training to tabulate or decide on
        return _evaluation_page(per_run, validated, out, formats)
    per_run = per_run[~evaluated]  # training's tables, plots and decision; eval-only runs are validation's
    given = known or {}
    plan = given.get("plan") or decision.read_plan(paths)
    table = tables.backend_table(per_run, plan)  # the decision's intervals
    summary = terminal.format_table(table, tables.loss_agreement(rs))
    scale = evaluation.eval_scaling(tables.scaling(per_run), per_run)  # evaluation's beside training's
    if len(scale):
        summary += "\n\n" + terminal.format_scaling(scale)
    if len(validated):
        summary += "\n\n" + evaluation.format_validation(validated)
    names = dict(zip(per_run.run_key.astype(str), per_run.backend.astype(str), strict=True))  # launchers split
    order = list(dict.fromkeys(table["backend"].astype(str))) if "backend" in table else None  # one position each
    # Plots of what completed: each is None when nothing it would show did.
    images = [
        figures.throughput(table, out / "throughput.png"),
        figures.step_times(rs, out / "step_times.png", names, order),
        figures.phases(tables.phase_breakdown(rs, names), out / "phases.png", order),
        figures.loss_curves(rs, out / "loss_curves.png", names, order),
    ]
    if len(scale):  # some variant at two or more world sizes: a curve, never a lone point
        images.append(figures.scaling_efficiency(scale, out / "scaling.png"))
    images.append(evaluation.scaling_figure(validated, out / "eval_scaling.png"))
    breakdown = why.per_run(rs)
    explained = why.section(rs, per_run, paths, out, breakdown)
    decided = decision.decide(
        per_run, breakdown, scale, plan, given.get("knobs"), given.get("command", ""), given.get("memory_limit_mb")
    )
    decision.write(out, decided)
    sections = {
        "Per backend": table,
        "What was compared": context.setup_table(rs, per_run),
        "Backends: launch, threads, versions": context.backend_facts(rs),
        "Knobs and options that differ between the variants": context.differing_options(rs),
    }
    if len(scale):
        sections[
            "Scaling (efficiency T(n) / (n × T(1)): each variant against its own 1-rank runs and against single)"
        ] = scale
    if len(validated):
        sections["Distributed validation (per strategy and world size; docs/evaluation.md)"] = validated
    sections.update(explained.tables)
    projected = projection_view.report_section(paths, out)
    if projected is not None:
        sections[f"{projection_view.LABEL.capitalize()}: step time at N ranks (`distbench project`)"] = projected[1]
    sections.update(extra or {})
    sections["Per run"] = per_run
    pooled = context.pooled_settings(rs)
    if pooled:
        summary += "\n" + "\n".join(pooled)
    page = Page(
        headline=context.headline(rs, per_run),
        decision=decided,
        images=[
            image for image in [*images, *explained.images, *(projected[0] if projected else [])] if image is not None
        ],
        why=explained.sentences,
        summary=summary,
        tables=sections,
    )
    _write_files(page, out, formats)
    said = [*decision_words.words(decided), "", page.headline, summary]
    if explained.sentences:
        said += ["", "Why:", *(f"- {line}" for line in explained.sentences)]
    return "\n".join(said)


def _evaluation_page(per_run: pd.DataFrame, validated: pd.DataFrame, out: Path, formats: set[str]) -> str:
    """The report of `--eval-only` runs: evaluation throughput per strategy and world size, and its scaling."""
    text = evaluation.format_validation(validated) if len(validated) else "no completed evaluation"
    image = evaluation.scaling_figure(validated, out / "eval_scaling.png")
    sections = {
        "Distributed validation (per strategy and world size; docs/evaluation.md)": validated,
        "Per run": per_run,
    }
    decided = decision.decide(per_run.iloc[:0])  # no training, so no setup to decide on; compare copies it
    decision.write(out, decided)
    page = Page(decision=decided, summary=text, images=[image] if image else [], tables=sections)
    _write_files(page, out, formats)
    return "\n".join([*decision_words.words(decided), "", text])


def _cell(column: str, value: Any) -> dict[str, Any]:
    """A table cell for reading: numbers rounded and right-aligned, a run's directory by its name."""
    if isinstance(value, (bool, np.bool_)) or value is None or (isinstance(value, float) and np.isnan(value)):
        return {"text": "" if value is None or value != value else str(value), "num": False}
    if isinstance(value, (int, np.integer)):
        return {"text": str(value), "num": True}
    if isinstance(value, (float, np.floating)):
        return {"text": f"{value:.4g}", "num": True}
    text = str(value)
    if column in PATH_COLUMNS and "/" in text:
        text = Path(text).name
    return {"text": text, "num": False}


def _html_table(title: str, frame: pd.DataFrame) -> dict[str, Any]:
    # A column empty in every row (CUDA's on CPU, a scaling study's in one of one size) says nothing: left out.
    frame = frame[[c for c in frame.columns if (frame[c].notna() & (frame[c].astype(str) != "")).any()]]
    if title == "Per backend" and len(frame) > 1:  # what every row shares is said above it (What was compared)
        same = [
            c for c in frame.columns if c not in ("variant", "samples_per_s") and frame[c].astype(str).nunique() == 1
        ]
        frame = frame.drop(columns=[*same, *(["backend"] if "variant" in frame else [])])
    rows = [
        [_cell(str(c), v) for c, v in zip(frame.columns, row, strict=True)] for row in frame.itertuples(index=False)
    ]
    folded = title.startswith(ALWAYS_FOLDED) or len(frame) > FOLD_ROWS
    return {"title": title, "columns": [str(c) for c in frame.columns], "rows": rows, "folded": folded}


def _write_files(page: Page, out: Path, formats: set[str]) -> None:
    """report.md and/or report.html from the templates, in the page's order."""
    out.mkdir(parents=True, exist_ok=True)
    decisions = decision_words.paragraphs(page.decision) if page.decision else []
    for d in decisions:
        d["status_class"] = d["status"] if d["status"] in ("unresolved", "none") else "resolved"
    steps = decision_words.step_words(page.decision) if page.decision else []
    common = {
        "headline": page.headline,
        "decisions": decisions,
        "steps": steps,
        "why": page.why,
        "summary": page.summary,
    }
    if "md" in formats:
        md_tables = [{"title": t, "markdown": terminal.markdown_table(f)} for t, f in page.tables.items()]
        images = [{"name": p.stem, "file": p.name} for p in page.images]
        text = TEMPLATES.get_template("report.md.j2").render(**common, images=images, tables=md_tables)
        files.write_text(out / "report.md", text)
    if "html" in formats:
        images = [{"name": p.stem, "data": base64.b64encode(p.read_bytes()).decode()} for p in page.images]
        html_tables = [_html_table(t, f) for t, f in page.tables.items()]
        text = TEMPLATES.get_template("report.html.j2").render(**common, images=images, tables=html_tables)
        files.write_text(out / "report.html", text)
