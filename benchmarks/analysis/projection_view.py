"""What `distbench project` shows: its lines in the terminal, projection.json/csv, the figure, and the
report's section (benchmarks.analysis.project makes the projection). Every one is labelled a projection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks import files
from benchmarks.analysis.project import CHECK_BOUND, CSV, FIGURE, JSON, LABEL
from benchmarks.config import format_size


def write(out: Path, document: dict[str, Any], table: pd.DataFrame) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files.write_text(out / JSON, json.dumps(document, indent=2, default=float) + "\n")
    files.write_csv(table, out / CSV, index=False)
    figure(document, out / FIGURE)


EFFICIENCY = (
    "efficiency = the compute baseline's step (the same work with no communication) ÷ the step, at each N: 1 when "
    "every message hides behind compute; measured (×) from the compare's own runs, projected (o) from its inputs"
)
"""What the projection's efficiency is measured against, said on its plot and in its words."""


def figure(document: dict[str, Any], path: Path, source: str | None = None) -> Path | None:
    """Projected scaling efficiency against N (a band per variant), the measured points on it; `source`, the
    directory projected, in the title where a report shows several."""
    from benchmarks.analysis import figures  # matplotlib only once a figure is drawn

    projected = pd.DataFrame(document["projected"])
    if not len(projected):
        return None
    fig, ax = figures.plt.subplots(figsize=(7, 4.2))
    for variant, rows in projected.groupby("variant", sort=False):
        rows = rows.sort_values("ranks")
        (line,) = ax.plot(rows["ranks"], rows["efficiency"], marker="o", label=f"{variant} (projected)")
        ax.fill_between(
            rows["ranks"],
            rows["compute_s"] / rows["step_high_s"],
            rows["compute_s"] / rows["step_low_s"],
            color=line.get_color(),
            alpha=0.15,
        )
        measured = [m for m in document["measured"] if m["variant"] == variant]
        if measured:
            ax.scatter(
                [m["ranks"] for m in measured],
                [m["efficiency"] for m in measured],
                marker="x",
                s=60,
                color=line.get_color(),
                label=f"{variant} (measured)",
                zorder=3,
            )
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("ranks (N)")
    ax.set_ylabel("scaling efficiency (no-communication step ÷ step)")
    ax.set_title(f"{LABEL}: {document['workload']}" + (f"\n{source}" if source else ""), fontsize=9 if source else None)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.01, EFFICIENCY, fontsize=7, wrap=True)
    fig.subplots_adjust(bottom=0.2)
    return figures.save(fig, path)


def words(document: dict[str, Any]) -> list[str]:
    """What `distbench project` prints: the label first, per N the variants and the pick, then the check."""
    lines = [f"{LABEL.capitalize()}: {document['workload']}, from {document['source']}", f"  {EFFICIENCY}"]
    for cost in document["costs"]:
        worst = cost["worst_residual"]
        sizes = [r["size_bytes"] for r in cost["residuals"] if r["in_fit"]]
        fitted = (
            f"; fitted over {format_size(int(min(sizes)))}–{format_size(int(max(sizes)))}, worst residual {worst:+.0%}"
            if worst is not None
            else " (given, not measured)"
        )
        lines.append(
            f"  cost: {cost['label']}: α {cost['alpha_s'] * 1e6:.1f} µs per ring step, "
            + (
                f"{1 / cost['beta_s_per_byte'] / 1e9:.3f} GB/s per rank"
                if cost["beta_s_per_byte"]
                else "no per-byte cost"
            )
            + fitted
            + (
                f"; CPU per call {cost['cpu_alpha_s'] * 1e6:.1f} µs per ring step + "
                f"{cost['cpu_beta_s_per_byte'] * 1e9:.2f} ns per byte"
                if cost.get("cpu_alpha_s") is not None
                else ""
            )
        )
    projected = pd.DataFrame(document["projected"])
    by_n = {p["ranks"]: p for p in document["picks"]}
    for n, rows in projected.groupby("ranks"):
        lines.append(
            f"N = {n}: projected pick {by_n[n]['pick']}" + ("" if by_n[n]["bands_apart"] else ", within the bands")
        )
        for r in rows.itertuples():
            hidden = (
                "" if r.hidden_share != r.hidden_share or r.hidden_share is None else f", {r.hidden_share:.0%} hidden"
            )
            taken = getattr(r, "cpu_taken_s", 0.0)
            cpu = f", {taken * 1e3:.1f} ms of compute's CPU" if taken and taken == taken else ""
            lines.append(
                f"  {r.variant:<16} step {r.step_s * 1e3:8.1f} ms ({r.step_low_s * 1e3:.1f}–{r.step_high_s * 1e3:.1f})"
                f"  {r.samples_per_s:10.1f} samples/s  efficiency {r.efficiency:.0%}"
                f"  communication {r.comm_s * 1e3:.1f} ms{hidden}{cpu}"
            )
    if document["not_projected"]:
        lines.append(f"not projected (no cost for their collectives): {', '.join(document['not_projected'])}")
    if document["check"]:
        given = all(c["worst_residual"] is None for c in document["costs"])
        lines.append(
            "checked against the measured runs (projected from each world size's own inputs"
            + ("; at the link given, which is theirs only if they ran on it):" if given else "):")
        )
        for c in document["check"]:
            spread = (
                f"{c['measured_low_s'] * 1e3:.1f}–{c['measured_high_s'] * 1e3:.1f}, {c['runs']} runs"
                if c["runs"] > 1
                else "1 run, no interval"
            )
            lines.append(
                f"  {c['variant']:<16} N = {c['ranks']}: projected {c['projected_step_s'] * 1e3:.1f} ms, measured "
                f"{c['measured_step_s'] * 1e3:.1f} ms ({spread}): {c['error']:+.0%}"
            )
        off = [
            f"{c['variant']} at N = {c['ranks']} ({c['error']:+.0%})"
            for c in document["check"]
            if abs(c["error"]) > CHECK_BOUND
        ]
        if off:
            lines.append(
                f"warning: the projection misses the measured step by more than {CHECK_BOUND:.0%} for "
                f"{', '.join(off)}: the picks above rest on a model that does not hold there (docs/benchmarks.md, "
                "where the model is wrong)"
            )
    checked = pd.DataFrame(document["check"])
    projected_pick = (
        {int(n): at.loc[at["projected_step_s"].idxmin(), "variant"] for n, at in checked.groupby("ranks")}
        if len(checked)
        else {}
    )
    for m in document["measured_picks"]:
        said = projected_pick.get(m["ranks"])
        agree = "agrees" if said == m["pick"] else f"projected {said or 'nothing'} there"
        lines.append(f"measured decision at N = {m['ranks']} (resolved): pick {m['pick']}; the projection {agree}")
    lines.append("assumptions: " + "; ".join(document["assumptions"]))
    lines.append(f"band: {document['band']}")
    return lines


def report_section(paths: list[str | Path], out: Path) -> tuple[list[Path], pd.DataFrame] | None:
    """Every `distbench project` made for the report's directories: each figure redrawn into `out` and one
    table, each labelled a projection; with more than one, each row and figure names its directory."""
    documents = [json.loads(t.read_text()) for t in (Path(p) / "projection" / JSON for p in paths) if t.is_file()]
    documents = [d for d in documents if d["projected"]]
    if not documents:
        return None
    several = len(documents) > 1
    images, tables = [], []
    for k, document in enumerate(documents, start=1):
        name = f"{Path(FIGURE).stem}-{k}{Path(FIGURE).suffix}" if several else FIGURE
        images.append(figure(document, out / name, document["source"] if several else None))
        table = pd.DataFrame(document["projected"])
        shown = table[["variant", "ranks", "step_s", "step_low_s", "step_high_s", "samples_per_s", "efficiency"]]
        shown = shown.assign(hidden_share=table["hidden_share"])
        tables.append(shown.assign(source=document["source"]) if several else shown)
    return [i for i in images if i is not None], pd.concat(tables, ignore_index=True)
