"""The loss agreement compares variants (two of one backend included) and says which; an interrupted run is
counted as interrupted, never as a failure with no error."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.analysis import context, load, tables, terminal
from tests.helpers import make_run

ONE_RANK = [[0.1, 0.1, 0.1]]
PRINT = {
    "train": {"sha256": "t0", "items": "all"},
    "val": {"sha256": "v0", "items": "all"},
    "initial_weights": "w0",
    "initial_weights_agree": True,
}
SIGINT = "interrupted: SIGINT to distbench compare stopped the job"  # what compare records (jobs.record_interrupted)


def _ddp(tmp_path, run_id: str, launcher: str, losses: list[float], val: float, **meta) -> None:
    meta = {"launcher": launcher, "fingerprint": PRINT, "model_float_buffers": 0, **meta}
    make_run(tmp_path, run_id, "ddp", ONE_RANK, wall=1.0, losses=losses, val=[val], meta=meta)


def test_two_variants_of_one_backend_get_real_numbers_and_are_named(tmp_path) -> None:
    _ddp(tmp_path, "ddp-torchrun-r0", "torchrun", [1.0, 0.8, 0.6], 0.5)
    _ddp(tmp_path, "ddp-mpirun-r0", "mpirun", [1.0, 0.8, 0.7], 0.5)
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert agreement.train == pytest.approx(0.1)
    assert agreement.val == 0.0
    assert agreement.variants == ["ddp@mpirun", "ddp@torchrun"]  # path order: ddp-mpirun-r0 first
    said = "loss, max abs difference between variants (ddp@mpirun, ddp@torchrun): train 1.00e-01, validation 0.00e+00"
    assert agreement.lines()[0] == said
    assert "inputs: the same data and initial weights in all 2 runs" in agreement.inputs
    assert agreement.explanation == "train losses differ and no recorded knob explains it"


def test_variants_are_named_in_the_compare_order(tmp_path) -> None:
    _ddp(tmp_path, "ddp-mpirun-r0", "mpirun", [1.0, 0.8], 0.5)
    _ddp(tmp_path, "ddp-torchrun-r0", "torchrun", [1.0, 0.8], 0.5)
    pd.DataFrame({"variant": ["ddp@torchrun", "ddp@mpirun"], "run_id": ["ddp-torchrun-r0", "ddp-mpirun-r0"]}).to_csv(
        tmp_path / "comparison.csv", index=False
    )  # `compare --backends ddp@torchrun,ddp@mpirun` lists torchrun first, and so does its table
    assert tables.loss_agreement(load.load_runs(tmp_path)).variants == ["ddp@torchrun", "ddp@mpirun"]


def test_knob_hints_name_variants_not_backends(tmp_path) -> None:
    for run_id, launcher, broadcast in (("a", "torchrun", True), ("b", "mpirun", False)):
        _ddp(
            tmp_path,
            run_id,
            launcher,
            [1.0, 0.8, 0.6],
            0.5 if broadcast else 0.55,
            model_float_buffers=2,
            knobs={"broadcast_buffers": broadcast},
        )
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert "ddp@torchrun broadcast buffers (knob broadcast_buffers=True) and ddp@mpirun do not" in agreement.explanation


def test_runs_without_a_launcher_fall_back_to_the_backend(tmp_path) -> None:
    # Results from before run.json named a launcher: the backend names the curve, as it always did.
    make_run(tmp_path, "ddp-r0", "ddp", ONE_RANK, wall=1.0, losses=[1.0, 0.8, 0.6], meta={"launcher": None})
    make_run(tmp_path, "horovod-r0", "horovod", ONE_RANK, wall=1.0, losses=[1.0, 0.8, 0.6], meta={"launcher": None})
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert agreement.variants == ["ddp", "horovod"] and agreement.train == 0.0
    assert agreement.lines()[0].startswith("loss, max abs difference between variants (ddp, horovod): train 0.00e+00")


def test_one_variant_compares_nothing(tmp_path) -> None:
    _ddp(tmp_path, "ddp-r0", "torchrun", [1.0, 0.8], 0.5)
    _ddp(tmp_path, "ddp-r1", "torchrun", [1.0, 0.9], 0.5)  # repeats of one variant are not variants
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert agreement.variants == [] and agreement.lines() == [
        "loss, max abs difference between variants: nothing to compare (one variant, ddp@torchrun)"
    ]
    _ddp(tmp_path, "ddp-mpirun-r0", "mpirun", [1.0, 0.8], 0.5, workload="cifar")  # another variant, another setup
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert agreement.lines() == [
        "loss, max abs difference between variants: nothing to compare (no two variants trained one setup)"
    ]


def test_validation_strategies_are_compared_apart(tmp_path) -> None:
    # sampler's padding changes the validation loss by design: never a difference between variants
    runs = [
        ("a", "torchrun", "exact", 0.5),
        ("b", "mpirun", "exact", 0.5),
        ("c", "torchrun", "sampler", 0.6),
        ("d", "mpirun", "sampler", 0.6),
    ]
    for run_id, launcher, strategy, val in runs:
        _ddp(tmp_path, run_id, launcher, [1.0, 0.8], val, validation={"strategy": strategy})
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert agreement.val == 0.0 and len(agreement.per_setup) == 2
    lines = agreement.lines()
    assert any("(ddp@torchrun, ddp@mpirun; synthetic · global batch 10 · val sampler)" in line for line in lines)


def _interrupted(tmp_path, run_id: str) -> None:
    """A run as compare leaves it after Ctrl-C: run.json `failed`, `"interrupted": true`, the signal its error."""
    make_run(
        tmp_path,
        run_id,
        "horovod",
        ONE_RANK,
        wall=1.0,
        status="failed",
        meta={"launcher": "horovodrun", "knobs": {"controller": "gloo"}},
    )
    path = tmp_path / run_id / "run.json"
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({**meta, "interrupted": True, "rank_error": meta["error"], "error": SIGINT}))


def test_an_interrupted_run_is_interrupted_in_the_summary(tmp_path) -> None:
    for i in range(3):
        make_run(
            tmp_path,
            f"horovod-gloo-r{i}",
            "horovod",
            ONE_RANK,
            wall=1.0,
            meta={"launcher": "horovodrun", "knobs": {"controller": "gloo"}},
        )
    _interrupted(tmp_path, "horovod-gloo-r3")
    for include_failed in (False, True):  # report, and compare (which loads the failed runs too)
        rs = load.load_runs(tmp_path, include_failed=include_failed)
        per_run = tables.per_run_stats(rs)
        table = tables.backend_table(per_run)
        row = table.iloc[0]
        assert (row.runs_ok, row.runs_failed, row.runs_interrupted) == (3, 0, 1)
        assert row.interrupted == f"{tmp_path / 'horovod-gloo-r3'}/run.json: {SIGINT}"
        text = terminal.format_table(table, 0.0)
        assert "run(s) failed" not in text and "no error recorded" not in text and "FAILED" not in text
        assert "horovod: 1 run(s) interrupted, not failed (left out): " in text
        assert tables.run_counts(per_run) == {"horovod@gloo": {"completed": 3, "failed": 0, "interrupted": 1}}
        assert context.headline(rs, per_run).endswith("timed steps per run: horovod ×3 and 1 interrupted")
    assert f"{tmp_path / 'horovod-gloo-r3'}: {SIGINT}" in load.load_runs(tmp_path).skipped


def test_an_interrupted_run_with_no_run_json_is_interrupted(tmp_path) -> None:
    # compare's comparison frame: the run stopped before rank 0 wrote run.json, so it has no error
    per_run = pd.DataFrame(
        [
            {
                "run_key": str(tmp_path / "ddp-r0"),
                "backend": "ddp",
                "variant": "ddp@torchrun",
                "status": "completed",
                "samples_per_s": 100.0,
                "step_p50_s": 0.1,
                "step_p99_s": 0.1,
                "final_train_loss": 1.0,
                "final_val_loss": 1.0,
                "workload": "synthetic",
                "global_batch": 10,
                "world_size": 1,
            },
            {
                "run_key": str(tmp_path / "ddp-r1"),
                "backend": "ddp",
                "variant": "ddp@torchrun",
                "status": "interrupted",
                "workload": "synthetic",
                "global_batch": 10,
                "world_size": 1,
            },
        ]
    )
    text = terminal.format_table(tables.backend_table(per_run), 0.0)
    said = f"ddp: 1 run(s) interrupted, not failed (left out): {tmp_path / 'ddp-r1'}: stopped before it wrote run.json"
    assert said in text
    assert "no error recorded" not in text and f"\n{'ddp':<10} {'1/0':>7} " in text  # ok/fail: 1 ok, 0 failed
    # every run of a variant interrupted: INTERRUPTED, not FAILED
    only = per_run.iloc[1:].reset_index(drop=True)
    text = terminal.format_table(tables.backend_table(only), 0.0)
    assert "INTERRUPTED: no run completed" in text and "FAILED" not in text


def test_a_failed_run_beside_an_interrupted_one_is_still_failed(tmp_path) -> None:
    make_run(
        tmp_path,
        "horovod-gloo-r0",
        "horovod",
        ONE_RANK,
        wall=1.0,
        status="failed",
        meta={"launcher": "horovodrun", "knobs": {"controller": "gloo"}},
    )
    _interrupted(tmp_path, "horovod-gloo-r1")
    table = tables.backend_table(tables.per_run_stats(load.load_runs(tmp_path, include_failed=True)))
    row = table.iloc[0]
    assert (row.runs_ok, row.runs_failed, row.runs_interrupted) == (0, 1, 1)
    text = terminal.format_table(table, 0.0)
    assert "FAILED: " in text and "horovod exploded" in text and "1 run(s) interrupted, not failed" in text
