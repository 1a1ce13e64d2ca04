"""Execute results/compare.ipynb headless from the repository root: `make notebook`.

    python results/execute_notebook.py [OUT [RUNS]]   (default: $TMPDIR/distbench-compare.ipynb, the reference)

The executed copy, outputs and plots included, goes outside the tree (the report it writes beside it, in
OUT's name with `-report`): the committed notebook stays without outputs, so it never goes stale against the
reference data. RUNS, a compare directory of your own, is what it reads instead of the committed reference.
"""

from __future__ import annotations

import os
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
    if len(argv) > 2 and argv[2]:
        runs = Path(argv[2]).resolve()
        if not runs.is_dir():
            print(f"distbench: error: RUNS={argv[2]} is not a directory; give a compare directory", file=sys.stderr)
            return 2
        os.environ["DISTBENCH_RUNS"] = str(runs)  # the kernel inherits this process's environment
    os.environ["DISTBENCH_REPORT_OUT"] = str(out.with_name(f"{out.stem}-report").resolve())
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
