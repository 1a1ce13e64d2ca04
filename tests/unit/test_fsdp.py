"""FSDP2 (backends/fsdp.py) in-process: its unit policy, and on real 2- and 3-rank gloo groups (torch.multiprocessing)
the same loss curves as single and DDP (SGD, AdamW, accumulation), validation of the sharded model under every
strategy with its float buffers averaged, a compute baseline with no collective, and each rank holding 1/W of
the parameters, gradients and optimizer state (DDP: all of them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.tensor import DTensor

from backends.ddp import DDPBackend
from backends.fsdp import FSDPBackend, check_units, units_of
from benchmarks import config as options
from benchmarks.config import DDPConfig, FSDPConfig, RunConfig
from benchmarks.errors import InputError
from benchmarks.launch import TORCHRUN, LaunchInfo, rendezvous
from benchmarks.run import workloads
from benchmarks.run.ready import READY_STEPS
from benchmarks.run.trainer import BASELINE_WARMUP_STEPS, Trainer
from tests.helpers import TINY_GPT2, config, fit, single_backend

MLP = {"workload": "mlp", "epochs": 1, "steps_per_epoch": 6, "warmup_steps": 1, "compute_baseline_steps": 3}
CURVES = {  # name: the run's options at 2 ranks (single gets the same global batch)
    "sgd": {**MLP, "batch_size": 8},
    "adamw-accumulate": {**MLP, "batch_size": 4, "accumulate": 2, "optimizer": "adamw", "lr": 0.01},
}
CNN = {
    "workload": "cnn",
    "epochs": 1,
    "steps_per_epoch": 3,
    "batch_size": 8,
    "train_size": 128,
    "val_size": 50,
    "warmup_steps": 1,
    "compute_baseline_steps": 0,
}
BASELINE_STEPS = 3


def model_of(workload: str) -> nn.Module:
    return workloads.load(workload, 0, 64, 16).build_model()


# --- the unit policy --------------------------------------------------------------------------------------


def test_blocks_are_the_outermost_containers_children() -> None:
    assert units_of(model_of("transformer:dim=32,layers=2"), "blocks", 1) == ["blocks.1", "blocks.0"]
    assert units_of(model_of("mlp"), "blocks", 1) == ["4", "2", "0"]  # bottom-up: a unit before its parent


def test_a_shared_parameter_stays_with_the_root() -> None:
    # GPT-2 ties its token embedding to its head: neither may be a unit of its own.
    leaves = units_of(model_of(TINY_GPT2), "leaves", 1)
    assert leaves and not any(name.endswith(("wte", "lm_head")) for name in leaves)


def test_auto_falls_back_to_leaves_and_then_the_root() -> None:
    assert units_of(model_of("linear"), "auto", 1) == []
    big = nn.Sequential(nn.Flatten(), nn.Linear(10, 10))  # a Sequential whose one block has 110 parameters
    assert units_of(big, "auto", 1) == ["1"]


@pytest.mark.parametrize(
    ("workload", "fsdp", "said"),
    [
        ("linear", FSDPConfig(fsdp_units="blocks"), "--fsdp-units blocks names no module"),
        ("mlp", FSDPConfig(fsdp_units="leaves", fsdp_min_params=10**9), "--fsdp-units leaves names no module"),
    ],
)
def test_a_policy_that_names_nothing_is_refused(workload: str, fsdp: FSDPConfig, said: str) -> None:
    with pytest.raises(InputError, match=said):
        check_units(model_of(workload), fsdp)
    with pytest.raises(InputError, match=said):  # before any process group: built on the meta device
        FSDPBackend.check_model(workloads.load(workload, 0, 64, 16).build_model, fsdp)


def test_a_threshold_without_leaves_is_refused() -> None:
    with pytest.raises(InputError, match="--fsdp-min-params applies only with --fsdp-units leaves or auto"):
        options.check_values(FSDPConfig(fsdp_units="blocks", fsdp_min_params=5))
    options.check_values(FSDPConfig(fsdp_units="leaves", fsdp_min_params=5))


# --- real groups ---------------------------------------------------------------------------------------


def collectives_so_far(backend: FSDPBackend) -> int:
    """Collectives issued on the default group and on the mesh's (FSDP2's all-gathers and reduce-scatters)."""
    groups = {dist.distributed_c10d._get_default_group(), backend.mesh.get_group()}
    return sum(g._get_sequence_number_for_group() for g in groups)


class Probe(Trainer):
    """The real Trainer, counting collectives per step and keeping each rank's buffers from before validation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_baseline = False
        self.counts: dict[str, list[int]] = {"training": [], "baseline": []}
        self.buffers_before: list[dict[str, torch.Tensor]] = []
        self.baseline_seen: dict[str, Any] = {}

    def compute_baseline(self, plan: Any) -> list[float]:
        self.in_baseline = True
        try:
            return super().compute_baseline(plan)
        finally:
            self.in_baseline = False
            self.baseline_seen["copy"] = (self.baseline or {}).get("copy")

    def train_step(self, micro_batches: Any, epoch: int, bare: Any = None, *rest: Any) -> dict[str, Any]:
        if self.in_baseline and "meshes" not in self.baseline_seen:  # the timed steps' model: its meshes' sizes
            sizes = {p.device_mesh.size() if isinstance(p, DTensor) else 0 for p in bare.model.parameters()}
            self.baseline_seen["meshes"] = sorted(sizes)
        before = collectives_so_far(self.backend) if isinstance(self.backend, FSDPBackend) else 0
        row = super().train_step(micro_batches, epoch, bare, *rest)
        if isinstance(self.backend, FSDPBackend):
            made = collectives_so_far(self.backend) - before
            self.counts["baseline" if self.in_baseline else "training"].append(made)
        return row

    def validate(self, epoch: int) -> dict[str, Any]:
        self.buffers_before.append({k: v.clone() for k, v in self.raw_model.named_buffers()})
        return super().validate(epoch)


def _ranks(rank: int, world: int, port: int, out: Path) -> None:
    torch.set_num_threads(1)
    info = LaunchInfo(
        launcher=TORCHRUN,
        rank=rank,
        local_rank=rank,
        world_size=world,
        local_world_size=world,
        master_addr="127.0.0.1",
        master_port=port,
    )
    fsdp = FSDPBackend(RunConfig(timeout=60), FSDPConfig(), info)
    fsdp.init()
    # DDP on the same default group (a second process group cannot be initialised in one process).
    ddp = DDPBackend(RunConfig(timeout=60), DDPConfig(broadcast_buffers=False), info)
    ddp.dist_backend = "gloo"
    found: dict[str, Any] = {"held": {}, "counts": {}}

    def run(name: str, backend: Any, fields: dict[str, Any]) -> Probe:
        cfg = config(**fields)
        trainer = fit(backend, cfg, out / name if rank == 0 else None, Probe)
        assert isinstance(trainer, Probe)
        found["held"][name] = trainer.memory.read()
        found["counts"][name] = trainer.counts
        found.setdefault("baseline", {})[name] = trainer.baseline_seen
        return trainer

    try:
        for name, fields in CURVES.items():
            batch = {"batch_size": fields["batch_size"] * 2 // world}
            run(f"fsdp-{name}", fsdp, {**fields, **batch, "compute_baseline_steps": BASELINE_STEPS})
            run(f"ddp-{name}", ddp, {**fields, **batch})
        if world == 2:
            for strategy in options.VAL_STRATEGIES:
                for tag, backend in (("fsdp", fsdp), ("ddp", ddp)):
                    trainer = run(f"{tag}-cnn-{strategy}", backend, {**CNN, "val_strategy": strategy})
                    if tag == "fsdp" and strategy == "exact":
                        after = {k: v.clone() for k, v in trainer.raw_model.named_buffers()}
                        found["buffers"] = {"before": trainer.buffers_before[-1], "after": after}
    finally:
        fsdp.shutdown()
    torch.save(found, out / f"rank{rank}.pt")
    rendezvous.exit_process(0)


def spawn(tmp_path_factory: Any, world: int) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp(f"fsdp-w{world}")
    mp.start_processes(_ranks, args=(world, rendezvous.free_port(), out), nprocs=world, start_method="spawn")
    return out, [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    return spawn(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    return spawn(tmp_path_factory, 3)


def curve(run_dir: Path, split: str = "train") -> pd.Series:
    loss = pd.read_csv(run_dir / "loss.csv")
    return loss[loss.split == split].set_index("step")["loss"]


@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CURVES))
def test_fsdp_trains_as_single_and_ddp(two, tmp_path, name: str) -> None:
    out, _ = two
    fields = CURVES[name]
    cfg = config(**{**fields, "batch_size": fields["batch_size"] * 2})
    fit(single_backend(cfg), cfg, tmp_path / "single")
    single = curve(tmp_path / "single")
    assert len(single) == fields["steps_per_epoch"] and single.iloc[-1] < single.iloc[0]
    for other in ("ddp", "single"):
        reference = curve(out / f"ddp-{name}") if other == "ddp" else single
        assert (curve(out / f"fsdp-{name}") - reference).abs().max() < 1e-5, other
    val = curve(out / f"fsdp-{name}", "val").iloc[-1]
    assert val == pytest.approx(curve(tmp_path / "single", "val").iloc[-1], abs=1e-5)


@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", options.VAL_STRATEGIES)
def test_validation_of_the_sharded_model_under_every_strategy(two, strategy: str) -> None:
    """cnn: BatchNorm buffers differ per rank (neither syncs them per step here); both average them first."""
    out, _ = two
    fsdp, ddp = (pd.read_csv(out / f"{tag}-cnn-{strategy}" / "loss.csv") for tag in ("fsdp", "ddp"))
    assert (fsdp["loss"] - ddp["loss"]).abs().max() < 1e-5
    assert (fsdp["val_exact_loss"].dropna() - ddp["val_exact_loss"].dropna()).abs().max() < 1e-5
    assert fsdp[fsdp.split == "val"]["samples"].iloc[-1] == 50


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_float_buffers_are_averaged_before_validation(two) -> None:
    _, ranks = two
    before = [r["buffers"]["before"] for r in ranks]
    assert not torch.equal(before[0]["1.running_mean"], before[1]["1.running_mean"])
    for key, value in ranks[0]["buffers"]["after"].items():
        assert torch.equal(value, ranks[1]["buffers"]["after"][key]), key
        if value.is_floating_point():
            assert torch.allclose(value, (before[0][key] + before[1][key]) / 2, rtol=1e-6, atol=1e-7), key


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_the_compute_baseline_makes_no_collective(two) -> None:
    _, ranks = two
    for rank in ranks:
        counts = rank["counts"]["fsdp-sgd"]
        assert counts["training"] and all(n >= 1 for n in counts["training"])  # the counter sees FSDP2's
        assert (
            len(counts["baseline"]) == BASELINE_WARMUP_STEPS + BASELINE_STEPS + READY_STEPS
        )  # the ready schedule's too
        assert counts["baseline"] == [0] * len(counts["baseline"]), counts["baseline"]
        # It times FSDP2's own work all the same, every parameter sharded over a group of this rank alone.
        assert rank["baseline"]["fsdp-sgd"] == {"meshes": [1], "copy": "fsdp over this rank alone"}


def largest_unit_rows(workload: str) -> int:
    """Padding bound: a rank's shard of a tensor differs from its 1/W by less than one row of it."""
    return max(p[0].numel() if p.dim() else 1 for p in model_of(workload).parameters())


@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_holds_a_wth_of_the_state(request, world: int) -> None:
    out, ranks = request.getfixturevalue({2: "two", 3: "three"}[world])
    slack = 4 * len(list(model_of("mlp").parameters())) * largest_unit_rows("mlp")  # one row per tensor, float32
    for rank in ranks:
        for name in CURVES:
            fsdp, ddp = rank["held"][f"fsdp-{name}"], rank["held"][f"ddp-{name}"]
            for field in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
                full = fsdp[f"{field}_full"]
                assert full > 0 and full == ddp[f"{field}_full"] and ddp[field] == full, field
                # AdamW's step counts are scalars every rank keeps whole: a few bytes per tensor.
                assert abs(fsdp[field] - full / world) <= slack + 8 * 16, (field, fsdp[field], full)
    shards = sum(r["held"]["fsdp-sgd"]["param_bytes"] for r in ranks)
    assert shards == ranks[0]["held"]["fsdp-sgd"]["param_bytes_full"]  # the shards partition the model
    meta = json.loads((out / "fsdp-sgd" / "run.json").read_text())
    assert meta["status"] == "completed"


def test_the_fsdp_grid_goes_through_tunes_grid_rule() -> None:
    from benchmarks.suite import tune
    from tests.helpers import REPO

    grid = tune.load_grid(str(REPO / "benchmarks" / "grids" / "fsdp.toml"))
    assert grid["fsdp"] == {"fsdp_units": ["auto", "root"], "reshard_after_forward": [True, False]}
    assert len(tune.grid_points(grid["fsdp"])) == 4
    assert grid["ddp"] == tune.DEFAULT_GRID["ddp"]  # the tables it leaves out keep the default's
