"""Distributed validation under real launchers: `compare --val-strategy` at 2 and 3 ranks with
1001 validation samples, `compare --eval-only --nproc 1,2`, and bad input said once under every launcher.

Timing on 2 shared cores is noise, so "no speed-up" is asserted on what bounds a validation's time — the
most samples one rank evaluates (`speedup_bound`) — and on recorded counts, never on a clock.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks.analysis import evaluation, load, tables
from benchmarks.run import sharding, workloads
from tests.helpers import (
    BAD_INPUT_LAUNCHERS,
    BAD_INPUT_RUN,
    CLI,
    cli_here,
    no_rank_traceback,
    one_in_make_test,
    our_lines,
    run_cmd,
    run_ok,
)

N = 1001
STRATEGIES = "exact,sampler,replicated,rank0"
SHORT = [
    "--workload",
    "linear",
    "--val-size",
    str(N),
    "--train-size",
    "192",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "6",
    "--warmup-steps",
    "1",
    "--repeats",
    "1",
    "--quiet",
    "--compute-baseline-steps",
    "0",
]


def one_process_exact_loss() -> float:
    """The model as every rank builds it (seeded), evaluated over the whole set in one process."""
    workload = workloads.load("linear", 0, 192, N)
    sharding.seed_everything(0)
    model = workload.build_model()
    with torch.no_grad():
        x, y = workload.val
        return float(workload.loss(model(x), y).double().mean())


def validation_rows(root: Path) -> pd.DataFrame:
    return evaluation.validation_table(tables.per_run_stats(load.load_runs(root))).set_index(
        ["val_strategy", "world_size"]
    )


def assert_each_strategy(table: pd.DataFrame, world: int) -> None:
    """The strategies `table` holds at `world` ranks, each as it should be."""
    rows = table.xs(world, level="world_size")
    padded = math.ceil(N / world) * world
    duplicates = {"exact": 0, "sampler": padded - N, "replicated": (world - 1) * N, "rank0": 0}
    assert rows.val_duplicates.to_dict() == {k: v for k, v in duplicates.items() if k in rows.index}
    if "sampler" in rows.index:  # linear's per-sample losses differ: the mean of means shows
        assert rows.loc["sampler", "loss_difference"] != 0
    for strategy in {"exact", "replicated", "rank0"} & set(rows.index):
        assert rows.loc[strategy, "loss_difference"] == pytest.approx(0, abs=1e-9), strategy
    # What bounds the time: the slowest rank's samples. exact and sampler split the set, the others cannot.
    split = N / math.ceil(N / world)
    bounds = {"exact": split, "sampler": split, "replicated": 1.0, "rank0": 1.0}
    assert rows.speedup_bound.to_dict() == pytest.approx({k: v for k, v in bounds.items() if k in rows.index})


# Every strategy at 1 and 2 ranks, in two compares: `make test` runs exact beside sampler (the two that split
# the set), `make test-all` exact beside the two that cannot (replicated, rank0).
@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    "strategies", ["exact,sampler", pytest.param("exact,replicated,rank0", marks=pytest.mark.full_matrix)]
)
def test_compare_eval_only_at_1_and_2_ranks_every_strategy(tmp_path: Path, strategies: str) -> None:
    command = [
        *CLI,
        "compare",
        "--backends",
        "ddp",
        "--nproc",
        "1,2",
        "--eval-only",
        "--eval-repeats",
        "3",
        "--val-strategy",
        strategies,
        *SHORT,
        "--out",
        str(tmp_path),
        "--run-id",
        "c",
    ]
    proc = run_ok(command, timeout=400)
    root = tmp_path / "c"
    comparison = pd.read_csv(root / "comparison.csv")
    assert len(comparison) == 2 * len(strategies.split(",")) and (comparison.status == "completed").all()
    assert sorted(comparison.val_strategy) == sorted(strategies.split(",") * 2)
    table = validation_rows(root)
    assert_each_strategy(table, 2)
    exact = one_process_exact_loss()
    for strategy in strategies.split(","):
        assert table.loc[(strategy, 2), "exact_loss"] == pytest.approx(exact, rel=1e-6), strategy
    # exact at 2 ranks is the one-process loss (the check), and so, at 1 rank, is every strategy.
    runs = load.load_runs(root).runs.set_index("run_id")
    final = pd.read_csv(root / "ddp-w2-exact-r0" / "summary.csv").iloc[0]
    assert final.final_val_loss == pytest.approx(exact, rel=1e-6) and final.eval_only and final.val_passes == 3
    assert set(runs.val_strategy) == set(strategies.split(","))
    assert "distributed validation" in proc.stdout and "eval-only" in proc.stdout
    page = (root / "report" / "report.md").read_text()
    assert "## Distributed validation" in page and "eval_scaling.png" in page
    assert (root / "report" / "eval_scaling.png").is_file()
    assert table.loc[("exact", 1), "note"] == "the base" and pd.notna(table.loc[("exact", 2), "speedup"])


# At 3 ranks, where the sampler pads, every strategy runs in `make test-all` only.
@pytest.mark.full_matrix
@pytest.mark.timeout(420)
def test_compare_3_ranks_every_strategy_trains_alike_and_reports_its_own_loss(tmp_path: Path) -> None:
    run_ok(
        [
            *CLI,
            "compare",
            "--backends",
            "ddp",
            "--nproc",
            "3",
            "--val-strategy",
            STRATEGIES,
            *SHORT,
            "--out",
            str(tmp_path),
            "--run-id",
            "c",
        ],
        timeout=400,
    )
    root = tmp_path / "c"
    table = validation_rows(root)
    assert_each_strategy(table, 3)
    # Validation changes nothing in training: every strategy's run evaluated the same model, whose exact
    # loss is exact's reported loss.
    exact = table.loc[("exact", 3), "exact_loss"]
    assert table.xs(3, level="world_size").exact_loss.tolist() == pytest.approx([exact] * 4, rel=1e-6)
    per_run = tables.per_run_stats(load.load_runs(root))
    assert sorted(per_run.backend) == ["ddp", "ddp (val rank0)", "ddp (val replicated)", "ddp (val sampler)"]
    meta = json.loads((root / "ddp-sampler-r0" / "run.json").read_text())["validation"]
    assert [r["samples"] for r in meta["per_rank"]] == [334, 334, 334] and meta["duplicates"] == 1


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", one_in_make_test(list(BAD_INPUT_LAUNCHERS), "horovodrun"))  # bad input × launcher
def test_an_unknown_strategy_is_said_once_under_every_launcher(
    tmp_path: Path, launcher: str, horovod_available
) -> None:
    prefix, backend, code = BAD_INPUT_LAUNCHERS[launcher]
    proc = run_cmd(
        [*prefix(), "run", "--backend", backend, *BAD_INPUT_RUN, "--val-strategy", "shuffled", "--out", str(tmp_path)],
        timeout=130,
    )
    output = proc.stdout + proc.stderr
    lines = our_lines(output)
    assert len(lines) == 1 and "--val-strategy 'shuffled' is not one of exact, sampler" in lines[0], output
    assert proc.returncode == code, output
    no_rank_traceback(output)
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--eval-only", "--accumulate", "2"], "--accumulate cannot apply with --eval-only"),
        (["--eval-only", "--fp16-allreduce"], "--fp16-allreduce cannot apply with --eval-only"),
        (["--eval-only", "--eval-repeats", "0"], "--eval-repeats must be a positive integer"),
        (["--val-strategy", "exact,bogus"], "--val-strategy 'bogus' is not one of"),
    ],
)
def test_compare_refuses_bad_validation_options_before_any_job(tmp_path: Path, args: list[str], message: str) -> None:
    proc = cli_here(["compare", "--backends", "ddp", *SHORT, *args, "--out", str(tmp_path)])  # refused before a job
    lines = our_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert not any(tmp_path.iterdir())
