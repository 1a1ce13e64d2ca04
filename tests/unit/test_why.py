"""The report's "why" section against hand-computed numbers: the step split three ways, the gradient
allreduce alone interpolated from `distbench allreduce` results, and the share of it hidden."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import load, why
from benchmarks.run import recorder as results
from tests.helpers import make_run

KNOBS = {
    "ddp": {"launcher": "torchrun", "knobs": {"dist_backend": "gloo"}},
    "horovod": {"launcher": "horovodrun", "knobs": {"controller": "gloo"}},
}


def run_with_baseline(
    root: Path, backend: str, step_ms: list[float], wall: float, compute_ms: list[float], repeat: int = 0
) -> Path:
    """Two ranks stepping alike; the first step is warm-up; a compute baseline of `compute_ms`."""
    meta = {**KNOBS[backend], "gradient_bytes_per_step": 1_000_000}
    run_dir = make_run(root, f"{backend}-r{repeat}", backend, [[t / 1000 for t in step_ms]] * 2, wall=wall, meta=meta)
    meta = json.loads((run_dir / results.RUN_JSON).read_text())
    timed = [t / 1000 for t in step_ms[1:]]
    row = results.summary_row(meta, timed, 20 * len(timed), {}, wall, [t / 1000 for t in compute_ms])
    pd.DataFrame([row]).to_csv(run_dir / results.SUMMARY_CSV, index=False, columns=results.SUMMARY_COLUMNS)
    return run_dir


def allreduce_results() -> pd.DataFrame:
    """Time proportional to size, so log–log interpolation at 1 MB is exact: 10 ms and 4 ms."""
    rows = [
        {
            "impl": impl,
            "world_size": 2,
            "dtype": "float32",
            "size_bytes": size,
            "time_mean_s": size * per_byte,
            "correct": True,
            "label": impl,
        }
        for impl, per_byte in (("torch-gloo", 1e-8), ("horovod-gloo", 4e-9))
        for size in (100_000, 10_000_000)
    ]
    return pd.DataFrame(rows)


@pytest.fixture
def table(tmp_path) -> pd.DataFrame:
    # ddp: median step 10 ms, window 36 ms / 3 steps = 12 ms, compute 4 ms → exposed 6, other 2.
    run_with_baseline(tmp_path, "ddp", [50, 10, 10, 10], 0.036, [4, 4, 4])
    # horovod: median step 20 ms, window 22 ms per step, compute 5 ms → exposed 15, other 2.
    run_with_baseline(tmp_path, "horovod", [50, 20, 20, 20], 0.066, [5, 6, 4])
    return why.breakdown(why.per_run(load.load_runs(tmp_path)), allreduce_results())


def test_step_split_three_ways_by_hand(table: pd.DataFrame) -> None:
    ddp, horovod = table.iloc[0], table.iloc[1]
    assert (ddp.variant, horovod.variant) == ("ddp@torchrun", "horovod@gloo")
    assert (ddp.raw_compute_ms, ddp.raw_exposed_comm_ms, ddp.raw_other_ms) == pytest.approx((4, 6, 2))
    assert (horovod.raw_compute_ms, horovod.raw_exposed_comm_ms, horovod.raw_other_ms) == pytest.approx((5, 15, 2))
    assert (ddp.exposed_share, horovod.exposed_share) == ("60%", "75%")
    assert ddp.interval == "1 run: no interval (needs ≥ 3)"


def test_allreduce_alone_and_the_share_hidden(table: pd.DataFrame, tmp_path) -> None:
    ddp, horovod = table.iloc[0], table.iloc[1]
    assert (ddp.allreduce_alone_ms, horovod.allreduce_alone_ms) == pytest.approx((10, 4))
    assert (ddp.hidden_share, horovod.hidden_share) == ("40%", "0%")  # 1 − 6/10; 15 ms exposed > 4 ms alone
    (sentence,) = why.sentences(table, allreduce_results(), why.per_run(load.load_runs(tmp_path)))
    assert "a horovod@gloo step takes 20.0 ms vs 10.0 ms for ddp@torchrun" in sentence
    assert "takes 4.0 ms with horovod-gloo vs 10.0 ms with torch-gloo" in sentence
    assert "exposed time beyond the allreduce alone: horovod@gloo 11.0 ms" in sentence
    assert "from 1 run of each: numbers only, no cause named" in sentence  # one run names no cause
    assert "share the cores" not in sentence and "framework overhead" not in sentence


def test_without_allreduce_results_the_sentence_says_what_is_missing(table: pd.DataFrame, tmp_path) -> None:
    table = why.breakdown(why.per_run(load.load_runs(tmp_path)), None)
    assert table.allreduce_alone_ms.isna().all()
    (sentence,) = why.sentences(table, None)
    assert "no `distbench allreduce` results for 2 ranks" in sentence


def _three_runs_each(root: Path, horovod_compute_ms: list[list[float]]) -> list[str]:
    for repeat in range(3):
        run_with_baseline(root, "ddp", [50, 10, 10, 10], 0.036, [4, 4, 4], repeat)
        run_with_baseline(root, "horovod", [50, 20, 20, 20], 0.066, horovod_compute_ms[repeat], repeat)
    runs = why.per_run(load.load_runs(root))
    return why.sentences(why.breakdown(runs, allreduce_results()), allreduce_results(), runs)


def test_a_cause_is_named_only_when_its_interval_excludes_zero(tmp_path) -> None:
    # Compute 8 ms vs 4 ms in every run: resolved, and well beyond 20 % of the base's.
    (sentence,) = _three_runs_each(tmp_path / "slow", [[8, 8, 8], [8.2, 8.2, 8.2], [7.9, 7.9, 7.9]])
    assert "the same compute takes 4.0 ms longer under horovod@gloo" in sentence
    assert "share the cores" in sentence and "framework overhead" in sentence
    # Compute 1–9 ms around ddp's 4: a mean difference of +1 ms that three runs cannot resolve.
    (sentence,) = _three_runs_each(tmp_path / "noisy", [[1, 1, 1], [5, 5, 5], [9, 9, 9]])
    assert "share the cores" not in sentence
    assert "not resolved from 3 runs: compute +1.0 ms" in sentence


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        ("horovod@gloo", "Horovod's background thread share"),
        ("horovod@mpi", "Horovod's background thread and MPI's progress"),
        ("ddp@torchrun", "gloo's and DDP's reducer threads"),
        ("fsdp@torchrun (val sampler)", "FSDP2's own work per step"),
        ("single", ""),
    ],
)
def test_why_names_the_framework_in_question_and_no_other(variant: str, words: str) -> None:
    said = why.threads_words(variant)
    assert words in said and (words or not said)
    assert ("Horovod" in said) == variant.startswith("horovod")
