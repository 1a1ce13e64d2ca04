"""The options of `distbench compare` (and `tune`, which shares them): compare's preset, how its defaults
differ from `run`'s, the options in effect, and the start-up lines that spell them out.

Imported by the parser of every `distbench` process, ranks included: no torch, no analysis stack.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import backends
from benchmarks import catalog, config
from benchmarks.config import RunConfig
from benchmarks.errors import InputError
from benchmarks.run import workloads
from benchmarks.suite import host_options, precision, sizing, variants
from benchmarks.suite.variants import Job

# The embedded default, used only when no --workload is given: a communication-heavy model (so the
# two frameworks' allreduce strategies differ) in one epoch of 80 timed steps. Launcher start-up,
# imports and the report cost ~7 s per run whatever the length, so a run must be this long for over a
# third of a compare's wall time to be measured (README: "where a compare's time goes").
PRESET: dict[str, Any] = {
    "workload": "transformer",
    "epochs": 1,
    "steps_per_epoch": 85,
    "train_size": 4096,
    "val_size": 128,
}
DEFAULT_TIME = "about 6 minutes"


def _flags(options: dict[str, Any]) -> str:
    return " ".join(f"{config.flag(k)} {v}" for k, v in options.items())


def add_arguments(cmp: argparse.ArgumentParser) -> None:
    """compare's own options; call after the run options are added, whose preset defaults it rewrites."""
    rest = {k: v for k, v in PRESET.items() if k != "workload"}
    cmp.description = (
        f"With no options: DDP (torchrun) vs Horovod under its Gloo and its MPI controller on {PRESET['workload']} "
        f"(a small GPT), 2 ranks, a pilot of 3 interleaved repeats and a second stage toward a decision within a "
        f"budget, {DEFAULT_TIME} on 2 cores. Without --workload the run "
        f"options default to {_flags(rest)} and the "
        "transformer's own --lr and --batch-size; with --workload W they default to run's and W's own. "
        "compare prints the options in effect before it starts."
    )
    add_variant_options(cmp, scaling=True)
    sizing.add_arguments(cmp)
    host_options.add_arguments(cmp)
    add_preset_defaults(cmp)


def add_variant_options(cmp: argparse.ArgumentParser, scaling: bool) -> None:
    """--backends, --nproc, --repeats, --launcher (and with `scaling`, --nproc lists and --global-batch)."""
    cmp.add_argument(
        "--backends",
        default=None,
        help=f"comma-separated variants BACKEND[@LAUNCHER]: {variants.valid_names()} "
        f"(default: {variants.DEFAULT}; with --launcher: {variants.DEFAULT_WITH_LAUNCHER})",
    )
    lists = ", or a comma-separated list of world sizes for a scaling study, e.g. 1,2,4" if scaling else ""
    cmp.add_argument("--nproc", default="2", help=f"ranks per variant{lists} (default: 2)")
    if scaling:
        cmp.add_argument(
            "--global-batch",
            type=int,
            default=None,
            help="strong scaling: keep this global batch at every world size (per-rank batch = G ÷ (ranks × "
            "--accumulate), which must divide); not with --batch-size (default: weak scaling, a fixed per-rank "
            "batch)",
        )
    cmp.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="interleaved repeats per variant: a fixed design of N runs each (with --precision: the pilot, at least "
        f"3) (default: compare: a pilot of {precision.PILOT}, then a second stage toward a decision at --margin "
        f"within a budget; tune: {precision.PILOT})",
    )
    precision.add_arguments(cmp)
    cmp.add_argument(
        "--launcher",
        choices=variants.FORCEABLE_LAUNCHERS,
        default=None,
        help="the launcher of every bare backend name in --backends (ddp: torchrun or mpirun; horovod: horovodrun "
        "--gloo or mpirun; any of them: srun, inside a Slurm allocation); a BACKEND@LAUNCHER variant keeps its own, "
        "and single always runs under python "
        f"(default: {', '.join(f'{b} → {v}' for b, v in variants.BARE.items())})",
    )


def add_preset_defaults(cmp: argparse.ArgumentParser) -> None:
    """The preset's defaults for the run options already added, and --help texts that say so."""
    rest = {k: v for k, v in PRESET.items() if k != "workload"}
    # None = "not given": the preset fills these only when --workload is not given either, and
    # equal_buffers decides --broadcast-buffers from the variants.
    cmp.set_defaults(**dict.fromkeys(PRESET), broadcast_buffers=None)
    run_defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    texts = {
        "workload": f"{PRESET['workload']} with {_flags(rest)}; a --workload given takes run's defaults and "
        "the workload's own instead",
        **{k: f"{v} without --workload, else {_run_default_text(k, run_defaults[k])}" for k, v in rest.items()},
    }
    # argparse has no public way to change an added option's help; the actions list is stable since 2.7.
    for action in cmp._actions:
        if action.dest == "overwrite":  # a compare or tune always makes a directory of its own (check_not_overwrite)
            action.help = argparse.SUPPRESS
        if action.dest in texts:
            field = next(f for f in dataclasses.fields(RunConfig) if f.name == action.dest)
            action.help = f"{field.metadata['help']} (default: {texts[action.dest]})".replace("%", "%%")


def check_not_overwrite(args: argparse.Namespace, command: str) -> None:
    """compare and tune never replace an existing directory: each makes a new one (a repeated --run-id is refused)."""
    if getattr(args, "overwrite", False):
        raise InputError(
            f"--overwrite is run's option: {command} always makes a new directory and replaces none; give a new "
            "--run-id, or remove the old directory yourself"
        )


def equal_buffers(args: argparse.Namespace, chosen: list[variants.Variant]) -> str | None:
    """compare's and tune's buffer rule (docs/fairness.md): DDP's broadcast of rank 0's buffers before each
    forward changes what a model with BatchNorm computes, unlike a speed knob, so when neither
    --broadcast-buffers nor --no-broadcast-buffers is given it is on only if every variant can do it. Sets
    args.broadcast_buffers; returns the start-up line when that turned DDP's default off."""
    if args.broadcast_buffers is not None:
        return None
    # A backend has the knob when its own options have the field (DDP's); `single` has one rank to agree with.
    can = {
        v.backend
        for v in chosen
        if "broadcast_buffers" in {f.name for f in dataclasses.fields(backends.options_of(v.backend))}
    }
    cannot = [v.name for v in chosen if v.backend not in can | backends.ONE_PROCESS]
    args.broadcast_buffers = not cannot
    if not cannot or not can:  # nothing to equalise, or no variant that would have broadcast
        return None
    names = cannot[0] if len(cannot) == 1 else f"{', '.join(cannot[:-1])} and {cannot[-1]}"
    return (
        f"buffers: DDP's broadcast before each forward is off, as {names} cannot broadcast buffers, so every "
        "variant trains the same model (--broadcast-buffers: DDP's default)"
    )


def _run_default_text(name: str, default: Any) -> str:
    if name in ("train_size", "val_size"):
        sizes = {w: spec.defaults.get(name, "the rest") for w, spec in catalog.REGISTRY.items()}
        return "the workload's: " + ", ".join(f"{w} {v}" for w, v in sizes.items())
    return "one pass" if default is None else str(default)


def effective_config(args: argparse.Namespace) -> tuple[RunConfig, bool]:
    """The run options compare will pass on, and whether they are the preset (no --workload given)."""
    preset = args.workload is None
    fill = PRESET if preset else {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in PRESET}
    given = {k: v for k, v in vars(args).items() if k in PRESET and v is not None}
    cfg = config.from_namespace(RunConfig, argparse.Namespace(**{**vars(args), **fill, **given}))
    return workloads.resolve(cfg), preset


def describe(
    cfg: RunConfig,
    preset: bool,
    jobs: list[Job],
    design: str,
    global_batch: int | None = None,
    buffers: str | None = None,
) -> str:
    """The start-up lines: what will run, with every option that matters spelt out (each variant's own
    backend options that differ from their defaults included, and `buffers`, equal_buffers' line)."""
    chosen = list(dict.fromkeys(j.variant for j in jobs))
    sizes = list(dict.fromkeys(j.nproc for j in jobs))
    names = ", ".join(f"{v.given or v.name} ({v.launch_words()})" for v in chosen)
    single = [f"{j.variant.name}: 1 rank of batch {j.cfg.batch_size}" for j in jobs if j.ranks != j.nproc]
    world = f"{sizes[0]} ranks" if len(sizes) == 1 else f"{', '.join(map(str, sizes))} ranks"
    ranks = f"{world} per variant" + (f" ({', '.join(single)})" if single else "")
    threads = dict.fromkeys(j.threads for j in jobs)
    omp = (
        f"{next(iter(threads))}"
        if len(threads) == 1
        else ", ".join(f"{j.threads} at {j.nproc}" for j in jobs if j.variant == chosen[0])
    )
    if global_batch:
        per_rank = ", ".join(f"{j.cfg.batch_size} at {j.nproc}" for j in jobs if j.variant == chosen[0])
        batch = f"strong scaling: --global-batch {global_batch}, per rank {per_rank}"
    else:
        batch = f"--batch-size {cfg.batch_size} per rank" + (" (weak scaling)" if len(sizes) > 1 else "")
    where = (
        "compare's default; give --workload for a workload's own"
        if preset
        else "the workload's defaults and the options given"
    )
    steps = "one pass per epoch" if cfg.steps_per_epoch is None else f"--steps-per-epoch {cfg.steps_per_epoch}"
    # None: the workload decides (a custom factory's own default, mlp's split of its data)
    train, val = ("the workload's own" if v is None else v for v in (cfg.train_size, cfg.val_size))
    shown = (
        "workload",
        "epochs",
        "steps_per_epoch",
        "warmup_steps",
        "batch_size",
        "lr",
        "train_size",
        "val_size",
        "bind",
    )
    plain = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in (*shown, "out", "run_id")}
    others = config.to_argv(dataclasses.replace(cfg, **plain))
    knobs = {j.variant.name: j.knobs for j in jobs}
    placed = jobs[0].hosts
    return (
        f"distbench compare: {names}; {ranks}, {design}, "
        f"OMP_NUM_THREADS={omp}, CPU placement --bind {cfg.bind or 'none'} for every rank\n"
        f"  {cfg.workload} ({where}): --epochs {cfg.epochs}, {steps}, --warmup-steps {cfg.warmup_steps}, "
        f"{batch}, --lr {cfg.lr}, --train-size {train}, --val-size {val}"
        + (f"; also {' '.join(others)}" if others else "")
        + "".join(f"\n  {name} only: {' '.join(argv)}" for name, argv in knobs.items() if argv)
        + (f"\n  {buffers}" if buffers else "")
        + (f"\n  across {placed.words()}" if placed.many else "")
        + "".join(f"\n  {note}" for note in dict.fromkeys(n for j in jobs for n in j.notes))
        + "".join(
            f"\n  warning: {w}" for w in dict.fromkeys(filter(None, (j.hosts.oversubscription(j.ranks) for j in jobs)))
        )
    )
