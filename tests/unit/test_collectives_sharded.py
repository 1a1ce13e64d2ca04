"""`distbench allreduce --collective reduce_scatter|all_gather` (the collectives FSDP2 uses): nccl-tests'
bus-bandwidth factors, the exact check of each output, the sizes a sweep measures, bad input, and results
with and without the `collective` column in check, load and the report's Why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import config
from benchmarks.analysis import check, why
from benchmarks.analysis import collectives as analysis
from benchmarks.cli import EXIT_BAD_INPUT, main
from benchmarks.errors import InputError
from benchmarks.run import collective_impls as impls
from benchmarks.run import collectives as rank_side
from benchmarks.suite import allreduce

MiB = 1 << 20


@pytest.mark.parametrize(
    ("collective", "world", "factor"),
    [
        ("allreduce", 2, 1.0),  # 2(n−1)/n
        ("allreduce", 4, 1.5),
        ("reduce_scatter", 2, 0.5),  # (n−1)/n
        ("reduce_scatter", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("all_gather", 2, 0.5),
        ("all_gather", 3, 2 / 3),
        ("all_gather", 1, 0.0),  # one rank moves nothing over a link
    ],
)
def test_bus_factors_are_nccl_tests(collective: str, world: int, factor: float) -> None:
    assert rank_side.bus_factor(world, collective) == pytest.approx(factor, rel=1e-12, abs=1e-15)


def test_bus_bandwidth_of_a_reduce_scatter_and_an_all_gather_by_hand() -> None:
    # 1 MiB (the whole buffer) in 1 ms on 4 ranks: algbw 1.048576 GB/s, × 3/4.
    for collective in ("reduce_scatter", "all_gather"):
        assert rank_side.busbw_gbps(MiB, 1e-3, 4, collective) == pytest.approx(0.786432, rel=1e-12)
    assert rank_side.busbw_gbps(MiB, 1e-3, 4) == pytest.approx(1.572864, rel=1e-12)  # allreduce, the default
    meta = {
        "run_id": "r",
        "impl": "torch-gloo",
        "collective": "reduce_scatter",
        "launcher": "torchrun",
        "controller": "none",
        "world_size": 4,
        "device": "cpu",
        "dtype": "float32",
    }
    row = rank_side.size_row(meta, MiB, 1, 5, [1e-3] * 4, True, [(1e-4, 0.0, 0.0)] * 4)
    assert row["collective"] == "reduce_scatter" and row["busbw_gbps"] == pytest.approx(0.786432)
    assert set(row) == set(rank_side.COLUMNS)


@pytest.mark.parametrize(
    ("sizes", "collective", "world", "width", "measured"),
    [
        ([4, 8, 12, 16], "allreduce", 2, 4, [4, 8, 12, 16]),
        ([4, 8, 12, 16], "reduce_scatter", 2, 4, [8, 16]),  # 4 B is under one float32 per rank; 12 → 8
        ([4, 64, MiB], "all_gather", 3, 4, [60, MiB - MiB % 12]),
        ([2, 4], "all_gather", 2, 2, [4]),
        ([4], "reduce_scatter", 2, 4, []),
    ],
)
def test_sizes_round_down_to_whole_elements_per_rank(sizes, collective, world, width, measured) -> None:
    assert rank_side.sweep_sizes(sizes, collective, world, width) == measured


def _reduce_scatter(world: int, shard: int, dtype) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every rank's input (its summand pattern over the whole buffer) and its exact output shard."""
    inputs = [np.zeros(world * shard, dtype) for _ in range(world)]
    for rank, buf in enumerate(inputs):
        impls.fill_pattern(buf, rank)
    total = np.sum(inputs, axis=0, dtype=dtype)
    return inputs, [total[k * shard : (k + 1) * shard].copy() for k in range(world)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("world", "shard"), [(1, 5), (2, 1), (2, 7), (3, 4), (5, 1000)])
def test_the_reduce_scatter_check_takes_each_ranks_shard_of_the_exact_sum(dtype, world: int, shard: int) -> None:
    inputs, outputs = _reduce_scatter(world, shard, dtype)
    for rank, out in enumerate(outputs):
        assert impls.check("reduce_scatter", out, rank, world) is None
        wrong = out.copy()
        wrong[-1] += 1
        index, value, expected = impls.check("reduce_scatter", wrong, rank, world)
        assert (index, value, expected) == (rank * shard + shard - 1, float(out[-1]) + 1, float(out[-1]))
    if world > 1:
        assert impls.check("reduce_scatter", inputs[0][:shard], 0, world) is not None  # not reduced
        # Another rank's shard, in the wrong place: caught unless the shard is a multiple of 3 elements, or the
        # world is (then every element's sum is the same, 2 × ranks: the allreduce's check has that limit too).
        if shard % impls.PERIOD and world % impls.PERIOD:
            assert impls.check("reduce_scatter", outputs[1], 0, world) is not None


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("world", "shard"), [(1, 4), (2, 1), (2, 6), (4, 3), (5, 1000)])
def test_the_all_gather_check_wants_rank_ks_shard_in_block_k(dtype, world: int, shard: int) -> None:
    shards = [np.zeros(shard, dtype) for _ in range(world)]
    for rank, buf in enumerate(shards):
        impls.fill_shard(buf, rank)
    gathered = np.concatenate(shards)
    for rank in range(world):
        assert impls.check("all_gather", gathered, rank, world) is None
    if world > 1:
        wrong = gathered.copy()
        wrong[shard] -= 1
        assert impls.check("all_gather", wrong, 0, world) == (shard, float(gathered[shard]) - 1, float(gathered[shard]))
        swapped = np.concatenate([shards[1], shards[0], *shards[2:]])  # the right values, in the wrong blocks
        assert impls.check("all_gather", swapped, 0, world)[0] == 0
        assert impls.check("all_gather", np.concatenate([shards[0]] * world), 0, world) is not None
    top = np.zeros(3, np.float16)
    impls.fill_shard(top, 2048 // impls.PERIOD - 1)  # the largest world float16 allows: still exact
    assert top.astype(np.float64).tolist() == [2044.0, 2045.0, 2046.0]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"impl": "horovod", "collective": "reduce_scatter"}, "--collective reduce_scatter is measured with torch"),
        ({"impl": "mpi4py", "collective": "all_gather"}, "use --impl torch"),
    ],
)
def test_other_implementations_are_refused_a_sharded_collective(changes: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        allreduce.validate(config.AllreduceConfig(**{"sizes": [8], **changes}))
    allreduce.validate(config.AllreduceConfig(impl="torch", sizes=[8], collective=changes["collective"]))


def test_compare_of_a_sharded_collective_takes_torch_and_refuses_the_others(tmp_path, capsys) -> None:
    argv = ["allreduce", "--compare", "--collective", "all_gather", "--out", str(tmp_path / "out")]
    assert main([*argv, "--impls", "torch,mpi4py"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--collective all_gather is measured with torch.distributed only" in err[0], err
    assert not (tmp_path / "out").exists()
    args = argparse_namespace(["allreduce", "--compare", "--collective", "reduce_scatter"])
    assert allreduce._compare_names(args) == ["torch"]
    assert allreduce._compare_names(argparse_namespace(["allreduce", "--compare"])) == list(allreduce.VARIANTS)
    opts = config.AllreduceConfig(impl="torch", collective="reduce_scatter")
    assert allreduce.rank_argv(opts)[-2:] == ["--collective", "reduce_scatter"]


def argparse_namespace(argv: list[str]):
    from benchmarks import cli

    return cli.build_parser().parse_args(argv)


def write_run(
    root: Path, run_id: str, impl: str, rows: list[tuple[int, float]], collective: str | None = None, world: int = 2
) -> Path:
    """A run directory as rank 0 writes it; `collective` None: as schema 1 wrote it (no collective)."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    meta = {
        "schema_version": rank_side.SCHEMA_VERSION if collective else 1,
        "kind": rank_side.KIND,
        "run_id": run_id,
        "impl": impl,
        "launcher": "torchrun",
        "controller": "none",
        "world_size": world,
        "device": "cpu",
        "dtype": "float32",
        "sizes": [s for s, _ in rows],
        "status": "completed",
    }
    if collective:
        meta["collective"] = collective
    lines = [rank_side.size_row(meta, s, 1, 5, [t] * world, True, [(t / 2, t / 4, 0.0)] * world) for s, t in rows]
    frame = pd.DataFrame(lines, columns=list(rank_side.COLUMNS))
    if not collective:
        frame = frame[list(rank_side.SCHEMA_COLUMNS[1])]
    frame.to_csv(run_dir / rank_side.CSV_NAME, index=False)
    (run_dir / "run.json").write_text(json.dumps(meta))
    return run_dir


def test_check_accepts_old_runs_and_checks_a_sharded_ones_bandwidth(tmp_path) -> None:
    old = write_run(tmp_path, "old", "torch-gloo", [(8, 1e-5), (MiB, 1e-3)])
    assert "collective" not in pd.read_csv(old / rank_side.CSV_NAME).columns
    assert check.allreduce_problems(old) == []
    new = write_run(tmp_path, "rs", "torch-gloo", [(8, 1e-5), (MiB, 1e-3)], "reduce_scatter")
    assert check.allreduce_problems(new) == []
    csv = new / rank_side.CSV_NAME
    frame = pd.read_csv(csv)
    frame.loc[1, "busbw_gbps"] *= 2  # allreduce's factor at n = 2
    frame.to_csv(csv, index=False)
    problems = check.allreduce_problems(new)
    assert any("csv:3: busbw_gbps" in p and "(n−1)/n" in p and "reduce_scatter" in p for p in problems)
    frame.loc[1, "busbw_gbps"] /= 2
    frame.loc[0, "collective"] = "all_gather"
    frame.to_csv(csv, index=False)
    assert any("collective 'all_gather' is not run.json's" in p for p in check.allreduce_problems(new))
    frame.drop(columns=["collective"]).to_csv(csv, index=False)
    assert any("header is" in p for p in check.allreduce_problems(new))  # schema 2 without the column
    meta = json.loads((new / "run.json").read_text())
    (new / "run.json").write_text(json.dumps({**meta, "collective": "broadcast"}))
    assert any("collective 'broadcast' is not one of" in p for p in check.allreduce_problems(new))
    del meta["collective"]
    (new / "run.json").write_text(json.dumps(meta))
    assert any("missing key 'collective'" in p for p in check.allreduce_problems(new))


def test_the_report_names_the_collective_and_why_uses_only_allreduce_as_the_reference(tmp_path) -> None:
    write_run(tmp_path / "r", "a", "torch-gloo", [(1024, 1e-4), (MiB, 1e-3)])  # schema 1: allreduce
    write_run(tmp_path / "r", "rs", "torch-gloo", [(1024, 5e-5), (MiB, 4e-4)], "reduce_scatter")
    write_run(tmp_path / "r", "ag", "torch-gloo", [(1024, 6e-5), (MiB, 6e-4)], "all_gather")
    frame = analysis.load(tmp_path / "r")
    assert set(frame.label) == {"torch-gloo", "torch-gloo reduce_scatter", "torch-gloo all_gather"}
    assert frame.groupby("label").collective.first().to_dict()["torch-gloo"] == "allreduce"
    section = analysis.report_section([tmp_path / "r"], tmp_path / "out")
    assert list(section.busbw.columns) == ["size", "torch-gloo", "torch-gloo all_gather", "torch-gloo reduce_scatter"]
    assert section.busbw.loc[1, "torch-gloo reduce_scatter"] == pytest.approx(MiB / 4e-4 / 1e9 / 2)
    assert section.runs.collective.tolist() == ["allreduce", "all_gather", "reduce_scatter"]  # path order
    text = section.markdown(tmp_path / "out")
    assert "## Collectives" in text and "Time per call (µs)" in text and "(n−1)/n" in text
    assert why.alone_ms(frame, "torch-gloo", 2, "float32", MiB) == pytest.approx(1.0)  # the allreduce's ms
    assert why.alone_ms(frame, "torch-gloo", 2, "float32", MiB, "reduce_scatter") == pytest.approx(0.4)
    only_sharded = frame[frame.collective != "allreduce"]
    assert np.isnan(why.alone_ms(only_sharded, "torch-gloo", 2, "float32", MiB))  # never the allreduce reference
    table = pd.DataFrame([{"world_size": 2, "raw_dtype": "float32", "gradient_mb": MiB / 1e6}])
    alone = why.alone_table(table, frame).iloc[0]
    assert alone["torch-gloo_ms"] == pytest.approx(1.0) and alone["torch-gloo all_gather_ms"] == pytest.approx(0.6)
    assert alone["torch-gloo reduce_scatter_busbw_gbps"] == pytest.approx(MiB / 4e-4 / 1e9 / 2)
