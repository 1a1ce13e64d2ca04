"""The step options in-process: how compare names and splits them, what a run's step is called, the tolerance its
loss agreement allows, the blocks activation checkpointing recomputes, and the FLOPs a step is counted at."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from backends import step
from benchmarks.analysis import agreement, decision, decision_words
from benchmarks.config import PLAIN_STEP, step_of
from benchmarks.errors import InputError
from benchmarks.run import stepper, workloads
from benchmarks.suite import variants
from tests.helpers import config


def test_compare_runs_every_combination_of_the_step_lists_named_by_what_varies() -> None:
    steps = variants.parse_steps(config(amp="off,bf16", compile="off,on"))
    assert steps == [
        {"amp": "off", "compile": "off"},
        {"amp": "off", "compile": "on"},
        {"amp": "bf16", "compile": "off"},
        {"amp": "bf16", "compile": "on"},
    ]
    assert [variants.step_suffix(s, steps) for s in steps] == [
        "-fp32-eager",
        "-fp32-compiled",
        "-bf16-eager",
        "-bf16-compiled",
    ]
    one = variants.parse_steps(config(amp="bf16"))
    assert variants.step_suffix(one[0], one) == ""  # nothing varies: the names compare always gave


@pytest.mark.parametrize(("amp", "compile"), [("fp17", "off"), ("off", "maybe"), ("off,off", "off")])
def test_a_step_list_with_an_unknown_or_repeated_value_is_refused(amp: str, compile: str) -> None:
    with pytest.raises(InputError):
        variants.parse_steps(config(amp=amp, compile=compile))


def test_a_runs_step_is_named_from_its_config_and_older_runs_trained_the_plain_one() -> None:
    assert step_of({}) == PLAIN_STEP == "fp32 eager"
    assert step_of({"amp": "bf16", "compile": "on", "clip_grad_norm": 1.0}) == "bf16 compiled, clip 1"
    assert step_of({"activation_checkpointing": True}) == "fp32 eager, checkpointed"
    assert agreement.tolerance_of("fp32 eager") == agreement.TOLERANCE
    assert agreement.tolerance_of("fp32 compiled, clip 1") == agreement.COMPILED_TOLERANCE
    assert agreement.tolerance_of("bf16 eager") == agreement.AMP_TOLERANCE


def _setup(step_words: str, leader: str, status: str) -> dict:
    return {
        "workload": "w",
        "global_batch": 8,
        "world_size": 2,
        "step_config": step_words,
        "decides": True,
        "status": status,
        "recommended": {"variant": leader},
    }


def test_the_decision_says_whether_the_pick_changes_with_the_step() -> None:
    same = decision.by_step([_setup("fp32 eager", "ddp", "resolved"), _setup("bf16 eager", "ddp", "resolved")])
    assert [s["pick_changes"] for s in same] == [False]
    changes = [_setup("fp32 eager", "ddp", "resolved"), _setup("bf16 eager", "hvd", "resolved")]
    assert decision.by_step(changes)[0]["pick_changes"]
    [line] = decision_words.step_words({"by_step": decision.by_step(changes)})
    assert "the pick changes with the step: fp32 eager → ddp; bf16 eager → hvd" in line
    # a leader that is not resolved cannot make the pick change
    unresolved = [_setup("fp32 eager", "ddp", "resolved"), _setup("bf16 eager", "hvd", "unresolved")]
    assert not decision.by_step(unresolved)[0]["pick_changes"]
    assert decision.by_step([_setup("fp32 eager", "ddp", "resolved")]) == []  # one step: no study


def test_checkpointing_recomputes_blocks_and_survives_a_copy_with_the_same_gradients() -> None:
    work = workloads.load("transformer:dim=16,layers=2", 0)
    torch.manual_seed(0)
    plain = work.build_model()
    checkpointed = copy.deepcopy(plain)
    assert step.checkpoint_blocks(checkpointed) == ["blocks.0", "blocks.1"]
    assert step.checkpoint_blocks(checkpointed) == ["blocks.0", "blocks.1"]  # twice: still one wrapper each
    twin = copy.deepcopy(checkpointed)  # a compute baseline's copy keeps the recomputation, on its own weights
    assert twin.blocks[0].forward.args[0].__self__ is twin.blocks[0]
    x, y = work.train[0][:4], work.train[1][:4]
    grads = []
    for model in (plain, checkpointed, twin):
        work.loss(model(x), y).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_a_workload_without_blocks_is_refused_for_checkpointing_in_one_line() -> None:
    with pytest.raises(InputError, match="has no blocks"):
        step.check(config(workload="linear", activation_checkpointing=True), "cpu", lambda: nn.Linear(10, 1))
    assert step.outer_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), composite=True) == []


def test_model_flops_are_those_of_forward_and_backward_counted_on_the_meta_device() -> None:
    model = nn.Linear(64, 32, bias=False)
    x, y = torch.randn(8, 64), torch.randn(8, 32)
    flops = stepper.model_flops(lambda: model, lambda out, t: ((out - t) ** 2).mean(dim=1), x, y)
    assert flops == 2 * (2 * 8 * 64 * 32)  # forward, and backward's weight gradient (the input needs none)
    assert stepper.tokens_per_sample(torch.zeros(4, 16, dtype=torch.long)) == 16
    assert stepper.tokens_per_sample(x) is None


def test_the_warmup_lasts_while_any_rank_compiles() -> None:
    agreed = []
    warm = stepper.Warmup(config(compile="on"), lambda mine: agreed.append(mine) or 1)  # another rank compiled
    warm.start()
    warm.finish(2.0, timed=False)
    assert not warm.settled() and agreed == [0]  # this rank compiled nothing; the other did
    off = stepper.Warmup(config(), lambda mine: 1 / 0)  # never asks: no collective without --compile
    off.start()
    off.finish(1.0, timed=False)
    assert off.settled()


def test_a_step_study_compares_loss_curves_within_each_step_and_holds_each_to_its_tolerance(tmp_path) -> None:
    from benchmarks.analysis import load, tables
    from tests.helpers import DDP, HOROVOD, ONE_RANK, make_run

    bf16 = {"amp": "bf16"}
    make_run(tmp_path, "ddp-fp32", "ddp", ONE_RANK, 1.0, losses=[1.0, 0.8, 0.6], meta=DDP)
    make_run(tmp_path, "hvd-fp32", "horovod", ONE_RANK, 1.0, losses=[1.0, 0.8, 0.6], meta=HOROVOD)
    make_run(tmp_path, "ddp-bf16", "ddp", ONE_RANK, 1.0, losses=[1.0, 0.7, 0.5], meta={**DDP, "config": bf16})
    # within bf16's rounding of DDP's curve (5e-4 < 5e-3), which fp32's tolerance would call another model
    hvd_bf16 = {**HOROVOD, "config": bf16}
    make_run(tmp_path, "hvd-bf16", "horovod", ONE_RANK, 1.0, losses=[1.0, 0.7005, 0.5], meta=hvd_bf16)
    result = tables.loss_agreement(load.load_runs(tmp_path))
    assert set(result.per_setup) == {"synthetic · global batch 10", "synthetic · global batch 10 · bf16 eager"}
    fp32, bf16_setup = (result.per_setup[k] for k in sorted(result.per_setup))
    assert fp32.train == 0.0 and fp32.tolerance == agreement.TOLERANCE
    assert bf16_setup.train == pytest.approx(5e-4) and bf16_setup.tolerance == agreement.AMP_TOLERANCE
    assert not bf16_setup.explanation  # within its tolerance: nothing to explain
