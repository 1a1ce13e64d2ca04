"""`distbench tune` end to end on a 2 × 1 and a 2 × 2 grid: it picks the argmax of its own tune.csv."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.helpers import BIN, run_ok

TINY = [
    "--workload",
    "linear",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "8",
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


# `make test` tunes over one knob's two values; the 2 × 2 grid (two knobs crossed) is `full_matrix`.
# DDP's default gives no bucket_cap_mb (its first bucket 1 MiB), so no point of these grids is the default: a cap of 25
# also caps the first bucket at 25, and the default's own final runs are always made beside the best's.
GRIDS = {  # shape: (the grid's knobs, its points as (bucket_cap_mb, gradient_as_bucket_view))
    "2x1": ("bucket_cap_mb = [1, 25]", {(1.0, False), (25.0, False)}),
    "2x2": (
        "bucket_cap_mb = [1, 25]\ngradient_as_bucket_view = [false, true]",
        {(1.0, False), (1.0, True), (25.0, False), (25.0, True)},
    ),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shape", ["2x1", pytest.param("2x2", marks=pytest.mark.full_matrix)])
def test_tune_on_a_two_by_two_grid_picks_the_argmax_of_its_tune_csv(tmp_path, shape: str) -> None:
    knobs, points = GRIDS[shape]
    grid = tmp_path / "grid.toml"
    grid.write_text(f"[ddp]\n{knobs}\n")
    cmd = [
        str(BIN / "distbench"),
        "tune",
        "--backends",
        "ddp",
        "--grid",
        str(grid),
        "--repeats",
        "1",
        "--tune-repeats",
        "1",
        "--tune-steps",
        "6",
        *TINY,
        "--out",
        str(tmp_path),
        "--run-id",
        "t",
    ]
    proc = run_ok(cmd, timeout=220)
    root = tmp_path / "t"
    sweep = pd.read_csv(root / "tune.csv")
    assert len(sweep) == len(points) and (sweep.status == "completed").all()
    views = sweep.get("gradient_as_bucket_view", pd.Series(False, sweep.index)).fillna(False).astype(bool)
    assert set(zip(sweep.bucket_cap_mb, views, strict=True)) == points
    argmax = sweep.loc[sweep.samples_per_s.idxmax()]  # one repeat: a point's mean is its run
    assert sweep.best.sum() == 1 and sweep.loc[sweep.best, "point"].item() == argmax.point
    tuned = pd.read_csv(root / "tuned.csv").set_index("variant")
    assert tuned.loc["ddp@torchrun", "best"] == argmax.point
    # One final repeat of each gives no interval: the default is kept, and why is said.
    assert tuned.loc["ddp@torchrun", "kept"] == "default" and "no interval" in tuned.loc["ddp@torchrun", "why"]
    final = pd.read_csv(root / "final" / "comparison.csv")
    assert list(final.setting) == ["default", "best"] and (final.status == "completed").all()
    flags = final.loc[final.setting == "best", "command"].item()  # the best point's knobs reached the run
    assert f"--bucket-cap-mb {argmax.bucket_cap_mb}" in flags
    assert ("--gradient-as-bucket-view" in flags) == bool(views[argmax.name])
    assert "--bucket-cap-mb" not in final.loc[final.setting == "default", "command"].item()  # DDP's own buckets
    assert "default vs tuned" in proc.stdout and proc.stdout.strip().splitlines()[-1] == str(root)
    md = (root / "report" / "report.md").read_text()
    assert "## Default vs tuned (distbench tune)" in md
