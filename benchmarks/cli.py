"""`distbench` command line: run, compare, report, doctor.

    distbench doctor                                   what this machine can run
    torchrun --standalone --nproc-per-node 2 -m benchmarks.cli run --backend ddp --workload mlp
    horovodrun -np 2 --gloo python -m benchmarks.cli run --backend horovod --workload mlp
    distbench compare                                  the default DDP-vs-Horovod comparison
    distbench report results/runs/<compare-id>         tables, plots, report.md/html
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import backends
from benchmarks import config
from benchmarks.config import DDPConfig, HorovodConfig, RunConfig

EXIT_BAD_INPUT = 2


class InputError(ValueError):
    """Bad input caught before any work: one line, exit code 2, no result files."""


def add_run_options(parser: argparse.ArgumentParser) -> None:
    for section in config.SECTIONS:
        config.add_arguments(parser, section)


def validate(backend: str, cfg: RunConfig) -> None:
    """Refuse bad input before any process group starts."""
    if backend not in backends.NAMES:
        raise InputError(f"unknown backend '{backend}'; known: {', '.join(backends.NAMES)}")
    for name in ("epochs", "batch_size", "accumulate", "flush_every"):
        if getattr(cfg, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(cfg, name)}")
    for name in ("train_size", "val_size", "steps_per_epoch", "threads"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if cfg.warmup_steps < 0 or cfg.timeout <= 0:
        raise InputError("--warmup-steps must be >= 0 and --timeout > 0")
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")


def _cmd_run(args: argparse.Namespace) -> int:
    from benchmarks import harness, launch

    cfg = config.from_namespace(RunConfig, args)
    try:
        validate(args.backend, cfg)
        run_dir = harness.run(args.backend, cfg, config.from_namespace(DDPConfig, args),
                              config.from_namespace(HorovodConfig, args))
    except (InputError, launch.WrongLauncherError) as exc:
        print(f"distbench: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if run_dir is not None:
        print(run_dir)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from benchmarks import environment

    return environment.doctor()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one benchmark inside the current launcher")
    run.add_argument("--backend", required=True, help=f"one of {', '.join(backends.NAMES)}")
    add_run_options(run)
    run.set_defaults(func=_cmd_run)

    doctor = sub.add_parser("doctor", help="print versions and what Horovod was built with")
    doctor.set_defaults(func=_cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
