"""`distbench project` checked against measurement at one small point: 2 emulated hosts, one link rate, the
allreduce swept there and a compare run there; the projection at the measured size is within the bound of
docs/benchmarks.md (20 %), and a negative control — every message sent only after backward, the overlap
modelled away — is outside it. Needs root (namespaces): skipped with the reason otherwise.
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
BOUND = 0.20
POINT = ["--workload", "transformer", "--steps-per-epoch", "40", "--bucket-cap-mb", "0.5"]
"""DDP's buckets at 0.5 MB so that it, like Horovod, has gradients on the wire during backward: the
negative control then has overlap to take away."""


@pytest.mark.skipif(emulation.missing_rights() is not None, reason=f"no emulated hosts: {emulation.missing_rights()}")
@pytest.mark.timeout(420)
def test_the_projection_holds_at_two_emulated_hosts_and_fails_with_the_overlap_modelled_away(tmp_path: Path) -> None:
    name = f"p{secrets.token_hex(3)}"
    run_ok([DISTBENCH, "cluster", "up", "--hosts", "2", "--link", "1gbit", "--name", name], timeout=60)
    try:
        sweep = ["allreduce", "--compare", "--cluster", name, "--impls", "torch,horovod-gloo"]
        run_ok(
            [DISTBENCH, *sweep, "--sizes", "65536,262144,1048576,4194304", "--out", str(tmp_path), "--run-id", "ar"],
            180,
        )
        both = ["--backends", "ddp,horovod@gloo", "--repeats", "1", *POINT]
        run_ok([DISTBENCH, "compare", "--cluster", name, *both, "--out", str(tmp_path), "--run-id", "cmp"], 240)
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
    assert (control["error"].abs() > BOUND).any(), (control.to_dict("records"), checked)
