"""Execute results/compare.ipynb headless from the repository root: `make notebook`.

    python results/execute_notebook.py [OUT]    (default: $TMPDIR/distbench-compare.ipynb)

The executed copy, outputs and plots included, goes outside the tree: the committed notebook stays
without outputs, so it never goes stale against the reference data.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "results" / "compare.ipynb"
DEFAULT_OUT = Path(tempfile.gettempdir()) / "distbench-compare.ipynb"
CELL_TIMEOUT_S = 300


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        print(f"distbench: error: {NOTEBOOK.name} failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
