"""The decision itself on constructed result directories: each status reached through `decision.decide`, with the
setup's aggregate status, the pick (or the leader that is not one) and the wording; and the memory budget.

Throughputs are set exactly: each run times 2 steps of 10 samples in a window of 20 / throughput seconds.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import decision, decision_words, load, tables
from tests.helpers import make_run

BASE = [100.0, 101.0, 99.0, 100.5, 99.5]


def _decide(tmp_path: Path, throughputs: dict[str, list[float]], **plan) -> dict:
    for variant, values in throughputs.items():
        backend, launcher = variant.split("@")
        for repeat, value in enumerate(values):
            run_id = f"{backend}-{launcher}-r{repeat}"
            make_run(
                tmp_path / "c",
                run_id,
                backend,
                [[0.1, 0.1, 0.1]],
                wall=20 / value,
                meta={"launcher": launcher, "variant": variant},
            )
    per_run = tables.per_run_stats(load.load_runs(tmp_path / "c"))
    return decision.decide(per_run, plan=plan or None)


@pytest.mark.parametrize(
    ("other", "margin", "status", "words"),
    [
        ([80.0, 81.0, 79.0, 80.5, 79.5], 0.05, "resolved", "pick ddp@torchrun"),
        ([99.8, 100.9, 99.1, 100.2, 99.9], 0.05, "equivalent", "equally fast within ±5%"),
        ([90.0, 115.0, 85.0, 104.0, 96.0], 0.05, "unresolved", "ahead on these runs, not resolved"),
    ],
)
def test_each_status_is_reached_through_the_decision(tmp_path, other, margin, status, words) -> None:
    decided = _decide(tmp_path, {"ddp@torchrun": BASE, "ddp@mpirun": other}, margin=margin)
    [setup] = decided["setups"]
    [alt] = setup["alternatives"]
    assert setup["status"] == alt["status"] == status
    assert decided["margin"] == margin and decided["schema_version"] == decision.SCHEMA_VERSION
    head = decision_words.words(decided)[0]
    assert head.startswith(f"Decision ({status}): synthetic") and words in head, head
    if status == "unresolved":
        assert "pick" not in head
        assert alt["repeats_to_resolve_estimate"] > len(other) and "80% chance" in decision_words.words(decided)[1]
    lo, hi = alt["ci"]
    if status == "resolved":
        assert hi < 1
    if status == "equivalent":
        assert 1 / 1.05 <= lo and hi <= 1.05


def test_an_interval_just_inside_the_margin_is_equivalent_and_just_outside_is_not() -> None:
    assert decision.status_of(1 / 1.05, 1.0499, 0.05) == "equivalent"
    assert decision.status_of(0.95, 1.02, 0.05) == "unresolved"  # 0.95 < 1/1.05: one end outside is not enough
    assert decision.status_of(0.90, 0.9999, 0.05) == "resolved"
    assert decision.status_of(0.90, 1.0001, 0.05) == "unresolved"


def test_resolved_and_equivalent_together_pick_and_say_both(tmp_path) -> None:
    decided = _decide(
        tmp_path,
        {
            "ddp@torchrun": BASE,
            "ddp@mpirun": [99.8, 100.9, 99.1, 100.2, 99.9],
            "horovod@gloo": [70.0, 71, 69, 70.5, 69.5],
        },
    )
    [setup] = decided["setups"]
    assert setup["status"] == "resolved"
    head = decision_words.words(decided)[0]
    assert "pick ddp@torchrun" in head and "faster than horovod@gloo" in head and "equivalent within ±5% to" in head


def _per_run(memory: dict[str, float], throughput: dict[str, float]) -> pd.DataFrame:
    rows = []
    for variant, mb in memory.items():
        for r, wobble in enumerate((1.0, 1.01, 0.99)):
            rows.append(
                {
                    "run_id": f"{variant.replace('@', '-')}-r{r}",
                    "variant": variant,
                    "backend": variant,
                    "status": "completed",
                    "workload": "w",
                    "global_batch": 32,
                    "world_size": 2,
                    "samples_per_s": throughput[variant] * wobble,
                    "peak_rss_mb_min": mb,
                    "peak_rss_mb_max": mb,
                    "training_rss_mb_min": mb - 300,
                    "training_rss_mb_max": mb - 300,
                }
            )
    return pd.DataFrame(rows)


def test_a_memory_budget_keeps_a_variant_above_it_from_the_pick() -> None:
    per_run = _per_run({"ddp@torchrun": 500.0, "fsdp@torchrun": 380.0}, {"ddp@torchrun": 100.0, "fsdp@torchrun": 60.0})
    decided = decision.decide(per_run, memory_limit_mb=400)
    [setup] = decided["setups"]
    assert setup["recommended"]["variant"] == "fsdp@torchrun"
    assert setup["over_budget"][0]["variant"] == "ddp@torchrun"
    said = "\n".join(decision_words.words(decided))
    assert "not picked: ddp@torchrun, peak RSS 500 MB per rank is above --memory-limit-mb 400" in said
    nothing = decision.decide(per_run, memory_limit_mb=100)["setups"][0]
    assert nothing["status"] == "over-budget" and nothing["recommended"] is None


def test_without_a_budget_the_leanest_variants_trade_is_said() -> None:
    per_run = _per_run({"ddp@torchrun": 500.0, "fsdp@torchrun": 400.0}, {"ddp@torchrun": 100.0, "fsdp@torchrun": 62.0})
    decided = decision.decide(per_run)
    lean = decided["setups"][0]["leanest"]
    assert lean["variant"] == "fsdp@torchrun" and lean["share"] == pytest.approx(100 / 200)
    said = "\n".join(decision_words.words(decided))
    assert "leanest: fsdp@torchrun: 0.62×" in said and "at 50% of the training memory per rank" in said


def test_on_cpu_the_leanest_is_named_by_the_training_state_a_rank_holds() -> None:
    """RSS hides FSDP2's sharding under everything resident; the held parameters, gradients and optimizer state
    (run.json memory.per_rank, state_mb) show it, and name the leanest variant."""
    per_run = _per_run({"ddp@torchrun": 500.0, "fsdp@torchrun": 500.0}, {"ddp@torchrun": 100.0, "fsdp@torchrun": 40.0})
    per_run["state_mb_min"] = per_run["state_mb_max"] = [32.0 if v == "ddp@torchrun" else 16.0 for v in per_run.variant]
    lean = decision.decide(per_run)["setups"][0]["leanest"]
    assert lean["variant"] == "fsdp@torchrun" and lean["measure"] == "state_mb" and lean["share"] == 0.5
