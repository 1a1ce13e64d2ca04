"""`distbench compare` before anything starts: which options it uses, what --help says, what it refuses.

In-process through the real parser and `benchmarks.cli.main`; no launcher is started.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import catalog, cli, config
from benchmarks.config import DDPConfig
from benchmarks.suite import compare


def effective(*argv: str):
    return compare.effective_config(cli.build_parser().parse_args(["compare", *argv]))


def test_a_given_workload_brings_its_own_defaults_not_the_transformer_preset() -> None:
    cfg, preset = effective("--workload", "cnn")
    assert not preset
    cnn = catalog.REGISTRY["cnn"].defaults
    assert (cfg.lr, cfg.batch_size, cfg.train_size, cfg.val_size) == (
        cnn["lr"],
        cnn["batch_size"],
        cnn["train_size"],
        cnn["val_size"],
    )
    assert (cfg.epochs, cfg.steps_per_epoch, cfg.warmup_steps) == (2, None, 5)  # run's own defaults


def test_no_workload_means_the_preset_and_given_options_still_win() -> None:
    cfg, preset = effective()
    assert preset and cfg.workload == "transformer" and cfg.lr == catalog.REGISTRY["transformer"].defaults["lr"]
    assert (cfg.epochs, cfg.steps_per_epoch, cfg.train_size) == (1, 85, 4096)
    cfg, preset = effective("--epochs", "2", "--lr", "0.1", "--train-size", "2048")
    assert preset and (cfg.epochs, cfg.lr, cfg.train_size, cfg.steps_per_epoch) == (2, 0.1, 2048, 85)


def test_the_preset_times_enough_steps_on_two_ranks() -> None:
    # The report warns under ~20 timed steps; the preset must not trigger its own warning.
    cfg, _ = effective()
    assert cfg.epochs * cfg.steps_per_epoch - cfg.warmup_steps >= 20
    assert cfg.train_size // (2 * cfg.batch_size) >= cfg.steps_per_epoch  # the cap is reached, not one pass


def test_help_shows_the_defaults_compare_really_uses(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 1 without --workload, else 2)" in text
    assert "(default: 85 without --workload, else one pass)" in text
    assert "(default: 4096 without --workload, else the workload's: linear 4096, mlp the rest, cnn 2048" in text


def test_a_launcher_that_cannot_start_a_backend_is_refused_first(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = cli.main(["compare", "--backends", "ddp", "--launcher", "horovodrun", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT
    assert err.count("\n") == 1 and "'ddp' cannot run under horovodrun" in err and "--launcher" in err
    assert not out.exists()  # nothing started, nothing written


@pytest.mark.parametrize("backends", ["ddp,horovod", "horovod,single"])
def test_every_pair_is_checked_not_only_the_first(tmp_path, capsys, backends: str) -> None:
    code = cli.main(["compare", "--backends", backends, "--launcher", "torchrun", "--out", str(tmp_path / "o")])
    assert code == cli.EXIT_BAD_INPUT
    assert "'horovod' cannot run under torchrun" in capsys.readouterr().err


@pytest.mark.processes
def test_the_parser_and_compare_import_no_analysis_stack() -> None:
    # Every rank builds the parser, which imports compare: ~2 s per rank when this regresses.
    code = (
        "import sys, benchmarks.cli, benchmarks.suite.compare; benchmarks.cli.build_parser(); "
        "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("given", "backends", "ddp_broadcasts", "said"),
    [
        ((), "ddp,horovod@gloo", False, True),  # Horovod cannot broadcast buffers: DDP's broadcast is turned off
        ((), "ddp,fsdp", False, True),
        ((), "ddp@torchrun,ddp@mpirun,single", True, False),  # every variant can: DDP's default stays
        (("--broadcast-buffers",), "ddp,horovod@gloo", True, False),  # given: honoured, the agreement names it
        (("--no-broadcast-buffers",), "ddp,ddp@mpirun", False, False),
    ],
)
def test_compare_makes_buffer_broadcast_equal_unless_it_is_given(given, backends, ddp_broadcasts, said, capsys):
    args = cli.build_parser().parse_args(["compare", "--backends", backends, *given])
    chosen = compare.variants.parse(args.backends)
    line = compare.equal_buffers(args, chosen)
    assert args.broadcast_buffers is ddp_broadcasts
    assert (line is not None) is said
    if said:
        assert "--broadcast-buffers" in line and ("horovod@gloo" in line or "fsdp" in line)
    knobs = config.to_argv(config.from_namespace(DDPConfig, args))
    assert ("--no-broadcast-buffers" in knobs) is (not ddp_broadcasts)


def test_run_keeps_ddp_buffer_broadcast_on_by_default() -> None:
    args = cli.build_parser().parse_args(["run", "--backend", "ddp"])
    assert args.broadcast_buffers is True


@pytest.mark.parametrize(
    ("workload", "more"),
    [("mlp", "raise --epochs (the data set has no more samples)"), ("transformer", "raise --epochs or --train-size")],
)
def test_start_up_says_when_the_data_caps_the_steps_and_what_gives_more(workload, more, tmp_path, capsys) -> None:
    argv = ["compare", "--workload", workload, "--epochs", "1", "--steps-per-epoch", "800", "--out", str(tmp_path)]
    compare.prepare(cli.build_parser().parse_args(argv))
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "caps an epoch" in ln]
    assert "not --steps-per-epoch 800" in line and line.endswith(more)


@pytest.mark.parametrize("command", ["compare", "tune"])
def test_overwrite_is_refused_by_compare_and_tune_and_hidden_from_their_help(command, tmp_path, capsys) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "kept").write_text("nothing of it lost")
    code = cli.main([command, "--out", str(tmp_path), "--run-id", "old", "--overwrite"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT and err.count("\n") == 1 and "give a new --run-id" in err, err
    assert (tmp_path / "old" / "kept").read_text() == "nothing of it lost"
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    assert "--overwrite" not in capsys.readouterr().out
