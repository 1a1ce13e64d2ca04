"""Ranks that would train on different data are caught before training, under every launcher; compare
refuses such a workload before any job starts, and says when its variants saw the same inputs."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.helpers import BIN, REPO, horovodrun, mpirun, run_cmd, run_ok, torchrun

# The tutorial way: data made at import with an unseeded torch.randn, so every process has its own.
TUTORIAL = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from benchmarks.run.workloads import Workload

    X = torch.randn(512, 8)
    Y = X.sum(1, keepdim=True)


    def factory(seed, train_size=None, val_size=None):
        return Workload(name="tutorial", build_model=lambda: nn.Linear(8, 1), train=(X[:448], Y[:448]),
                        val=(X[448:], Y[448:]), loss=lambda out, y: F.mse_loss(out, y, reduction="none").mean(dim=1))
""")
SHORT = ["--epochs", "1", "--steps-per-epoch", "4", "--warmup-steps", "1", "--quiet", "--compute-baseline-steps", "0"]
UNDER = {
    "torchrun": (lambda: torchrun(2), "ddp", 1),
    "horovodrun": (lambda: horovodrun(2, "--gloo"), "horovod", 1),
    "mpirun": (lambda: mpirun(2), "ddp", 2),
}


def _tutorial(tmp_path) -> str:
    (tmp_path / "tutorial.py").write_text(TUTORIAL)
    return f"{tmp_path}:{REPO}"


def _one_error_line(stderr: str) -> str:
    ours = [line for line in stderr.splitlines() if "distbench: error:" in line]
    assert len(ours) == 1, stderr[-3000:]
    assert f'File "{REPO / "benchmarks"}' not in stderr, stderr[-3000:]  # no traceback of ours
    return ours[0]


# `make test` checks the data under torchrun; horovodrun and mpirun, where the same rank-side check refuses
# (test_bad_input.py puts each launcher's own bad input in `make test`), are `full_matrix`.
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "launcher", [u if u == "torchrun" else pytest.param(u, marks=pytest.mark.full_matrix) for u in UNDER]
)
def test_ranks_on_different_data_are_bad_input_under_every_launcher(tmp_path, launcher: str, horovod_available) -> None:
    prefix, backend, code = UNDER[launcher]
    proc = run_cmd(
        [
            *prefix(),
            "run",
            "--backend",
            backend,
            "--workload",
            "tutorial:factory",
            *SHORT,
            "--out",
            str(tmp_path / "out"),
        ],
        timeout=100,
        PYTHONPATH=_tutorial(tmp_path),
    )
    assert proc.returncode == code, proc.stderr[-3000:]
    line = _one_error_line(proc.stderr)
    assert "different training data (rank 1 differs from rank 0)" in line
    assert "build the data from the factory's `seed` argument" in line
    assert not (tmp_path / "out").exists()  # bad input: no result files


@pytest.mark.timeout(60)
def test_compare_refuses_unseeded_data_before_any_job(tmp_path) -> None:
    proc = run_cmd(
        [
            str(BIN / "distbench"),
            "compare",
            "--backends",
            "single,ddp",
            "--workload",
            "tutorial:factory",
            *SHORT,
            "--out",
            str(tmp_path / "out"),
        ],
        timeout=50,
        PYTHONPATH=_tutorial(tmp_path),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "`seed` argument" in _one_error_line(proc.stderr) and "[compare 1/" not in proc.stderr
    assert not (tmp_path / "out").exists()


# That single and ddp saw the same inputs is read from test_compare.py's single+ddp compare (one compare for both).


RANKED_WEIGHTS = textwrap.dedent("""
    import os

    import torch
    import torch.nn.functional as F
    from torch import nn

    from benchmarks.run.workloads import Workload


    def model():
        torch.manual_seed(int(os.environ.get("RANK", "0")))  # each rank its own weights
        return nn.Linear(8, 1)


    def factory(seed, train_size=None, val_size=None):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(512, 8, generator=g)
        y = x.sum(1, keepdim=True)
        return Workload(name="ranked", build_model=model, train=(x[:448], y[:448]), val=(x[448:], y[448:]),
                        loss=lambda out, t: F.mse_loss(out, t, reduction="none").mean(dim=1))
""")


@pytest.mark.timeout(120)
def test_different_initial_weights_are_recorded_not_refused(tmp_path) -> None:
    (tmp_path / "ranked.py").write_text(RANKED_WEIGHTS)
    proc = run_ok(
        [
            *torchrun(2),
            "run",
            "--backend",
            "ddp",
            "--workload",
            "ranked:factory",
            *SHORT,
            "--out",
            str(tmp_path),
            "--run-id",
            "r",
        ],
        timeout=100,
        PYTHONPATH=f"{tmp_path}:{REPO}",
    )
    assert "different initial weights (harmless" in proc.stderr
    record = json.loads((tmp_path / "r" / "run.json").read_text())["fingerprint"]
    assert record["initial_weights_agree"] is False and len(set(record["by_rank"])) == 2
    assert record["initial_weights"] == record["by_rank"][0]
