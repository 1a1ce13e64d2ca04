"""Fault injection for testing failure handling: `--inject-fault MODE@STEP[:RANK]`.

At the start of optimizer step STEP (1-based, counted across epochs), on rank RANK (every rank when
omitted), the process fails in one of the ways real jobs fail — the same list PyTorch's own c10d tests
use: `exception`, `exit0` (sys.exit(0)), `exit1`, `abort` (os.abort), `sigkill`, `sigterm`, and `hang`
(sleeps forever, so the other ranks must time out).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass

MODES = ("exception", "exit0", "exit1", "abort", "sigkill", "sigterm", "hang")


class InjectedFault(RuntimeError):
    """Raised by `--inject-fault exception@…`."""


@dataclass(frozen=True)
class Fault:
    mode: str
    step: int
    rank: int | None = None

    @classmethod
    def parse(cls, text: str) -> Fault:
        match = re.fullmatch(r"([a-z0-9]+)@(\d+)(?::(\d+))?", text.strip())
        if not match or match.group(1) not in MODES or int(match.group(2)) < 1:
            raise ValueError(
                f"--inject-fault takes MODE@STEP[:RANK] with MODE one of {', '.join(MODES)} and STEP >= 1, "
                f"e.g. sigkill@3:1; got {text!r}"
            )
        return cls(match.group(1), int(match.group(2)), int(match.group(3)) if match.group(3) else None)

    def maybe_fire(self, step: int, rank: int) -> None:
        if step != self.step or (self.rank is not None and rank != self.rank):
            return
        print(f"distbench: injecting fault {self.mode} at step {step} on rank {rank}", file=sys.stderr, flush=True)
        if self.mode == "exception":
            raise InjectedFault(f"injected exception at step {step} on rank {rank}")
        if self.mode in ("exit0", "exit1"):
            sys.exit(int(self.mode[-1]))
        if self.mode == "abort":
            os.abort()
        if self.mode in ("sigkill", "sigterm"):
            os.kill(os.getpid(), signal.SIGKILL if self.mode == "sigkill" else signal.SIGTERM)
            time.sleep(60)  # a signal is delivered asynchronously; never carry on training
        while self.mode == "hang":
            time.sleep(3600)
