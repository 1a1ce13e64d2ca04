"""`compare --nproc 1,2` over a variant and single: the scaling table, recomputed by hand from comparison.csv."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from benchmarks.analysis import load, tables
from tests.helpers import BIN, run_ok

TINY = [
    "--workload",
    "linear",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "6",
    "--warmup-steps",
    "1",
    "--train-size",
    "512",
    "--val-size",
    "64",
    "--batch-size",
    "8",
    "--quiet",
]


def geomean(values: pd.Series) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# Scaling × variants: `make test` scales ddp beside single, `make test-all` horovod@mpi beside single.
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("variant", "launcher", "controller"),
    [("ddp@torchrun", "torchrun", ""), pytest.param("horovod@mpi", "horovodrun", "mpi", marks=pytest.mark.full_matrix)],
)
def test_two_variants_at_two_world_sizes_give_the_hand_computed_efficiency(
    tmp_path, variant: str, launcher: str, controller: str, horovod_available
) -> None:
    cmd = [
        str(BIN / "distbench"),
        "compare",
        "--backends",
        f"{variant},single",
        "--nproc",
        "1,2",
        "--repeats",
        "1",
        *TINY,
        "--out",
        str(tmp_path),
        "--run-id",
        "s",
    ]
    proc = run_ok(cmd, timeout=220)
    root = tmp_path / "s"
    csv = pd.read_csv(root / "comparison.csv")
    # Interleaved: every variant at 1 rank, then every variant at 2.
    assert list(zip(csv.variant, csv.nproc, strict=True)) == [(variant, 1), ("single", 1), (variant, 2), ("single", 2)]
    assert (csv.status == "completed").all() and set(csv.scaling) == {"weak"}
    assert list(csv.launcher) == [launcher, "python"] * 2  # read back from run.json
    assert [c if isinstance(c, str) else "" for c in csv.controller] == [controller, ""] * 2
    assert list(csv.batch_size) == [8, 8, 8, 16] and list(csv.global_batch) == [8, 8, 16, 16]
    assert not csv.oversubscribed.any()  # 2 ranks on 2 cores

    # By hand from comparison.csv: T(n) is the geometric mean over repeats; efficiency T(n) / (n × T(1)).
    scale = tables.scaling(tables.per_run_stats(load.load_runs(root))).set_index(["variant", "world_size"])
    assert set(scale.index) == {(variant, n) for n in (1, 2)}
    single_1 = geomean(csv[(csv.variant == "single") & (csv.nproc == 1)].samples_per_s)
    t = {n: geomean(csv[(csv.variant == variant) & (csv.nproc == n)].samples_per_s) for n in (1, 2)}
    row = scale.loc[(variant, 2)]
    assert row.samples_per_s == pytest.approx(t[2])
    assert row.efficiency == pytest.approx(t[2] / (2 * t[1]))
    assert row.vs_single == pytest.approx(t[2] / (2 * single_1))
    assert math.isnan(row.efficiency_low)  # one repeat: no interval
    assert scale.loc[(variant, 1), "efficiency"] == pytest.approx(1.0)
    # The terminal table and the report show it.
    assert "scaling (efficiency = T(n) / (n × T(1))" in proc.stdout
    assert any(
        line.startswith(variant) and f" {row.efficiency:.2f} (no CI" in line for line in proc.stdout.splitlines()
    )
    md = (root / "report" / "report.md").read_text()
    assert "## Scaling" in md and "vs_single" in md and (root / "report" / "scaling.png").is_file()
