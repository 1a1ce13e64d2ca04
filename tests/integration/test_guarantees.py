"""Guarantees under real launchers: every rank starts from rank 0's model however it was initialised, and
several epochs train on each epoch's own shuffle on 2 ranks.

Run as a script under a launcher, this file is its own probe:
    horovodrun -np 2 --gloo python tests/integration/test_guarantees.py horovod
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":  # a probe started by a launcher: the repository root on the import path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import backends
from benchmarks import launch
from benchmarks.config import RunConfig
from benchmarks.launch import rendezvous
from benchmarks.run import workloads
from tests.helpers import BIN, REPO, horovodrun, read_run, reference_train_losses, run_ok, torchrun

PROBE = str(REPO / "tests" / "integration" / "test_guarantees.py")


def prepare_probe(name: str) -> None:
    """Initialise each rank differently (weights and BatchNorm buffers), prepare, report what rank 0 sees."""
    cls = backends.get(name)
    cfg = workloads.resolve(RunConfig(workload="cnn", timeout=60))
    backend = cls(cfg, backends.options_of(cls.name)(), launch.detect())
    backend.init()
    rank = backend.rank
    torch.manual_seed(100 + rank)  # deliberately not the shared seed
    model = workloads.load("cnn", 0, 64, 8).build_model()
    for buffer in model.buffers():
        if buffer.is_floating_point():
            buffer.add_(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backend.prepare(model, optimizer)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    states = backend.all_gather_object({"before": before, "after": after})
    backend.shutdown()
    if rank == 0:

        def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
            return all(torch.equal(a[k], b[k]) for k in a)

        print(
            json.dumps(
                {
                    "differed_before": not same(states[0]["before"], states[1]["before"]),
                    "rank0_kept": same(states[0]["before"], states[0]["after"]),
                    "all_equal_after": all(same(states[0]["after"], s["after"]) for s in states),
                }
            )
        )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_prepare_starts_every_rank_from_rank_0(backend: str, horovod_available) -> None:
    if backend == "ddp":
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", PROBE, "ddp"]
    else:
        cmd = [str(BIN / "horovodrun"), "-np", "2", "--gloo", str(BIN / "python"), PROBE, "horovod"]
    out = run_ok(cmd, timeout=150).stdout
    seen = json.loads(out.strip().splitlines()[-1].removeprefix("[0]<stdout>:"))
    assert seen == {"differed_before": True, "rank0_kept": True, "all_equal_after": True}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_several_epochs_on_2_ranks_match_a_plain_loop(tmp_path, backend: str, horovod_available) -> None:
    """Each epoch reshuffles with its own epoch number: the loss curve of 3 epochs on 2 ranks is a plain
    single-process loop's (DistributedSampler.set_epoch), step for step."""
    cfg = workloads.resolve(RunConfig(workload="mlp", epochs=3, steps_per_epoch=4, batch_size=32, seed=11))
    args = [
        "run",
        "--backend",
        backend,
        "--workload",
        "mlp",
        "--epochs",
        "3",
        "--steps-per-epoch",
        "4",
        "--batch-size",
        "16",
        "--seed",
        "11",
        "--quiet",
        "--out",
        str(tmp_path),
        "--run-id",
        "r",
    ]
    run_ok([*(torchrun(2) if backend == "ddp" else horovodrun(2)), *args], timeout=200)
    loss = read_run(tmp_path / "r")["loss"]
    train = loss[loss["split"] == "train"]
    assert train["epoch"].tolist() == [1] * 4 + [2] * 4 + [3] * 4
    assert train["loss"].to_numpy() == pytest.approx(reference_train_losses(cfg), abs=1e-5)
    assert (loss["split"] == "val").sum() == 3


if __name__ == "__main__":
    prepare_probe(sys.argv[1])
    # gloo's threads outlive destroy_process_group; ordinary teardown can abort an exit (CI saw it once here).
    rendezvous.exit_process(0)
