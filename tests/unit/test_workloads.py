"""Workload names, size arguments and presets; the Dataset and DataLoader path against the tensor path;
the optimizer. In-process, on the single backend."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from torch.utils.data import Dataset

from backends.single import SingleBackend
from benchmarks import catalog
from benchmarks.config import NoOptions, RunConfig
from benchmarks.launch import PYTHON, LaunchInfo
from benchmarks.run import data, sharding, workloads
from benchmarks.run.trainer import Trainer, describe_optimizer, make_optimizer
from benchmarks.run.workloads import builtin, datasets
from tests.helpers import TINY_GPT2

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
TINY_BERT = (
    "hf:bert-base-uncased:num_hidden_layers=2,hidden_size=64,num_attention_heads=2,intermediate_size=128,"
    "vocab_size=256,context=16"
)


@pytest.fixture(autouse=True)
def data_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(workloads, "DATA_CACHE", tmp_path / "cache")
    return tmp_path / "cache"


def config(**fields: Any) -> RunConfig:
    base = {"train_size": 256, "val_size": 40, "quiet": True, "compute_baseline_steps": 3}
    return workloads.resolve(RunConfig(**{**base, **fields}))


def train(cfg: RunConfig, out: Path) -> pd.DataFrame:
    backend = SingleBackend(cfg, NoOptions(), LaunchInfo(launcher=PYTHON))
    backend.init()
    trainer = Trainer(backend, workloads.load(cfg.workload, cfg.seed, cfg.train_size, cfg.val_size), cfg, None)
    rows: list[dict[str, Any]] = []
    trainer.flush = lambda: rows.extend(trainer.pending) or trainer.pending.clear() or 0.0  # type: ignore[method-assign]
    vals: list[float] = []
    validate = trainer.validate
    trainer.validate = lambda epoch: vals.append(validate(epoch)["loss"]) or {}  # type: ignore[method-assign]
    trainer.fit()
    frame = pd.DataFrame(rows)
    frame.attrs["val"] = vals
    frame.attrs["baseline"] = trainer.compute_step_s
    return frame


# --- names and size arguments ---------------------------------------------------------------------


def test_size_arguments_and_presets_resolve() -> None:
    parsed = catalog.parse("transformer:dim=256,layers=2,heads=8")
    assert parsed.kind == "builtin" and parsed.base == "transformer"
    assert parsed.args == {
        "vocab": 512,
        "context": 32,
        "dim": 256,
        "layers": 2,
        "heads": 8,
        "tied": 0,
        "storage": "memory",
    }
    preset = catalog.parse("gpt2-small:context=64")
    assert preset.base == "transformer" and preset.args["dim"] == 768 and preset.args["context"] == 64
    assert catalog.defaults_for("gpt2-small")["batch_size"] == 4
    assert catalog.defaults_for("cnn:width=8") == catalog.defaults_for("cnn")
    assert catalog.parse("mymodule:factory").kind == "custom"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("transformer:depth=3", "unknown argument 'depth'; transformer takes vocab, context, dim"),
        ("mlp:hidden=0", "hidden=0 must be a positive integer"),
        ("cnn:width=-4", "width=-4 must be a positive integer"),
        ("cnn:width=2.5", "width=2.5 must be a positive integer"),
        ("transformer:dim=100,heads=3", "heads=3 does not divide dim=100"),
        ("mlp:storage=tape", "use storage=memory or storage=disk"),
        ("mlp:hidden", "'hidden' is not key=value"),
        ("resnet", "unknown workload 'resnet'; known: linear, mlp, cnn, transformer, gpt2-small, cnn-25m"),
    ],
)
def test_bad_size_arguments_name_the_fix(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        catalog.parse(name)


def test_hf_without_transformers_names_the_extra(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformers" else real(n, *a))
    with pytest.raises(ValueError, match=r"needs transformers: pip install -e '\.\[hf\]'"):
        catalog.parse("hf:gpt2")


def test_parsing_a_bad_name_imports_no_torch() -> None:
    code = (
        "import sys\nfrom benchmarks import catalog\nfrom benchmarks.run import workloads  # noqa: F401\n"
        "try:\n    catalog.parse('transformer:heads=5')\nexcept ValueError:\n    pass\n"
        "catalog.parse('gpt2-small')\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _parameters(name: str) -> int:
    parsed = catalog.parse(name)
    model_fn = {"transformer": builtin.TinyGPT, "cnn": builtin.resnet}[parsed.base]
    args = {k: v for k, v in parsed.args.items() if k != "storage"}
    with torch.device("meta"):  # no memory, no time: only the shapes
        model = model_fn(**args)
    return sum(p.numel() for p in model.parameters())


def test_presets_have_the_documented_sizes() -> None:
    """docs/workloads.md and PRESETS' summaries quote these: parameters, and 4 bytes of gradient each per step."""
    assert _parameters("gpt2-small") == 123_751_680  # GPT-2 small's 124,439,808 less 896 positions
    assert _parameters("cnn-25m") == 25_129_066
    assert _parameters("transformer") == 2 * 512 * 128 + 32 * 128 + 4 * 198_272 + 256  # the default is unchanged
    for name, preset in catalog.PRESETS.items():
        assert f"{_parameters(name):,} parameters" in preset.summary
        assert f"{4 * _parameters(name) / 1e6:.1f} MB of gradients" in preset.summary


def test_default_sizes_build_the_same_models_as_before() -> None:
    torch.manual_seed(0)
    mlp = workloads.load("mlp", 0).build_model()
    assert [tuple(p.shape) for p in mlp.parameters()] == [(128, 64), (128,), (128, 128), (128,), (10, 128), (10,)]
    cnn = workloads.load("cnn", 0, 64, 8).build_model()
    assert sum(p.numel() for p in cnn.parameters()) == 78_042 and isinstance(cnn[1], torch.nn.BatchNorm2d)
    wide = workloads.load("mlp:hidden=32,layers=3", 0)
    assert wide.args == {"hidden": 32, "layers": 3, "storage": "memory"}
    assert sum(p.numel() for p in wide.build_model().parameters()) == 64 * 32 + 32 + 2 * (32 * 32 + 32) + 330


# --- the Dataset path gives the tensor path's samples ---------------------------------------------


def test_disk_storage_reads_the_same_samples_and_writes_once(data_cache) -> None:
    memory = workloads.load("cnn", 3, 64, 16)
    disk = workloads.load("cnn:storage=disk", 3, 64, 16)
    assert isinstance(disk.train, datasets.MemmapDataset) and len(disk.train) == 64 and len(disk.val) == 16
    for i in (0, 17, 63):
        x, y = disk.train[i]
        assert torch.equal(x, memory.train[0][i]) and torch.equal(y, memory.train[1][i])
    files = sorted(data_cache.iterdir())
    assert len(files) == 4 and all(f.suffix == ".npy" for f in files)
    stamps = [f.stat().st_mtime_ns for f in files]
    workloads.load("cnn:storage=disk", 3, 64, 16)
    assert [f.stat().st_mtime_ns for f in sorted(data_cache.iterdir())] == stamps  # written once


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.processes)])  # 2: worker processes
def test_the_loader_yields_the_planned_batches_every_epoch(workers: int) -> None:
    """Each epoch's DataLoader batches are the tensor path's train_batches, on each of 2 ranks."""
    cfg = config(workload="mlp", batch_size=8, steps_per_epoch=5, accumulate=2, workers=workers, dataloader=True)
    x, y = workloads.load("mlp", 0, 256, 40).train
    device = torch.device("cpu")
    for rank in (0, 1):
        feed = data.TrainFeed((x, y), cfg, rank, 2, device)
        for epoch in range(3):
            feed.start_epoch(epoch)
            planned = sharding.train_batches(256, 8, rank, 2, epoch, cfg.seed)[:10]
            for batch in planned:
                bx, by = feed.fetch(batch)
                assert torch.equal(bx, x[batch]) and torch.equal(by, y[batch])
            assert feed.sampler.limit == 10 and len(feed.sampler) == 10  # nothing prefetched past the cap
        # In training a batch out of step is an error: a new loader would start inside a timed step.
        feed.start_epoch(0)
        with pytest.raises(RuntimeError, match="out of step"):
            feed.fetch(feed.history[3])
        # The compute baseline and the trace replay steps already trained, from any of them.
        feed.replaying = True
        for batch in feed.history[7:12]:
            bx, _ = feed.fetch(batch)
            assert torch.equal(bx, x[batch])
        feed.close()


def test_train_batches_is_the_distributed_sampler_in_full_batches() -> None:
    from torch.utils.data import DistributedSampler

    for n, batch, world in ((100, 8, 2), (97, 5, 3), (64, 64, 1)):
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=4, drop_last=True)
            sampler.set_epoch(2)
            order = list(sampler)
            expected = [order[i * batch : (i + 1) * batch] for i in range(len(order) // batch)]
            assert sharding.train_batches(n, batch, rank, world, 2, 4) == expected


@pytest.mark.processes
def test_tensor_loader_and_disk_paths_train_the_same_curve(tmp_path) -> None:
    common = {"workload": "mlp", "epochs": 2, "steps_per_epoch": 6, "batch_size": 16, "seed": 2, "warmup_steps": 1}
    curves = {}
    for label, extra in (
        ("tensors", {}),
        ("loader", {"dataloader": True}),
        ("disk-2-workers", {"workload": "mlp:storage=disk", "workers": 2}),
    ):
        frame = train(config(**{**common, **extra}), tmp_path / label)
        curves[label] = (frame["loss_sum"].tolist(), frame.attrs["val"], len(frame.attrs["baseline"]))
    assert len(curves["tensors"][0]) == 12
    assert curves["loader"] == curves["tensors"]
    assert curves["disk-2-workers"] == curves["tensors"]


class Pairs(Dataset):
    def __init__(self, item: Any) -> None:
        self.item = item

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        return self.item


def test_a_dataset_of_non_pairs_is_refused() -> None:
    from benchmarks.errors import InputError
    from benchmarks.run.workloads.checks import check_workload

    good = workloads.load("linear", 0, 64, 8)
    for item, text in (
        (torch.zeros(10), "train\\[0\\] is Tensor; a Dataset's item i must be the pair"),
        ((torch.zeros(10),), "train\\[0\\] is tuple"),
    ):
        bad = workloads.Workload("bad", good.build_model, Pairs(item), good.val, good.loss)
        with pytest.raises(InputError, match=text):
            check_workload(bad, "bad")
    with pytest.raises(InputError, match="give a tuple \\(inputs, targets\\) of tensors or a map-style"):
        check_workload(workloads.Workload("bad", good.build_model, [1, 2], good.val, good.loss), "bad")


# --- the optimizer ----------------------------------------------------------------------------------


def test_optimizer_choice_and_a_workloads_own() -> None:
    model = torch.nn.Linear(3, 1)
    sgd = make_optimizer(model, config(workload="linear", lr=0.2))
    assert describe_optimizer(sgd)["name"] == "SGD" and describe_optimizer(sgd)["momentum"] == 0.9
    adamw = describe_optimizer(make_optimizer(model, config(workload="linear", optimizer="adamw", lr=0.01)))
    assert adamw["name"] == "AdamW" and adamw["lr"] == 0.01 and adamw["betas"] == [0.9, 0.999]
    json.dumps(adamw)  # run.json takes it as is
    own = workloads.load("linear", 0, 64, 8)
    own.optimizer = lambda m, lr: torch.optim.RMSprop(m.parameters(), lr=lr / 10)
    mine = make_optimizer(model, config(workload="linear", optimizer="adamw", lr=0.5), own)
    assert isinstance(mine, torch.optim.RMSprop) and mine.defaults["lr"] == 0.05


# --- Hugging Face, offline --------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="the hf extra is not installed")
@pytest.mark.parametrize(("name", "objective"), [(TINY_GPT2, "causal"), (TINY_BERT, "masked")])
def test_hf_models_build_offline_and_learn(tmp_path, name: str, objective: str) -> None:
    workload = workloads.load(name, 0, 64, 16)
    assert workload.args["objective"] == objective and workload.args["context"] == 16
    model = workload.build_model()
    assert sum(p.numel() for p in model.parameters()) < 300_000
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    cfg = config(
        workload=name,
        train_size=64,
        val_size=16,
        epochs=1,
        steps_per_epoch=8,
        batch_size=8,
        lr=0.01,
        warmup_steps=1,
        optimizer="adamw",
    )
    frame = train(cfg, tmp_path)
    losses = (frame["loss_sum"] / frame["samples"]).tolist()
    assert losses[-1] < losses[0]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="the hf extra is not installed")
def test_hf_bad_names_and_fields() -> None:
    with pytest.raises(ValueError, match="transformers has no configuration class 'NopeConfig'"):
        workloads.load("hf:NopeConfig", 0)
    with pytest.raises(ValueError, match="GPT2Config has no field 'n_lay'"):
        workloads.load("hf:gpt2:n_lay=2", 0)


def test_an_error_raised_in_a_users_workload_module_names_its_file_and_line(tmp_path, monkeypatch) -> None:
    (tmp_path / "mine_broken.py").write_text(
        "def factory(seed, train_size=None, val_size=None):\n    raise RuntimeError('no data here')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"no data here \(at .*mine_broken\.py:2\)"):
        workloads.load("mine_broken:factory", 0)
