"""Rank-consistency fingerprints: what they hash, the bad-input line, and what the loss agreement says
from the fingerprints in run.json (the same inputs, different data, a buffer knob without buffers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks.analysis import load, tables
from benchmarks.errors import InputError
from benchmarks.run import fingerprint
from tests.helpers import DDP, HOROVOD, ONE_RANK, make_run


class Rows(Dataset):
    def __init__(self, seed: int, count: int = 100) -> None:
        self.seed, self.count = seed, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict]:
        x = torch.tensor(np.random.default_rng([self.seed, i]).standard_normal(4), dtype=torch.float32)
        return x, {"y": x.sum(), "tag": object()}  # an object of its own: its identity must not count


def test_the_same_content_gives_the_same_fingerprint_and_any_change_another() -> None:
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(1))
    a = fingerprint.of_split((x, x.sum(1)))
    assert a == fingerprint.of_split((x.clone(), x.sum(1).clone())) and a["items"] == "all"
    x2 = x.clone()
    x2[49, 2] += 1e-6
    assert fingerprint.of_split((x2, x.sum(1))) != a
    assert fingerprint.of_split((x.double(), x.sum(1))) != a  # dtype counts
    assert fingerprint.of_split(Rows(0)) == fingerprint.of_split(Rows(0))
    assert fingerprint.of_split(Rows(0)) != fingerprint.of_split(Rows(1))
    assert fingerprint.of_split(Rows(0))["items"] == fingerprint.DATASET_ITEMS


def test_a_dataset_is_sampled_evenly_first_and_last_included() -> None:
    assert fingerprint.dataset_indices(5) == [0, 1, 2, 3, 4]
    spread = fingerprint.dataset_indices(1000)
    assert spread[0] == 0 and spread[-1] == 999 and len(spread) == fingerprint.DATASET_ITEMS


def test_weights_as_built_and_float_buffers() -> None:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    torch.manual_seed(0)
    b = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    assert fingerprint.of_model(a) == fingerprint.of_model(b) != fingerprint.of_model(nn.Linear(3, 2))
    assert fingerprint.float_buffers(a) == 2 and fingerprint.float_buffers(nn.Linear(3, 2)) == 0  # not the counter
    record = fingerprint.weights_record(["aa", "bb"])
    assert record == {"initial_weights": "aa", "initial_weights_agree": False, "by_rank": ["aa", "bb"]}
    assert fingerprint.weights_record(["aa", "aa"]) == {"initial_weights": "aa", "initial_weights_agree": True}


def test_ranks_with_different_data_are_bad_input_naming_the_seed_argument() -> None:
    same = fingerprint.of_data((torch.ones(4, 2), torch.ones(4)), (torch.ones(2, 2), torch.ones(2)))
    other = fingerprint.of_data((torch.zeros(4, 2), torch.ones(4)), (torch.ones(2, 2), torch.ones(2)))
    fingerprint.check_data(same, lambda mine: [mine, same], "w")  # agreeing ranks pass
    with pytest.raises(InputError) as caught:
        fingerprint.check_data(same, lambda mine: [mine, same, other], "mine:factory")
    said = str(caught.value)
    assert "\n" not in said and "different training data (rank 2 differs from rank 0)" in said
    assert "build the data from the factory's `seed` argument" in said


PRINT = {
    "train": {"sha256": "t0", "items": "all"},
    "val": {"sha256": "v0", "items": "all"},
    "initial_weights": "w0",
    "initial_weights_agree": True,
}


def _pair(tmp_path, ddp_print: dict, buffers: int, val: tuple[float, float] = (0.7, 0.7)) -> tables.Agreement:
    make_run(
        tmp_path,
        "ddp-r0",
        "ddp",
        ONE_RANK,
        wall=1.0,
        val=[val[0]],
        meta={**DDP, "fingerprint": ddp_print, "model_float_buffers": buffers},
    )
    make_run(
        tmp_path,
        "horovod-r0",
        "horovod",
        ONE_RANK,
        wall=1.0,
        val=[val[1]],
        meta={**HOROVOD, "fingerprint": PRINT, "model_float_buffers": buffers},
    )
    return tables.loss_agreement(load.load_runs(tmp_path))


def test_runs_with_the_same_inputs_say_so_in_the_agreement_line(tmp_path) -> None:
    agreement = _pair(tmp_path, PRINT, buffers=0)
    assert agreement.inputs == "inputs: the same data and initial weights in all 2 runs (run.json fingerprints)"
    assert agreement.inputs in "\n".join(agreement.lines())


def test_runs_on_different_data_are_named_before_any_knob(tmp_path) -> None:
    agreement = _pair(tmp_path, {**PRINT, "train": {"sha256": "t1", "items": "all"}}, buffers=2, val=(0.7, 0.9))
    assert "trained on different data" in agreement.inputs and "`seed` argument" in agreement.inputs
    assert "ddp@torchrun vs horovod@gloo" in agreement.inputs
    assert agreement.explanation == "validation losses differ: the runs trained on different data"


def test_the_buffer_knob_is_named_only_for_a_model_with_float_buffers(tmp_path) -> None:
    with_buffers = _pair(tmp_path / "bn", PRINT, buffers=2, val=(0.7, 0.75))
    assert "--no-broadcast-buffers" in with_buffers.explanation
    without = _pair(tmp_path / "linear", PRINT, buffers=0, val=(0.7, 0.75))
    assert "broadcast" not in without.explanation, without.explanation


def test_on_cuda_nondeterministic_kernels_are_named(tmp_path) -> None:
    for run_id, backend, meta, val in (("ddp-r0", "ddp", DDP, 0.7), ("horovod-r0", "horovod", HOROVOD, 0.71)):
        on_cuda = {**meta, "config": {**meta["config"], "device": "cuda"}, "model_float_buffers": 0}
        make_run(tmp_path, run_id, backend, ONE_RANK, wall=1.0, val=[val], meta=on_cuda)
    agreement = tables.loss_agreement(load.load_runs(tmp_path))
    assert "nondeterministic kernels" in agreement.explanation, agreement.explanation


def test_a_large_in_memory_split_is_hashed_by_spread_rows(monkeypatch) -> None:
    monkeypatch.setattr(fingerprint, "WHOLE_TENSOR_BYTES", 1000)
    monkeypatch.setattr(fingerprint, "TENSOR_ROWS", 16)
    x = torch.randn(500, 4, generator=torch.Generator().manual_seed(2))
    sampled = fingerprint.of_split((x, x.sum(1)))
    assert sampled["items"] == 16 and sampled == fingerprint.of_split((x.clone(), x.sum(1)))
    assert fingerprint.of_split((x[:-1], x[:-1].sum(1))) != sampled  # the shape counts, and the last row is hashed
