"""`distbench project` checked against measurement at one small point: 2 emulated hosts, one link rate, the
allreduce swept there and a compare run there; the projection at the measured size is within the bound of
docs/benchmarks.md (20 %), and a negative control — every message sent only after backward, the overlap
modelled away — moves DDP's projection away from the measurement by more than half that bound. The allreduce is
swept before and after the compare and each variant runs twice, so that a slow stretch of the machine falls on
both sides alike. (That it
lands outside the bound, as on a faster machine, does not hold here: on one-core emulated hosts the overlap
is worth only 12–30 % of the step, its CPU taken from backward, about the bound itself, while runs differ by
±10 %; docs/benchmarks.md.) Needs root (namespaces): skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from benchmarks.analysis import project
from benchmarks.suite import cluster as emulation
from tests.helpers import BIN, run_cmd, run_ok

DISTBENCH = str(BIN / "distbench")
BOUND = project.CHECK_BOUND
LINK = "1gbit"
MOVED = BOUND / 2
"""The least the negative control moves DDP's projection, as a share of the measured step."""
SIZES = ["--sizes", "65536,262144,1048576,4194304"]
POINT = [
    *("--workload", "transformer", "--batch-size", "12", "--bucket-cap-mb", "0.25"),
    *("--epochs", "4", "--steps-per-epoch", "20", "--val-size", "128"),
    *("--compute-baseline-steps", "20", "--compute-baseline-spread"),
]
"""DDP's buckets at 0.25 MB (one a weight) so that it, like Horovod, has gradients on the wire during
backward, and a batch whose backward is about as long as its communication at 1 Gbit: the negative
control then has overlap to take away. The compute baseline is spread over four short epochs: this
machine's speed drifts by up to 2× over seconds, and a baseline timed only at the end may fall in
another stretch than the steps it is set against."""


@pytest.mark.skipif(emulation.missing_rights() is not None, reason=f"no emulated hosts: {emulation.missing_rights()}")
@pytest.mark.timeout(900)  # above its steps' own timeouts, so that `cluster down` always runs
def test_the_projection_holds_at_two_emulated_hosts_and_moves_with_the_overlap_modelled_away(tmp_path: Path) -> None:
    name = f"p{secrets.token_hex(3)}"
    run_ok([DISTBENCH, "cluster", "up", "--hosts", "2", "--link", LINK, "--name", name], timeout=60)
    sweep = ["allreduce", "--compare", "--cluster", name, "--impls", "torch,horovod-gloo", *SIZES]
    try:
        # The sweep before and after the compare, each variant twice between: each side's stretches of the
        # machine's drifting speed are sampled alike (docs/benchmarks.md, the test's point).
        run_ok([DISTBENCH, *sweep, "--out", str(tmp_path / "ar"), "--run-id", "before"], 180)
        both = ["--backends", "ddp,horovod@gloo", "--repeats", "2", *POINT]
        run_ok([DISTBENCH, "compare", "--cluster", name, *both, "--out", str(tmp_path), "--run-id", "cmp"], 360)
        run_ok([DISTBENCH, *sweep, "--out", str(tmp_path / "ar"), "--run-id", "after"], 180)
    finally:
        run_cmd([DISTBENCH, "cluster", "down", name], timeout=60)
    done = run_ok([DISTBENCH, "project", str(tmp_path / "cmp"), "--ranks", "2,8", "--allreduce", str(tmp_path / "ar")])
    assert done.stdout.startswith("Projection (a model, not a measurement)"), done.stdout
    document = json.loads((tmp_path / "cmp" / "projection" / project.JSON).read_text())
    checked = {c["variant"]: c["error"] for c in document["check"]}
    assert set(checked) == {"ddp@torchrun", "horovod@gloo"}
    assert all(abs(e) <= BOUND for e in checked.values()), (checked, done.stdout)
    costs = project.Costs(fitted=project.fits_from(tmp_path / "ar"))
    control = project.check(project.inputs(tmp_path / "cmp"), costs, overlap=False)
    moved = control.set_index("variant")["error"]["ddp@torchrun"] - checked["ddp@torchrun"]
    assert moved > MOVED, (control.to_dict("records"), checked)
