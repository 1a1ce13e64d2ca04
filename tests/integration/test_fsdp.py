"""FSDP2 under real launchers: the loss curves of fsdp@torchrun and fsdp@mpirun equal DDP's and single's on
a transformer, a Dataset workload (AdamW) and an `hf:` model; `--trace` works and the run passes check; and
what FSDP2 cannot honour is one line, exit 2, under torchrun and mpirun, before any run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.analysis import check
from tests.helpers import CLI, TINY_GPT2, mpirun, read_run, run_cmd, run_ok, torchrun

STEPS = [
    "--epochs",
    "1",
    "--steps-per-epoch",
    "6",
    "--warmup-steps",
    "1",
    "--seed",
    "3",
    "--quiet",
    "--compute-baseline-steps",
    "2",
    "--train-size",
    "128",
    "--val-size",
    "32",
]
WORKLOADS = {  # name: (options, FSDP's launcher)
    "transformer": (["--workload", "transformer:dim=32,layers=2", "--trace", "--trace-steps", "2"], "torchrun"),
    "disk-adamw": (["--workload", "mlp:storage=disk", "--optimizer", "adamw", "--lr", "0.01"], "mpirun"),
    "hf": (["--workload", TINY_GPT2], "torchrun"),
}
LAUNCH = {"torchrun": lambda: torchrun(2), "mpirun": lambda: mpirun(2)}


class Curves:
    """fsdp, ddp and single on a workload, run on its first use: a tier that deselects a workload's test does
    not pay for its runs."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.runs: dict[tuple[str, str], Path] = {}

    def __getitem__(self, key: tuple[str, str]) -> Path:
        name, _ = key
        if key not in self.runs:
            workload, fsdp_launcher = WORKLOADS[name]
            for backend, cmd, batch in (
                ("fsdp", LAUNCH[fsdp_launcher](), 8),
                ("ddp", torchrun(2), 8),
                ("single", CLI, 16),
            ):
                run_id = f"{name}-{backend}"
                argv = [*cmd, "run", *workload, *STEPS, "--backend", backend, "--batch-size", str(batch)]
                run_ok(
                    [*argv, "--out", str(self.out), "--run-id", run_id],
                    timeout=180,
                    DISTBENCH_DATA_CACHE=str(self.out / "data"),
                )
                self.runs[(name, backend)] = self.out / run_id
        return self.runs[key]


@pytest.fixture(scope="module")
def curves(tmp_path_factory) -> Curves:
    return Curves(tmp_path_factory.mktemp("fsdp"))


# `make test` runs one workload under each of FSDP's launchers (transformer under torchrun, disk-adamw under
# mpirun); the `hf:` model, a third workload, is `full_matrix`.
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "name", [n if n != "hf" else pytest.param(n, marks=pytest.mark.full_matrix) for n in WORKLOADS]
)
def test_fsdp_gives_the_loss_curve_of_ddp_and_single(curves, name: str) -> None:
    frames = {b: read_run(curves[(name, b)])["loss"] for b in ("fsdp", "ddp", "single")}
    train = {b: f[f.split == "train"].set_index("step")["loss"] for b, f in frames.items()}
    val = {b: f[f.split == "val"]["loss"].iloc[-1] for b, f in frames.items()}
    assert len(train["fsdp"]) == 6
    for other in ("ddp", "single"):
        assert (train["fsdp"] - train[other]).abs().max() < 1e-5, other
        assert val["fsdp"] == pytest.approx(val[other], abs=1e-5), other
    meta = json.loads((curves[(name, "fsdp")] / "run.json").read_text())
    assert meta["backend"] == "fsdp" and meta["knobs"]["units"][-1] == ""  # the root is the last unit
    assert not check.check_run(curves[(name, "fsdp")])


@pytest.mark.timeout(900)
def test_trace_and_launchers(curves) -> None:
    traced = json.loads((curves[("transformer", "fsdp")] / "run.json").read_text())
    assert traced["trace"]["steps"] == 2 and traced["trace"]["files"] == ["trace/torch_profiler_rank0.json"]
    assert (curves[("transformer", "fsdp")] / "trace" / "torch_profiler_rank0.json").stat().st_size > 0
    assert json.loads((curves[("disk-adamw", "fsdp")] / "run.json").read_text())["launcher"] == "mpirun"


REFUSED = {
    "a policy that names nothing": (["--workload", "linear", "--fsdp-units", "blocks"], "names no module"),
    "a knob with no meaning": (["--fsdp-units", "root", "--fsdp-min-params", "5"], "--fsdp-min-params applies only"),
}
# `make test` refuses one case under each launcher, each case once; the other pairs are `full_matrix`.
DEFAULT_CASE_OF_LAUNCHER = {"torchrun": "a policy that names nothing", "mpirun": "a knob with no meaning"}
REFUSED_UNDER_LAUNCHERS = [
    pytest.param(
        case,
        launcher,
        id=f"{case}-{launcher}",
        marks=() if DEFAULT_CASE_OF_LAUNCHER[launcher] == case else pytest.mark.full_matrix,
    )
    for case in REFUSED
    for launcher in LAUNCH
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("case", "launcher"), REFUSED_UNDER_LAUNCHERS)
def test_what_fsdp_cannot_honour_is_refused_in_one_line(tmp_path: Path, launcher: str, case: str) -> None:
    extra, said = REFUSED[case]
    argv = [*LAUNCH[launcher](), "run", "--backend", "fsdp", *STEPS, *extra, "--out", str(tmp_path)]
    proc = run_cmd(argv, timeout=180)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "distbench: error:" in line]
    assert len(lines) == 1 and said in lines[0], proc.stderr[-3000:]
    # mpirun passes the ranks' 2 on; torchrun reports any failing rank as 1 (docs/reliability.md).
    assert proc.returncode == (2 if launcher == "mpirun" else 1), proc.returncode
    assert not list(tmp_path.iterdir())  # refused before any run directory
