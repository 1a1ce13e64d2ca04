"""Errors and exit codes that every layer raises or returns, and the one-line way they are said.

A leaf: it imports nothing of distbench, so the rank side, the analysis, the orchestration and the CLI
all report bad input the same way without importing one another.
"""

from __future__ import annotations

import os
import signal
import sys
import time

EXIT_BAD_INPUT = 2
"""Bad input, caught before any work: one line naming the fix, no result files."""

EXIT_INTERRUPTED = 130
"""Stopped by SIGINT or SIGTERM (128 + SIGINT, as a shell reports Ctrl-C): what completed is kept."""

RANK0_GRACE_S = 10.0
"""How long a rank other than 0 waits before exiting on bad input, so that rank 0 has said it."""


class InputError(ValueError):
    """Bad input caught before any work: one line naming the fix, exit code 2, no result files."""

    said = False
    """True once rank 0 has printed it (found after start-up, it is said before the backend shuts down)."""
    rank0_grace_s = RANK0_GRACE_S
    """How long a rank other than 0 waits for rank 0 to say it: longer where rank 0 may reach the same error
    much later (DeepSpeed's op, which the ranks of a machine try to build in turn)."""


def error(message: str) -> None:
    """Say one error line on stderr, as `distbench: error: ...`."""
    print(f"distbench: error: {message}", file=sys.stderr, flush=True)


def bad_input(rank: int, exc: Exception) -> int:
    """Every rank sees the same input, so only rank 0 says what is wrong; every rank exits 2."""
    if rank == 0:
        if not getattr(exc, "said", False):
            error(str(exc))
    else:
        # A launcher stops the whole job when the first rank exits: leaving before rank 0 has printed
        # would lose the only line. Rank 0's exit ends this wait early, through the launcher's SIGTERM,
        # which must then end this rank quietly (no traceback, no failure recorded: nothing ran).
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(EXIT_BAD_INPUT))
        time.sleep(getattr(exc, "rank0_grace_s", RANK0_GRACE_S))
    return EXIT_BAD_INPUT
