"""`distbench allreduce` under the real launchers, 2 ranks, tiny sizes: every implementation right, and a
wrong reduction caught."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import check, collectives
from tests.helpers import BIN, REPO, horovodrun, mpirun, run_cmd, run_ok, torchrun

SIZES = ["--sizes", "4,4K,256K", "--iters", "5", "--warmup", "1", "--quiet", "--timeout", "60"]
# impl → (launcher prefix, the exit code that launcher passes on for ranks exiting 1)
UNDER = {
    "torch": (lambda: torchrun(2), 1),
    "horovod": (lambda: horovodrun(2, "--gloo"), 1),
    "mpi4py": (lambda: mpirun(2), 1),
}


def meta_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _our_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "distbench: error:" in line]


def _no_rank_traceback(output: str) -> None:
    assert f'File "{REPO / "benchmarks"}' not in output and f'File "{REPO / "backends"}' not in output, output


@pytest.mark.timeout(300)
def test_compare_measures_every_implementation_under_its_launcher(tmp_path, horovod_available) -> None:
    cmd = [str(BIN / "distbench"), "allreduce", "--compare", *SIZES, "--out", str(tmp_path), "--run-id", "c"]
    proc = run_ok(cmd, timeout=280)
    root = tmp_path / "c"
    assert proc.stdout.strip().splitlines()[-1] == str(root)
    combined = pd.read_csv(root / collectives.COMPARISON_CSV)
    expected = {
        "torch-gloo": ("torchrun", "none"),
        "horovod-gloo": ("horovodrun", "gloo"),
        "horovod-mpi": ("horovodrun", "mpi"),
        "mpi4py": ("mpirun", "none"),
    }
    assert list(dict.fromkeys(combined.impl)) == list(expected)  # --impls order
    for impl, (launcher, controller) in expected.items():
        rows = combined[combined.impl == impl]
        assert rows.size_bytes.tolist() == [4, 4096, 256 * 1024], impl
        assert rows.correct.all() and (rows.world_size == 2).all(), impl
        assert (rows.launcher == launcher).all() and (rows.controller == controller).all(), impl
        assert (rows.time_min_s <= rows.time_mean_s).all() and (rows.time_mean_s <= rows.time_max_s).all()
        assert (rows.busbw_gbps > 0).all() and (rows.iterations == 5).all()
        meta = meta_of(root / impl)
        assert (meta["kind"], meta["status"], meta["impl"]) == ("allreduce", "completed", impl)
        assert check.allreduce_problems(root / impl) == []
    assert (root / "report" / collectives.FIGURE).stat().st_size > 0
    assert "mpi4py" in (root / "report" / "allreduce.md").read_text()


# The result check is the bench's, one for every implementation: `make test` injects the wrong result into
# torch's; horovod's and mpi4py's are `full_matrix`.
@pytest.mark.timeout(150)
@pytest.mark.parametrize("impl", [i if i == "torch" else pytest.param(i, marks=pytest.mark.full_matrix) for i in UNDER])
def test_a_wrong_reduction_fails_the_run(tmp_path, impl: str, horovod_available) -> None:
    prefix, code = UNDER[impl]
    cmd = [
        *prefix(),
        "allreduce",
        "--impl",
        impl,
        *SIZES,
        "--out",
        str(tmp_path),
        "--run-id",
        "w",
        "--inject-wrong-result",
    ]
    proc = run_cmd(cmd, timeout=130)
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    lines = _our_lines(output)
    assert len(lines) == 1, output
    assert re.search(r"wrong allreduce result at 4 B \(float32\) on rank 1: element 0 is 4, expected 3", lines[0])
    assert str(tmp_path / "w" / "run.json") in lines[0]
    _no_rank_traceback(output)
    meta = meta_of(tmp_path / "w")
    assert meta["status"] == "failed" and "wrong allreduce result" in meta["error"]
    rows = pd.read_csv(tmp_path / "w" / "allreduce.csv")
    assert len(rows) == 1 and not rows.correct.iloc[0]
    assert rows[["time_mean_s", "algbw_gbps", "busbw_gbps"]].isna().all(axis=None)  # no bandwidth for it
    assert check.allreduce_problems(tmp_path / "w") == []


# Each implementation under a launcher other than its default (test_compare_measures_every_implementation_…
# runs each under its own): `make test` horovod under mpirun; the other two pairs are `full_matrix`.
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("impl", "prefix"),
    [
        pytest.param("torch", lambda: mpirun(2), marks=pytest.mark.full_matrix),
        ("horovod", lambda: mpirun(2)),
        pytest.param("mpi4py", lambda: horovodrun(2, "--mpi"), marks=pytest.mark.full_matrix),
    ],
)
def test_other_launchers_each_implementation_accepts(tmp_path, impl: str, prefix, horovod_available) -> None:
    calibrated = ["--sizes", "4,4K,256K", "--quiet", "--timeout", "60"]  # default warm-up, iterations sized by it
    proc = run_ok([*prefix(), "allreduce", "--impl", impl, *calibrated, "--out", str(tmp_path), "--run-id", "r"], 180)
    rows = pd.read_csv(tmp_path / "r" / "allreduce.csv")
    assert rows.correct.all() and len(rows) == 3 and (rows.world_size == 2).all(), proc.stderr
    assert rows.warmup.tolist() == [10, 10, 10] and rows.iterations.iloc[0] > 5  # ~0.5 s of 4 B calls
    assert meta_of(tmp_path / "r")["status"] == "completed"


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("prefix", "argv", "code", "message"),
    [
        (lambda: torchrun(2), ["--impl", "mpi4py"], 1, "--impl mpi4py cannot run under torchrun; launch it with"),
        (lambda: horovodrun(2, "--gloo"), ["--impl", "mpi4py"], 1, "cannot run under horovodrun --gloo"),
        (lambda: mpirun(2), ["--impl", "torch", "--sizes", "6"], 2, "--sizes 6 is not a whole number"),
    ],
)
def test_bad_input_under_a_launcher_is_said_once(tmp_path, prefix, argv, code: int, message: str) -> None:
    proc = run_cmd([*prefix(), "allreduce", *argv, "--quiet", "--out", str(tmp_path)], timeout=130)
    output = proc.stdout + proc.stderr
    lines = _our_lines(output)
    assert len(lines) == 1 and message in lines[0], output
    assert proc.returncode == code, output
    _no_rank_traceback(output)
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(150)
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_fsdps_collectives_under_torchrun_are_checked_and_recorded(tmp_path, collective: str) -> None:
    """4 B holds no float32 per rank on 2 ranks: left out; the others measured, every output exact."""
    cmd = [
        *torchrun(2),
        "allreduce",
        "--impl",
        "torch",
        "--collective",
        collective,
        *SIZES,
        "--out",
        str(tmp_path),
        "--run-id",
        "s",
    ]
    run_ok(cmd, timeout=130)
    rows = pd.read_csv(tmp_path / "s" / "allreduce.csv")
    assert rows.size_bytes.tolist() == [4096, 256 * 1024] and rows.correct.all()
    assert (rows.collective == collective).all() and (rows.impl == "torch-gloo").all()
    assert rows.busbw_gbps.tolist() == pytest.approx((rows.algbw_gbps / 2).tolist())  # (n−1)/n at n = 2
    meta = meta_of(tmp_path / "s")
    assert (meta["collective"], meta["status"], meta["sizes"]) == (collective, "completed", [4096, 256 * 1024])
    assert meta["in_place"] is (collective == "all_gather") and "_single(" in meta["knobs"]["call"]
    assert check.allreduce_problems(tmp_path / "s") == []


@pytest.mark.timeout(150)
def test_a_wrong_reduce_scatter_shard_fails_the_run(tmp_path) -> None:
    cmd = [
        *torchrun(2),
        "allreduce",
        "--impl",
        "torch",
        "--collective",
        "reduce_scatter",
        "--sizes",
        "8,4K",
        "--iters",
        "5",
        "--warmup",
        "1",
        "--quiet",
        "--timeout",
        "60",
        "--out",
        str(tmp_path),
        "--run-id",
        "w",
        "--inject-wrong-result",
    ]
    proc = run_cmd(cmd, timeout=130)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    lines = _our_lines(output)
    assert len(lines) == 1, output
    assert (
        "wrong reduce_scatter result at 8 B (float32) on rank 1: element 1 is 6, expected 5 (this rank's shard of "
        "the exact sum over 2 ranks)" in lines[0]
    )
    _no_rank_traceback(output)
    assert meta_of(tmp_path / "w")["status"] == "failed"
    assert check.allreduce_problems(tmp_path / "w") == []
