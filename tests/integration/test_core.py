"""Core: identical workloads on every backend, exact validation, sampling, the CSV contract."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.run import recorder as results
from tests.helpers import BIN, CLI, REPO, horovodrun, read_run, run_ok, torchrun

STEPS = ["--epochs", "1", "--steps-per-epoch", "20", "--seed", "7", "--quiet"]


VARIANTS = {
    "mlp": ["--workload", "mlp"],
    "linear": ["--workload", "linear"],
    # A Dataset read from disk through a DataLoader with 2 worker processes per rank, trained with AdamW.
    "mlp-disk-adamw": ["--workload", "mlp:storage=disk", "--workers", "2", "--optimizer", "adamw", "--lr", "0.01"],
}


class EquivalenceRuns:
    """For each variant, on first use: DDP 2×B, Horovod 2×B, single 2B, all from the same seed. Made per
    variant, so a tier that deselects a variant's test does not pay for its runs."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.runs: dict[tuple[str, str], Path] = {}

    def __getitem__(self, key: tuple[str, str]) -> Path:
        variant, _ = key
        if key not in self.runs:
            args = ["run", *VARIANTS[variant], *STEPS, "--out", str(self.out)]
            for backend, cmd, batch in (
                ("ddp", torchrun(2), 16),
                ("horovod", horovodrun(2), 16),
                ("single", CLI, 32),
            ):
                run_id = f"{variant}-{backend}"
                argv = [*cmd, *args, "--backend", backend, "--batch-size", str(batch), "--run-id", run_id]
                run_ok(argv, DISTBENCH_DATA_CACHE=str(self.out / "data"))
                self.runs[(variant, backend)] = self.out / run_id
        return self.runs[key]


@pytest.fixture(scope="module")
def equivalence_runs(tmp_path_factory, horovod_available) -> EquivalenceRuns:
    return EquivalenceRuns(tmp_path_factory.mktemp("equiv"))


# `make test` checks the equivalence on mlp (SGD with momentum, in memory); the other variants are more
# workloads of the same behaviour, `full_matrix`. A DataLoader-read Dataset with AdamW trained alike by ddp
# and single stays in `make test` through test_fsdp.py's disk-adamw curves.
@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    "workload", [v if v == "mlp" else pytest.param(v, marks=pytest.mark.full_matrix) for v in VARIANTS]
)
def test_backends_give_the_same_loss_curve(equivalence_runs, workload: str) -> None:
    curves = {}
    for backend in ("ddp", "horovod", "single"):
        loss = read_run(equivalence_runs[(workload, backend)])["loss"]
        curves[backend] = loss[loss.split == "train"].set_index("step")["loss"]
    assert len(curves["single"]) == 20
    for backend in ("ddp", "horovod"):
        assert curves[backend].index.equals(curves["single"].index)
        diff = (curves[backend] - curves["single"]).abs().max()
        assert diff < 1e-5, f"{backend} vs single differs by {diff}"
    # The loss moved: equal curves are not equal because nothing was trained.
    assert curves["single"].iloc[-1] < curves["single"].iloc[0]


@pytest.mark.full_matrix  # reads the mlp-disk-adamw runs, a workload left to `make test-all`
@pytest.mark.timeout(420)
def test_the_dataset_run_used_its_loader_and_optimizer(equivalence_runs) -> None:
    for backend in ("ddp", "horovod", "single"):
        meta = json.loads((equivalence_runs[("mlp-disk-adamw", backend)] / "run.json").read_text())
        assert meta["optimizer"]["name"] == "AdamW" and meta["optimizer"]["lr"] == 0.01
        assert meta["workload_args"] == {"hidden": 128, "layers": 2, "storage": "disk"}
        assert meta["config"]["workers"] == 2
    sgd = json.loads((equivalence_runs[("mlp", "horovod")] / "run.json").read_text())["optimizer"]
    assert sgd["name"] == "SGD" and sgd["momentum"] == 0.9


@pytest.mark.timeout(420)
def test_csv_contract(equivalence_runs) -> None:
    run_dir = equivalence_runs[("mlp", "ddp")]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed" and meta["schema_version"] == results.SCHEMA_VERSION
    assert meta["launcher"] == "torchrun" and meta["world_size"] == 2
    for key in ("config", "knobs", "threads", "versions", "hosts", "start_time", "end_time"):
        assert key in meta
    assert meta["knobs"]["bucket_cap_mb"] == 25.0 and meta["versions"]["torch"]
    frames = read_run(run_dir)
    assert tuple(frames["timing"].columns) == results.TIMING_COLUMNS
    assert tuple(frames["loss"].columns) == results.LOSS_COLUMNS
    assert tuple(frames["summary"].columns) == results.SUMMARY_COLUMNS
    timing = frames["timing"]
    assert len(timing) == 2 * 20 and set(timing["rank"]) == {0, 1}
    assert timing.groupby("step")["warmup"].first().tolist() == [True] * 5 + [False] * 15
    summary = frames["summary"].iloc[0]
    assert summary["timed_steps"] == 15 and summary["global_batch"] == 32
    timed = timing[~timing["warmup"]]
    assert summary["step_p50_s"] == pytest.approx(timed.groupby("step")["step_s"].max().median())
    assert summary["samples_per_s"] == pytest.approx(timed["samples"].sum() / summary["wall_s"])
    hvd_meta = json.loads((equivalence_runs[("mlp", "horovod")] / "run.json").read_text())
    assert hvd_meta["launcher"] == "horovodrun" and hvd_meta["knobs"]["controller"] == "gloo"
    assert hvd_meta["knobs"]["fusion_threshold_mb"] == 128.0


# Exact validation at 2 ranks against one process is test_validation_ranks.py's in `make test`; at 3 ranks,
# where the sampler would pad, it is left to `make test-all` there and here.
@pytest.mark.full_matrix
@pytest.mark.timeout(300)
def test_exact_validation_on_2_and_3_ranks(tmp_path) -> None:
    # The same global batch (96) on 1, 2 and 3 ranks trains the same weights, so only the validation differs.
    args = [
        "run",
        "--backend",
        "{b}",
        "--workload",
        "mlp",
        "--train-size",
        "256",
        "--val-size",
        "1001",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--warmup-steps",
        "1",
        "--quiet",
        "--out",
        str(tmp_path),
    ]
    values = {}
    for world, cmd, backend in ((1, CLI, "single"), (2, torchrun(2), "ddp"), (3, torchrun(3), "ddp")):
        argv = [a.replace("{b}", backend) for a in args]
        run_ok([*cmd, *argv, "--batch-size", str(96 // world), "--run-id", f"w{world}"], timeout=180)
        loss = read_run(tmp_path / f"w{world}")["loss"]
        values[world] = loss[loss.split == "val"].iloc[-1]
    for world in (2, 3):
        assert values[world]["samples"] == 1001
        assert values[world]["loss"] == pytest.approx(values[1]["loss"], abs=1e-5)
        assert values[world]["accuracy"] == pytest.approx(values[1]["accuracy"], abs=1e-6)


def test_custom_workload_by_module_path(tmp_path) -> None:
    run_ok(
        [
            *CLI,
            "run",
            "--backend",
            "single",
            "--workload",
            "benchmarks.run.workloads.builtin:linear",
            "--epochs",
            "1",
            "--steps-per-epoch",
            "3",
            "--warmup-steps",
            "1",
            "--quiet",
            "--out",
            str(tmp_path),
            "--run-id",
            "custom",
        ]
    )
    summary = pd.read_csv(tmp_path / "custom" / "summary.csv")
    assert summary["workload"].iloc[0] == "benchmarks.run.workloads.builtin:linear"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_backend_collectives_on_two_ranks(backend: str, horovod_available) -> None:
    probe = str(REPO / "tests" / "integration" / "backend_probe.py")
    if backend == "ddp":
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", probe, "ddp"]
    else:
        cmd = [str(BIN / "horovodrun"), "-np", "2", "--gloo", str(BIN / "python"), probe, "horovod"]
    out = run_ok(cmd).stdout
    seen = json.loads(out.strip().splitlines()[-1].removeprefix("[0]<stdout>:"))
    assert seen["world_size"] == 2
    assert (seen["sum"], seen["mean"], seen["max"]) == (3.0, 1.5, 2.0)
    assert seen["gathered"] == [{"rank": 0}, {"rank": 1}]
    assert seen["broadcast"] == "from rank 0"
    assert {"accumulate", "fp16_allreduce"} <= set(seen["describe"])


@pytest.mark.timeout(300)
def test_gradient_accumulation_is_the_same_on_every_backend(tmp_path, horovod_available) -> None:
    """DDP no_sync and Horovod backward_passes_per_step, 2 micro-batches per step, match single."""
    args = [
        "run",
        "--workload",
        "mlp",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "10",
        "--accumulate",
        "2",
        "--seed",
        "5",
        "--quiet",
        "--out",
        str(tmp_path),
    ]
    curves = {}
    for backend, cmd, batch in (("ddp", torchrun(2), 8), ("horovod", horovodrun(2), 8), ("single", CLI, 16)):
        run_ok([*cmd, *args, "--backend", backend, "--batch-size", str(batch), "--run-id", backend])
        loss = read_run(tmp_path / backend)["loss"]
        curves[backend] = loss[loss.split == "train"]["loss"].to_numpy()
        assert json.loads((tmp_path / backend / "run.json").read_text())["global_batch"] == 32
    assert len(curves["single"]) == 10
    for backend in ("ddp", "horovod"):
        assert abs(curves[backend] - curves["single"]).max() < 1e-5, backend
