"""Distributed validation: what each --val-strategy evaluates and reports, its time in loss.csv
and summary.csv (schema 4), their check, and its bad input. In-process, one rank: the shards against
torch's own DistributedSampler. 2- and 3-rank groups against one process: tests/integration/test_validation.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from torch.utils.data import DistributedSampler

from benchmarks import config as options
from benchmarks.analysis import check, load, tables
from benchmarks.config import RunConfig
from benchmarks.errors import InputError
from benchmarks.run import recorder as results
from benchmarks.run import validation, workloads
from benchmarks.run.validate import validate
from tests.helpers import config, fit, single_backend

STRATEGIES = options.VAL_STRATEGIES
N = 1001


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [N, 12, 1])
def test_each_strategy_evaluates_what_it_says(n: int, world: int) -> None:
    shards = {s: [validation.shard(s, n, r, world) for r in range(world)] for s in STRATEGIES}
    for strategy, mine in shards.items():  # the distinct samples of every strategy: each of the n once
        distinct = sorted(i for s in mine for i in list(s.indices)[: s.distinct])
        assert distinct == list(range(n)), strategy
    assert [list(s.indices) for s in shards["sampler"]] == [
        list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False)) for r in range(world)
    ]
    counts = {s: (sum(x.samples for x in mine), sum(x.duplicates for x in mine)) for s, mine in shards.items()}
    padded = math.ceil(n / world) * world
    assert counts == {
        "exact": (n, 0),
        "sampler": (padded, padded - n),
        "replicated": (world * n, (world - 1) * n),
        "rank0": (n, 0),
    }
    slowest = {s: max(x.samples for x in mine) for s, mine in shards.items()}  # what bounds the time
    assert slowest == {"exact": math.ceil(n / world), "sampler": math.ceil(n / world), "replicated": n, "rank0": n}
    assert validation.per_rank_counts("sampler", n, world) == [
        {"rank": r, "samples": s.samples, "duplicates": s.duplicates} for r, s in enumerate(shards["sampler"])
    ]


def test_sampler_reports_the_mean_of_the_ranks_means() -> None:
    # Rank 0 has 2 samples (losses 1, 3), rank 1 one sample (loss 8) and a duplicate of sample 0 (loss 1).
    per_rank = [[4.0, 0.0, 2.0, 4.0, 0.0, 2.0, 2.0, 0.0], [9.0, 0.0, 2.0, 8.0, 0.0, 1.0, 4.5, 0.0]]
    totals = [sum(column) for column in zip(*per_rank, strict=True)]
    loss, _, exact, _ = validation.combine("sampler", totals, 2)
    assert (loss, exact) == (pytest.approx((2.0 + 4.5) / 2), pytest.approx(12.0 / 3))


def test_one_rank_every_strategy_is_exact_and_timed(tmp_path: Path) -> None:
    found = {}
    for strategy in STRATEGIES:
        cfg = config(
            workload="linear", epochs=2, steps_per_epoch=4, batch_size=8, warmup_steps=1, val_strategy=strategy
        )
        fit(single_backend(cfg), cfg, tmp_path / strategy)
        loss = pd.read_csv(tmp_path / strategy / results.LOSS_CSV)
        val = loss[loss.split == "val"]
        assert len(val) == 2 and (val.val_s > 0).all() and (val.val_pass == 1).all()
        assert val.val_samples_per_s.tolist() == pytest.approx((64 / val.val_s).tolist())
        summary = pd.read_csv(tmp_path / strategy / results.SUMMARY_CSV).iloc[0]
        assert summary.val_strategy == strategy and summary.val_passes == 2
        assert summary.val_s == pytest.approx(val.val_s.median())
        assert (summary.val_samples, summary.val_duplicates) == (64, 0)
        assert not check.check_run(tmp_path / strategy)
        found[strategy] = val.loss.tolist()
    assert all(v == found["exact"] for v in found.values())  # one rank: no strategy can differ


def test_check_catches_a_validation_time_that_does_not_add_up(tmp_path: Path) -> None:
    cfg = config(workload="linear", epochs=1, steps_per_epoch=4, batch_size=8, warmup_steps=1)
    fit(single_backend(cfg), cfg, tmp_path / "run")
    summary = pd.read_csv(tmp_path / "run" / results.SUMMARY_CSV)
    summary.loc[0, "val_s"] *= 2
    summary.to_csv(tmp_path / "run" / results.SUMMARY_CSV, index=False)
    assert any("val_s" in str(p) for p in check.check_run(tmp_path / "run"))


def test_a_schema_3_run_still_passes_check_and_loads_as_exact(tmp_path: Path) -> None:
    cfg = config(workload="linear", epochs=1, steps_per_epoch=4, batch_size=8, warmup_steps=1)
    fit(single_backend(cfg), cfg, tmp_path / "new")
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "new", old)
    summary = pd.read_csv(old / results.SUMMARY_CSV)
    summary[list(results.SUMMARY_COLUMNS_OF[3])].to_csv(old / results.SUMMARY_CSV, index=False)
    loss = pd.read_csv(old / results.LOSS_CSV)
    loss[list(results.LOSS_COLUMNS_OF[3])].to_csv(old / results.LOSS_CSV, index=False)
    meta = json.loads((old / results.RUN_JSON).read_text())
    meta.pop("validation")
    (old / results.RUN_JSON).write_text(json.dumps({**meta, "schema_version": 3}))
    assert not check.check_run(old)
    meta["schema_version"] = 4  # the same files claimed as version 4 lack columns
    (old / results.RUN_JSON).write_text(json.dumps(meta))
    assert any("header" in str(p) for p in check.check_run(old))
    (old / results.RUN_JSON).write_text(json.dumps({**meta, "schema_version": 3}))
    per_run = tables.per_run_stats(load.load_runs(tmp_path))
    per_run = per_run.set_index(per_run.run_key.map(lambda key: Path(key).name))
    assert per_run.loc["old", "val_strategy"] == "exact" and pd.isna(per_run.loc["old", "val_s"])
    assert per_run.loc["new", "val_s"] > 0


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"val_strategy": "shuffled"}, "--val-strategy 'shuffled' is not one of exact, sampler, replicated, rank0"),
        ({"val_strategy": "exact,sampler"}, "compare takes a comma-separated list"),
        ({"eval_only": True, "eval_repeats": 0}, "--eval-repeats must be a positive integer"),
        ({"eval_only": True, "accumulate": 2}, "--accumulate cannot apply with --eval-only"),
        ({"eval_only": True, "fp16_allreduce": True}, "--fp16-allreduce cannot apply with --eval-only"),
        ({"eval_repeats": 3}, "--eval-repeats applies only with --eval-only"),
        ({"eval_only": True, "eval_train_steps": -1}, "--eval-train-steps must be >= 0"),
    ],
)
def test_bad_validation_options_are_refused_in_one_line(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")) as exc:
        validate("ddp", workloads.resolve(RunConfig(**changes)))
    assert "\n" not in str(exc.value)


def test_compare_runs_each_strategy_as_its_own_job() -> None:
    from benchmarks.suite import variants

    cfg = workloads.resolve(RunConfig(workload="linear"))
    chosen = variants.parse("ddp,horovod")
    strategies = variants.parse_strategies("exact, sampler")
    jobs = variants.jobs_for(cfg, chosen, [1, 2], None, {}, None, strategies)
    assert [(j.run_prefix, j.cfg.val_strategy) for j in jobs[:4]] == [
        ("ddp-w1-exact", "exact"),
        ("ddp-w1-sampler", "sampler"),
        ("horovod-w1-exact", "exact"),
        ("horovod-w1-sampler", "sampler"),
    ]
    assert [j.run_prefix for j in variants.jobs_for(cfg, chosen, [2], None, {})] == ["ddp", "horovod"]  # as before
    for text, words in (
        ("exact,shuffled", "'shuffled' is not one of"),
        ("exact,exact", "lists a strategy twice"),
        (",", "is empty"),
    ):
        with pytest.raises(InputError, match=words):
            variants.parse_strategies(text)


def test_eval_only_needs_no_timed_training_step() -> None:
    cfg = workloads.resolve(RunConfig(workload="linear", steps_per_epoch=1, epochs=1, eval_only=True))
    validate("ddp", cfg)  # one step, all of it warm-up: nothing to time in training, and none is needed
    assert workloads.prepare(cfg, 2).workload.name == "linear"
    with pytest.raises(InputError, match="leaves no timed step"):
        workloads.prepare(RunConfig(workload="linear", steps_per_epoch=1, epochs=1), 2)
