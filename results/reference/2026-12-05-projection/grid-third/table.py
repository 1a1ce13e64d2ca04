"""Rows of docs/benchmarks.md's projected-vs-measured table from each compare's projection.json.

Usage: python table.py GRID_DIR [projection|projection-nocpu]

GRID_DIR holds WORKLOAD-hHOSTS-LINK.projection.json (as kept here) or the compare
directories themselves with a projection/ inside (as run.sh and reproject.sh leave them).
"""

import json
import pathlib
import statistics
import sys


def projections(grid: pathlib.Path, sub: str) -> list[tuple[str, pathlib.Path]]:
    """(run id, projection.json) for each compare of a grid, in either layout."""
    kept = [(f.name.removesuffix(f".{sub}.json"), f) for f in grid.glob(f"*-h*-*.{sub}.json")]
    dirs = [(d.name, d / sub / "projection.json") for d in grid.glob("*-h*-*") if d.is_dir()]
    return sorted((name, f) for name, f in kept + dirs if f.exists() and not name.startswith("ar-"))


def main() -> None:
    sub = sys.argv[2] if len(sys.argv) > 2 else "projection"
    rows, errs = [], []
    for name, path in projections(pathlib.Path(sys.argv[1]), sub):
        workload, hosts, link = name.split("-")
        j = json.loads(path.read_text())
        picks = {x["ranks"]: x["pick"] for x in j["picks"]}
        measured = {x["ranks"]: x["pick"] for x in j.get("measured_picks", [])}
        for c in j["check"]:
            n = c["ranks"]
            if int(hosts[1:]) > 2:
                decision = "oversubscribed"
            else:
                decision = f"pick {measured[n]}" if n in measured else "unresolved"
            errs.append((abs(c["error"]), c["variant"]))
            interval = f"{c['measured_low_s'] * 1e3:.1f}–{c['measured_high_s'] * 1e3:.1f}"
            rows.append(
                f"| {workload} | {hosts[1:]} | {link} | {c['variant']} | "
                f"{c['projected_step_s'] * 1e3:.1f} | {c['measured_step_s'] * 1e3:.1f} ({interval}) | "
                f"{c['runs']} | {c['error'] * 100:+.0f}% | {decision} | {picks.get(n, '')} |"
            )
    print("\n".join(rows))
    a = [e for e, _ in errs]
    if a:
        over = sum(e > 0.2 for e in a)
        print(f"\n{len(a)} points: median |error| {statistics.median(a) * 100:.1f} %, over 20 %: {over}")
        for v in sorted({v for _, v in errs}):
            b = [e for e, w in errs if w == v]
            print(f"  {v}: median {statistics.median(b) * 100:.1f} %, max {max(b) * 100:.0f} %, n={len(b)}")


if __name__ == "__main__":
    main()
