"""The command line in-process: bad input is one line and exit 2, options are declared once, start-up is light."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import cli, config
from benchmarks.cli import EXIT_BAD_INPUT, main

REPO = Path(__file__).resolve().parents[2]
TINY = ["--workload", "linear", "--epochs", "1", "--steps-per-epoch", "4", "--warmup-steps", "1", "--quiet"]

CUSTOM = """
import torch
import torch.nn.functional as F
from torch import nn
from benchmarks.run.workloads import Workload

def data(seed):
    x = torch.randn(96, 4, generator=torch.Generator().manual_seed(seed))
    return (x[:64], x[:64].sum(1, keepdim=True)), (x[64:], x[64:].sum(1, keepdim=True))

def good(seed, train_size=None, val_size=None):
    train, val = data(seed)
    return Workload("good", lambda: nn.Linear(4, 1), train, val, lambda out, y: ((out - y) ** 2).squeeze(1))

def mean_loss(seed, train_size=None, val_size=None):
    train, val = data(seed)
    return Workload("mean", lambda: nn.Linear(4, 1), train, val, F.mse_loss)

def raises(seed, train_size=None, val_size=None):
    raise KeyError("no such file")

def not_a_workload(seed, train_size=None, val_size=None):
    return {"model": None}

def bad_optimizer(seed, train_size=None, val_size=None):
    workload = good(seed)
    workload.optimizer = lambda model, lr: "adam"
    return workload

class Inputs(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.zeros(4)

def dataset_of_inputs(seed, train_size=None, val_size=None):
    train, val = data(seed)
    return Workload("inputs", lambda: nn.Linear(4, 1), Inputs(), val, lambda out, y: ((out - y) ** 2).squeeze(1))
"""

BAD_INPUT = {
    "unknown backend": (
        ["--backend", "tensorflow"],
        "unknown backend 'tensorflow'; known: ddp, horovod, fsdp, deepspeed, single",
    ),
    "unknown workload": (["--workload", "resnet9000"], "unknown workload 'resnet9000'; known:"),
    "zero batch": (["--batch-size", "0"], "--batch-size must be a positive integer"),
    "negative train size": (["--train-size", "-5"], "--train-size must be a positive integer"),
    "zero epochs": (["--epochs", "0"], "--epochs must be a positive integer"),
    "batch larger than shard": (["--train-size", "50", "--batch-size", "64"], "lower --batch-size"),
    "bad fault": (["--inject-fault", "explode@1"], "--inject-fault takes MODE@STEP[:RANK]"),
    "cuda absent": (["--device", "cuda"], "torch sees no CUDA device; use --device cpu"),
    "zero lr": (["--lr", "0"], "--lr must be a positive number, got 0.0"),
    "negative bucket": (["--backend", "ddp", "--bucket-cap-mb", "-1"], "--bucket-cap-mb must be greater than 0"),
    "negative fusion": (["--backend", "horovod", "--fusion-threshold-mb", "-1"], "threshold-mb must be at least"),
    "negative lr": (["--lr", "-0.1"], "--lr must be a positive number"),
    "steps per epoch within warm-up": (
        ["--epochs", "1", "--steps-per-epoch", "5", "--warmup-steps", "5"],
        "leaves no timed step after --warmup-steps 5",
    ),
    # 64 samples in batches of 32: 2 steps per epoch, 4 in all, all warm-up; only the data size shows it.
    "a pass within warm-up": (
        ["--train-size", "64", "--batch-size", "32", "--warmup-steps", "4"],
        "--epochs 2 × 2 steps per epoch leaves no timed step",
    ),
    "negative baseline": (["--compute-baseline-steps", "-1"], "--compute-baseline-steps must be >= 0"),
    "zero trace steps": (["--trace-steps", "0"], "--trace-steps must be a positive integer"),
    "factory raises": (["--workload", "wl_custom:raises"], "workload 'wl_custom:raises' failed to build: KeyError"),
    "factory returns junk": (["--workload", "wl_custom:not_a_workload"], "returned dict, not a workloads.Workload"),
    "optimizer not an optimizer": (["--workload", "wl_custom:bad_optimizer"], "optimizer(model, lr) returned str"),
    "mean-reduced loss": (["--workload", "wl_custom:mean_loss"], "loss(out, target) must give one value per sample"),
    "missing factory": (["--workload", "wl_custom:nothing"], "cannot load workload 'wl_custom:nothing'"),
    "dataset items not pairs": (["--workload", "wl_custom:dataset_of_inputs"], "must be the pair (input, target)"),
    "unknown size argument": (["--workload", "transformer:depth=3"], "unknown argument 'depth'; transformer takes"),
    "non-positive size argument": (["--workload", "mlp:hidden=0"], "hidden=0 must be a positive integer"),
    "heads not dividing dim": (["--workload", "transformer:dim=100,heads=3"], "heads=3 does not divide dim=100"),
    "negative workers": (["--workers", "-1"], "--workers must be >= 0"),
    "zero prefetch factor": (["--prefetch-factor", "0"], "--prefetch-factor must be a positive integer"),
}


@pytest.fixture
def in_tmp_cwd(tmp_path, monkeypatch) -> Path:
    """A working directory holding a user's workload module, as a new user would have it."""
    (tmp_path / "wl_custom.py").write_text(CUSTOM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("wl_custom", None)


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_exit_2_and_no_files(in_tmp_cwd, capsys, case: str) -> None:
    args, message = BAD_INPUT[case]
    base = {"--backend": "single", "--workload": "linear"}
    args = [*(x for flag, value in base.items() if flag not in args for x in (flag, value)), *args]
    out = in_tmp_cwd / "out"
    assert main(["run", *args, "--quiet", "--out", str(out)]) == EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distbench: error:") and message in lines[0], lines
    assert not out.exists() or not any(out.iterdir())


def test_hf_without_transformers_is_one_line(in_tmp_cwd, capsys, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformers" else real(n, *a))
    assert main(["run", "--backend", "single", "--workload", "hf:gpt2", "--quiet", "--out", "out"]) == EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "distbench: error: workload 'hf:gpt2' needs transformers: pip install -e '.[hf]' (make setup installs it)"
    ]


def test_unwritable_out_is_one_line(tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["run", "--backend", "single", *TINY, "--out", str(blocker / "runs")]) == EXIT_BAD_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "choose a writable --out" in lines[0]


def test_report_out_pointing_at_a_file_is_one_line(tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out in (blocker, blocker / "report"):
        assert main(["report", str(tmp_path), "--out", str(out)]) == EXIT_BAD_INPUT
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "is not a directory" in lines[0], lines


def test_a_custom_workload_from_the_working_directory_runs_and_is_pinned(in_tmp_cwd, capsys) -> None:
    """The console script has its bin directory, not the working directory, on sys.path."""
    assert main(["run", "--backend", "single", *TINY, "--workload", "wl_custom:good", "--out", "out"]) == 0
    meta = json.loads((Path(capsys.readouterr().out.strip()) / "run.json").read_text())
    source = meta["workload_source"]
    assert Path(source["file"]) == in_tmp_cwd / "wl_custom.py"
    import hashlib

    assert source["sha256"] == hashlib.sha256((in_tmp_cwd / "wl_custom.py").read_bytes()).hexdigest()
    assert meta["model_parameters"] == 5  # nn.Linear(4, 1)


def test_every_option_is_recorded_and_another_backends_option_warns(tmp_path, capsys) -> None:
    argv = [
        "run",
        "--backend",
        "single",
        *TINY,
        "--out",
        str(tmp_path),
        "--fusion-threshold-mb",
        "64",
        "--no-broadcast-buffers",
        "--bucket-cap-mb",
        "25",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    meta = json.loads((Path(captured.out.strip()) / "run.json").read_text())
    assert meta["config"]["fusion_threshold_mb"] == 64 and meta["config"]["broadcast_buffers"] is False
    assert meta["config"]["lr"] == 0.05  # the value in effect, not None
    assert meta["model_parameters"] == 11  # nn.Linear(10, 1)
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    # --bucket-cap-mb 25 is DDP's size, but given it caps the first bucket too: a change, so it warns as well.
    flags = [w.split()[2] for w in warnings]
    assert flags == ["--bucket-cap-mb", "--no-broadcast-buffers", "--fusion-threshold-mb"], warnings
    assert all("cannot affect backend 'single'" in w for w in warnings)


def test_inert_options_are_the_other_backends_only() -> None:
    args = cli.build_parser().parse_args(["run", "--backend", "ddp", "--fusion-threshold-mb", "8", "--static-graph"])
    assert config.inert_options(args, config.DDPConfig) == ["--fusion-threshold-mb"]
    assert config.inert_options(args, config.HorovodConfig) == ["--static-graph"]


def test_help_shows_each_workloads_own_defaults(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "transformer 0.3" in text and "transformer 16" in text
    assert "(default: None)" not in text


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, timeout=100
    )


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_rank_side_imports_no_analysis_stack_and_bad_input_no_torch(tmp_path) -> None:
    proc = _python(f"""
        import sys
        from benchmarks.cli import main
        assert main(["run", "--backend", "ddp", "--lr", "0"]) == 2
        assert main(["run", "--backend", "ddp", "--workload", "transformer:dim=100,heads=3"]) == 2
        assert main(["run", "--backend", "ddp", "--workers", "-2"]) == 2
        import importlib.util
        find_spec = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name == "transformers" else find_spec(name, *a)
        assert main(["run", "--backend", "ddp", "--workload", "hf:gpt2"]) == 2
        importlib.util.find_spec = find_spec
        assert "torch" not in sys.modules, "bad input needing no torch imported it"
        assert main(["run", "--backend", "single", {", ".join(map(repr, TINY))}, "--out", {str(tmp_path)!r}]) == 0
        # mlp reads sklearn's bundled data, which must not drag in sklearn.datasets (pandas, scipy)
        mlp = [a if a != "linear" else "mlp" for a in {TINY!r}]
        assert main(["run", "--backend", "single", *mlp, "--out", {str(tmp_path)!r}]) == 0
        heavy = sorted(m for m in ("pandas", "scipy", "matplotlib") if m in sys.modules)
        assert not heavy, heavy
        """)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_version_names_the_distribution_and_its_commit(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("distbench 0.") and "(" in out  # the checkout's commit


def test_an_unwritable_out_says_why_in_words(tmp_path) -> None:
    from benchmarks import files

    for path, reason in (("/proc/distbench-x", "kernel's proc file system"), (f"{tmp_path}/f/x", "is a file")):
        if reason == "is a file":
            (tmp_path / "f").write_text("")
        try:
            Path(path).mkdir(parents=True)
        except OSError as exc:
            assert reason in files.unwritable_reason(path, exc)
        else:
            pytest.fail(f"{path} was made")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--backend", "ddp", "--epochs", "two"], "run: argument --epochs: invalid int value: 'two'"),
        (["compare", "--nosuch", "3"], "compare: unrecognized arguments: --nosuch 3; see distbench compare --help"),
        (["bogus"], "argument command: invalid choice: 'bogus'"),
        (["cluster", "up", "--bogus"], "cluster up: unrecognized arguments: --bogus; see distbench cluster up --help"),
    ],
)
def test_what_the_parser_refuses_is_one_line_naming_the_commands_help(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and err.startswith("distbench: error: "), err
    assert said in err and "usage:" not in err, err
