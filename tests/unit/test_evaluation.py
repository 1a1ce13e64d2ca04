"""The report's Distributed validation (analysis.evaluation) on constructed per-run rows, the eval-only
report, and a validation set of a million samples held once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from benchmarks.analysis import evaluation, load, report, tables
from benchmarks.run import recorder as results
from benchmarks.run.workloads import builtin


def run(variant: str, world: int, val_s: float, strategy: str = "exact", n: int = 1000, **extra: object) -> dict:
    """A per_run_stats row as a schema-4 run gives it."""
    most = {"exact": -(-n // world), "sampler": -(-n // world), "replicated": n, "rank0": n}[strategy]
    samples = {"exact": n, "sampler": -(-n // world) * world, "replicated": world * n, "rank0": n}[strategy]
    return {
        "run_key": f"{variant}-{strategy}-w{world}-{val_s}",
        "variant": load.with_strategy(variant, strategy),
        "backend": variant.split("@")[0],
        "workload": "linear",
        "world_size": world,
        "status": "completed",
        "val_strategy": strategy,
        "eval_only": False,
        "val_s": val_s,
        "val_samples_per_s": n / val_s,
        "val_samples": samples,
        "val_duplicates": samples - n,
        "val_most_on_a_rank": most,
        "final_val_loss": 1.0 + (0.01 if strategy == "sampler" else 0.0),
        "final_val_exact_loss": 1.0,
        "oversubscribed": False,
        **extra,
    }


def test_speedup_bound_duplicates_and_loss_difference_per_strategy() -> None:
    rows = [run("ddp@torchrun", 1, t) for t in (1.0, 1.1, 0.9)]
    for strategy in ("exact", "sampler", "replicated", "rank0"):
        time = 0.5 if strategy in ("exact", "sampler") else 1.0
        rows += [run("ddp@torchrun", 3, time * f, strategy) for f in (1.0, 1.05, 0.95)]
    table = evaluation.validation_table(pd.DataFrame(rows)).set_index(["val_strategy", "world_size"])
    three = table.xs(3, level="world_size")
    assert three.speedup_bound.to_dict() == pytest.approx(
        {"exact": 1000 / 334, "sampler": 1000 / 334, "replicated": 1.0, "rank0": 1.0}
    )
    assert three.val_duplicates.to_dict() == {"exact": 0, "sampler": 2, "replicated": 2000, "rank0": 0}
    assert three.loss_difference.to_dict() == pytest.approx({"exact": 0, "sampler": 0.01, "replicated": 0, "rank0": 0})
    assert three.loc["exact", "speedup"] == pytest.approx(2.0, rel=0.05) and three.loc["exact", "speedup_low"] > 1
    assert three.loc["replicated", "speedup_low"] < 1 < three.loc["replicated", "speedup_high"]
    # Every strategy's base is the variant's 1-rank exact runs: at one rank each evaluates the set once.
    other = "its 1-rank runs of another strategy"
    assert three.speedup_base.to_dict() == {
        "exact": "its own 1-rank runs",
        "sampler": other,
        "replicated": other,
        "rank0": other,
    }
    assert table.loc[("exact", 1), "note"] == "the base"
    assert three.efficiency.to_dict() == pytest.approx((three.speedup / 3).to_dict())


def test_no_base_and_too_few_runs_say_so() -> None:
    table = evaluation.validation_table(pd.DataFrame([run("horovod@gloo", 2, 0.4)]))
    assert np.isnan(table.speedup.iloc[0]) and table.note.iloc[0] == "no 1-rank run to compare with"
    text = evaluation.format_validation(table)
    assert "no CI: n<3" in text and "horovod@gloo" in text
    older = pd.DataFrame([{**run("ddp@torchrun", 2, 0.4), "val_s": np.nan}])  # schema 3: nothing timed
    assert not len(evaluation.validation_table(older))


def test_eval_scaling_joins_the_scaling_table() -> None:
    rows = [
        {**run("ddp@torchrun", w, 1.0 / w * f), "samples_per_s": 100.0 * w * f, "global_batch": 32 * w}
        for w in (1, 2)
        for f in (1.0, 1.02, 0.98)
    ]
    per_run = pd.DataFrame(rows)
    joined = evaluation.eval_scaling(tables.scaling(per_run), per_run).set_index("world_size")
    assert joined.loc[2, "efficiency"] == pytest.approx(1.0, rel=0.05)
    assert joined.loc[2, "val_efficiency"] == pytest.approx(1.0, rel=0.05) and joined.loc[2, "val_speedup_low"] > 1


def _eval_run(root: Path, name: str, world: int, val_s: list[float]) -> None:
    meta = {
        "run_id": name,
        "backend": "ddp",
        "launcher": "torchrun",
        "world_size": world,
        "workload": "linear",
        "global_batch": 32 * world,
        "eval_only": {"train_steps": 0, "repeats": len(val_s)},
        "validation": {
            "strategy": "exact",
            "samples": 100,
            "duplicates": 0,
            "per_rank": [{"rank": r, "samples": 100 // world} for r in range(world)],
        },
    }
    rec = results.Recorder(root / name, meta)
    rec.loss(
        [
            {
                "run_id": name,
                "backend": "ddp",
                "world_size": world,
                "epoch": 0,
                "step": 0,
                "split": "val",
                "loss": 1.0,
                "accuracy": None,
                "samples": 100,
                "val_pass": i + 1,
                "val_s": t,
                "val_samples_per_s": 100 / t,
                "val_exact_loss": 1.0,
            }
            for i, t in enumerate(val_s)
        ]
    )
    rec.summary(0.0)
    rec.finish("completed", timed_wall_s=0.0)


def test_an_eval_only_report_has_its_scaling_and_no_training_table(tmp_path: Path) -> None:
    for r in range(3):
        _eval_run(tmp_path, f"ddp-w1-r{r}", 1, [0.10, 0.11 + r / 100, 0.12])
        _eval_run(tmp_path, f"ddp-w2-r{r}", 2, [0.05, 0.06 + r / 100, 0.07])
    text = report.write([tmp_path], tmp_path / "report", {"md"})
    assert "distributed validation" in text and "samples/s (95% CI)" not in text  # no training table
    assert (tmp_path / "report" / "eval_scaling.png").is_file()
    page = (tmp_path / "report" / "report.md").read_text()
    assert "## Distributed validation" in page and "eval_scaling.png" in page


def test_a_million_validation_samples_are_held_once() -> None:
    workload = builtin.linear(0, 4096, 1_000_000)
    x_val, x_train = workload.val[0], workload.train[0]
    assert len(x_val) == 1_000_000 and x_val.untyped_storage().data_ptr() == x_train.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_sets_built_in_place_are_the_sets_they_were(name: str) -> None:
    """cnn and transformer build their sets in place now (a million samples fit): the same values as before."""
    workload = getattr(builtin, name)(7, 96, 40)
    g = builtin._generator(7, 3 if name == "cnn" else 4)
    if name == "cnn":
        templates = torch.randn(10, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (136,), generator=g)
        x = templates[y] + 2.0 * torch.randn(136, 3, 32, 32, generator=g)
    else:
        start, stride = torch.randint(0, 512, (136, 1), generator=g), torch.randint(1, 8, (136, 1), generator=g)
        tokens = (start + stride * torch.arange(33)) % 512
        x, y = tokens[:, :-1], tokens[:, 1:]
    assert torch.equal(torch.cat([workload.train[0], workload.val[0]]), x)
    assert torch.equal(torch.cat([workload.train[1], workload.val[1]]), y)
