"""`distbench tune` before anything starts: its grid (default and files) and what it refuses."""

from __future__ import annotations

import pytest

from benchmarks import cli
from benchmarks.errors import InputError
from benchmarks.suite import tune
from tests.helpers import REPO

GRIDS = REPO / "benchmarks" / "grids"


def test_the_default_grid_file_is_the_default_grid() -> None:
    assert tune.load_grid(str(GRIDS / "default.toml")) == tune.DEFAULT_GRID


def test_a_grid_file_replaces_the_tables_it_has() -> None:
    grid = tune.load_grid(str(GRIDS / "quick.toml"))
    assert grid["ddp"] == {"bucket_cap_mb": [5.0, 25.0], "gradient_as_bucket_view": [False, True]}
    assert [len(tune.grid_points(grid[b])) for b in ("ddp", "horovod")] == [4, 4]
    assert grid["deepspeed"] == tune.DEFAULT_GRID["deepspeed"]  # a backend the file leaves out keeps its own
    points = tune.grid_points({"a": [1, 2], "b": [True, False]})
    assert points == [{"a": 1, "b": True}, {"a": 1, "b": False}, {"a": 2, "b": True}, {"a": 2, "b": False}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[ddp]\nbucket_cap = [1]\n", "[ddp] has no option 'bucket_cap'; known: dist_backend, bucket_cap_mb"),
        ("[tensorflow]\nx = [1]\n", "[tensorflow] is not a backend table; use [ddp] or [horovod]"),
        ("[single]\nx = [1]\n", "is not a backend table"),
        ("[horovod]\ncycle_time_ms = ['fast']\n", "cycle_time_ms needs a list of float"),
        ("[ddp\n", "is not valid TOML"),
        ("[horovod]\nhvd_op = ['sum']\n", "[horovod] --hvd-op must be one of average, adasum, got 'sum'"),
        ("[ddp]\nbucket_cap_mb = [5, -1]\n", "[ddp] --bucket-cap-mb must be greater than 0, got -1.0"),
    ],
)
def test_a_bad_grid_is_one_line(tmp_path, capsys, text: str, message: str) -> None:
    grid = tmp_path / "g.toml"
    grid.write_text(text)
    with pytest.raises(InputError) as caught:
        tune.load_grid(str(grid))
    assert message in str(caught.value)
    assert cli.main(["tune", "--grid", str(grid), "--out", str(tmp_path / "out")]) == cli.EXIT_BAD_INPUT
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc", "1,2"], "tune runs one world size"),
        (["--backends", "ddp@nowhere"], "unknown variant 'ddp@nowhere'"),
        (["--tune-steps", "3", "--warmup-steps", "5"], "--tune-steps 3 leaves no timed step"),
        (["--tune-repeats", "0"], "must be positive integers"),
        (["--eval-only"], "distbench compare --eval-only"),
    ],
)
def test_tune_refuses_bad_input_before_anything_starts(tmp_path, capsys, argv: list[str], message: str) -> None:
    code = cli.main(["tune", *argv, "--workload", "linear", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_grid_point_the_model_cannot_take_is_refused_before_anything_starts(tmp_path, capsys) -> None:
    """The grid's settings are checked against the model as the command line's are: FSDP2's `blocks` policy
    names no module of the linear workload, so a sweep point with it would fail in every run."""
    grid = tmp_path / "g.toml"
    grid.write_text('[fsdp]\nfsdp_units = ["root", "blocks"]\n')
    argv = ["tune", "--backends", "fsdp", "--workload", "linear", "--grid", str(grid), "--out", str(tmp_path / "out")]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fsdp-units blocks names no module" in err, err
    assert not (tmp_path / "out").exists()
