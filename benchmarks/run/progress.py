"""Rank 0's progress display: a tqdm bar on a terminal, a line every tenth of the work otherwise.

horovodrun and mpirun pass each rank's stderr through a pipe, prefixing every line with the rank, so a
redrawn bar turns into noise there; plain lines stay readable in logs.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm


class LineProgress:
    """The subset of tqdm the harness uses, printing whole lines."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done, self.postfix = total, desc, 0, ""
        self.every = max(1, total // 10)
        self.start = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done % self.every == 0 or self.done == self.total:
            rate = self.done / max(time.monotonic() - self.start, 1e-9)
            print(
                f"{self.desc}: {self.done}/{self.total} steps, {rate:.1f} step/s {self.postfix}".rstrip(),
                file=sys.stderr,
                flush=True,
            )

    def set_postfix(self, **values: Any) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        pass


def loss_words(row: dict[str, Any]) -> str:
    """The last gathered train loss, with the step it is of: rows reach rank 0 only at a flush (every
    --flush-every steps), so the bar would otherwise show an old number as if it were current."""
    return f"loss {row['loss']:.4f} at step {row['step']} (all ranks)"


def progress(total: int, desc: str, enabled: bool) -> tqdm | LineProgress:
    if enabled and not sys.stderr.isatty():
        return LineProgress(total, desc)
    return tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True, desc=desc, disable=not enabled)
