"""The report's "why" section: where a step's time goes (being written, issue 10)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from benchmarks.analysis.load import RunSet


@dataclass
class Section:
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)
    images: list[Path] = field(default_factory=list)


def section(rs: RunSet, per_run: pd.DataFrame, paths: list[str | Path], out: Path) -> Section:
    """Tables, plain sentences and figures that say why one backend is faster."""
    return Section()
