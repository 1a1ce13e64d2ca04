"""Variants: a backend under one launcher, `BACKEND[@LAUNCHER]`, the unit `compare` and `tune` run.

Horovod's controller (Gloo or MPI) changes its throughput as much as the framework does, so
`horovod@gloo` (horovodrun --gloo) and `horovod@mpi` (horovodrun --mpi) are different rows, never pooled.
Also the world sizes (`--nproc 1,2,4`) and the per-rank batch of weak or strong scaling (`--global-batch`).

Imported by the parser of every `distbench` process, ranks included: no torch, no analysis stack.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import backends
from benchmarks import config, environment, launch
from benchmarks.config import RunConfig
from benchmarks.errors import InputError
from benchmarks.launch import placement
from benchmarks.launch.variants import Variant
from benchmarks.suite.hosts import Hosts

DEFAULT = "ddp@torchrun,horovod@gloo,horovod@mpi"
DEFAULT_WITH_LAUNCHER = "ddp,horovod"
"""--backends when only --launcher is given: one launcher for both backends, as before variants existed."""
BARE = {d.name: d.variants[0].name for d in backends.DECLARED.values()}
"""A bare backend name means its first declared variant (the launcher compare always gave it)."""
FORCED = {
    (d.name, lau): next(v.name for v in d.variants if v.launcher == lau)
    for d in backends.DECLARED.values()
    if not d.one_process
    for lau in dict.fromkeys(v.launcher for v in d.variants)
}
"""--launcher L applied to a bare name: the backend's first variant under L."""
FORCEABLE_LAUNCHERS = (launch.TORCHRUN, launch.HOROVODRUN, launch.MPIRUN, launch.SRUN)


def valid_names() -> str:
    bare = ", ".join(f"{name} means {full}" for name, full in BARE.items() if name != full)
    return f"{', '.join(backends.BY_NAME)} (a bare {bare})"


def parse(text: str | None, launcher: str | None = None) -> list[Variant]:
    """`--backends` as variants, in the order given. `launcher` (--launcher) applies to bare names only;
    a single-process backend always runs under python."""
    text = text if text is not None else (DEFAULT_WITH_LAUNCHER if launcher else DEFAULT)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError(f"--backends is empty; give variants from: {valid_names()}")
    chosen: list[Variant] = []
    for name in names:
        if name in BARE and launcher and name not in backends.ONE_PROCESS:
            full = FORCED.get((name, launcher))
            if full is None:
                mine = [lau for b, lau in FORCED if b == name]
                raise InputError(
                    f"backend '{name}' cannot run under {launcher} (compare runs it under {', '.join(mine)}); "
                    f"leave out --launcher for each backend's own, or name variants: {valid_names()}"
                )
        else:
            full = BARE.get(name, name)
        if full not in backends.BY_NAME:
            raise InputError(f"unknown variant '{name}' in --backends; valid: {valid_names()}")
        variant = replace(backends.BY_NAME[full], given=name)
        if variant in chosen:
            raise InputError(f"variant '{full}' is listed twice in --backends; list each once")
        chosen.append(variant)
    return chosen


def parse_nproc(text: str) -> list[int]:
    """`--nproc 1,2,4`: distinct positive world sizes, in the order given."""
    try:
        sizes = [int(n) for n in str(text).split(",") if n.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise InputError(f"--nproc takes positive integers separated by commas, e.g. 1,2,4; got {text!r}")
    if len(set(sizes)) != len(sizes):
        raise InputError(f"--nproc {text} lists a world size twice; list each once")
    return sizes


def per_rank_batches(global_batch: int, sizes: list[int], accumulate: int) -> dict[int, int]:
    """Strong scaling: per world size, the per-rank micro-batch that keeps the global batch at `global_batch`."""
    need = math.lcm(*sizes) * accumulate
    for n in sizes:
        if global_batch < 1 or global_batch % (n * accumulate):
            raise InputError(
                f"--global-batch {global_batch} does not divide into {n} rank(s) × --accumulate {accumulate} "
                f"(per-rank batch = global batch ÷ (ranks × accumulate)); give a multiple of {need}"
            )
    return {n: global_batch // (n * accumulate) for n in sizes}


def parse_strategies(text: str) -> list[str]:
    """`--val-strategy exact,sampler`: distinct validation strategies in the order given, each its own runs."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    for name in names:
        if name not in config.VAL_STRATEGIES:
            raise InputError(f"--val-strategy '{name}' is not one of {', '.join(config.VAL_STRATEGIES)}")
    if not names:
        raise InputError(f"--val-strategy is empty; give one or more of {', '.join(config.VAL_STRATEGIES)}")
    if len(set(names)) != len(names):
        raise InputError(f"--val-strategy {text} lists a strategy twice; list each once")
    return names


STEP_WORDS = {"amp": {"off": "fp32"}, "compile": {"off": "eager", "on": "compiled"}}
"""How a step option's value names a run when compare studies several (`ddp-bf16-compiled-r0`)."""


def parse_steps(cfg: RunConfig) -> list[dict[str, str]]:
    """`--amp off,bf16 --compile off,on`: every combination of the step options given as lists (amp outer), each
    its own runs and its own decision."""
    lists = {}
    for name in config.STEP_LISTS:
        text, known = str(getattr(cfg, name)), getattr(config, f"{name.upper()}_MODES")
        values = [v.strip() for v in text.split(",") if v.strip()]
        for value in values:
            if value not in known:
                raise InputError(f"{config.flag(name)} '{value}' is not one of {', '.join(known)}")
        if not values or len(set(values)) != len(values):
            raise InputError(f"{config.flag(name)} {text!r}: list each of {', '.join(known)} once, e.g. off,on")
        lists[name] = values
    return [dict(zip(lists, combo, strict=True)) for combo in itertools.product(*lists.values())]


def step_suffix(step: dict[str, str], steps: list[dict[str, str]]) -> str:
    """The part of a run's name that says its step, for the options that vary over `steps` ('' when none does)."""
    varied = [k for k in step if len({s[k] for s in steps}) > 1]
    return "".join(f"-{STEP_WORDS[k].get(step[k], step[k])}" for k in varied)


def one_process(cfg: RunConfig, nproc: int) -> RunConfig:
    """The options of a one-process backend in a compare of `nproc` ranks: the same global batch."""
    assert cfg.batch_size is not None
    return dataclasses.replace(cfg, batch_size=cfg.batch_size * nproc)


@dataclass
class Job:
    """One variant at one world size: what each of its repeats runs."""

    variant: Variant
    nproc: int
    """The compare's world size this job stands for (a one-process variant still starts one process)."""
    cfg: RunConfig
    """The run options this job's processes get (its per-rank batch already worked out)."""
    knobs: list[str]
    """The variant's own backend options (--bucket-cap-mb 5, …), after the run options."""
    threads: int
    """OMP_NUM_THREADS for its launcher and its ranks' --threads: the same for every variant at one world size."""
    run_prefix: str
    """Its runs are <run_prefix>-r<repeat>."""
    notes: tuple[str, ...] = ()
    """What the user's environment set for it (`environment_rule`), for the start-up lines."""
    hosts: Hosts = dataclasses.field(default_factory=Hosts)
    """Where its ranks run (this machine by default)."""

    @property
    def strategy(self) -> str:
        """Its --val-strategy: part of what a row compares (a strategy's runs are never pooled with another's)."""
        return self.cfg.val_strategy

    @property
    def step_config(self) -> str:
        """The step its runs train, in words (`bf16 compiled, clip 1`): part of what a row compares."""
        return config.step_of(dataclasses.asdict(self.cfg))

    @property
    def ranks(self) -> int:
        return 1 if self.variant.backend in backends.ONE_PROCESS else self.nproc

    def env(self) -> dict[str, str]:
        """What its processes get on top of this process's environment: the same OpenMP setting under every
        launcher at one world size (torchrun alone would force 1), the hosts' interface, and that compare or tune
        said the backends' start-up lines (check_jobs runs before any job)."""
        return {"OMP_NUM_THREADS": str(self.threads), environment.RUN_CHECK_SAID: "1", **self.hosts.env()}

    def meta(self, run_id: str) -> dict[str, object]:
        """run.json's facts of one of its runs whose ranks never started (compare records that run failed)."""
        return {
            "run_id": run_id,
            "backend": self.variant.backend,
            "launcher": self.variant.launcher,
            "launcher_detail": self.variant.controller,
            "world_size": self.ranks,
            "workload": self.cfg.workload,
            "config": dataclasses.asdict(self.cfg),
            "knobs": {"controller": self.variant.controller} if self.variant.controller else {},
        }

    def commands(self, root: Path, run_id: str) -> list[list[str]]:
        """The command lines that start it: one here, or one per host (torchrun across hosts)."""
        return self.hosts.commands(self.variant, self.ranks, self.run_args(root, run_id), self.env())

    def command(self, root: Path, run_id: str) -> list[str]:
        """Its one command line on this machine (`commands` for a job across hosts)."""
        [only] = self.commands(root, run_id)
        return only

    def run_args(self, root: Path, run_id: str) -> list[str]:
        """`run` and its options. --threads and --bind are always given, so that a rank takes them from
        here, never from OMP_NUM_THREADS (which compare sets to the same value) or from its launcher."""
        cfg = dataclasses.replace(self.cfg, threads=self.threads, bind=self.cfg.bind or placement.NONE)
        plain = config.to_argv(dataclasses.replace(cfg, out=RunConfig.out, run_id=None))
        return [
            "run",
            "--backend",
            self.variant.backend,
            *plain,
            *self.knobs,
            "--out",
            str(root),
            "--run-id",
            run_id,
        ]


def environment_rule(
    cfg: RunConfig, threads: int | None, knobs: dict[str, list[str]], env: Mapping[str, str]
) -> tuple[int | None, tuple[str, ...]]:
    """The rule of docs/fairness.md for the user's own environment, before any job starts: the threads the
    jobs get (an exported OMP_NUM_THREADS or MKL_NUM_THREADS when neither --threads nor `threads` is given) and
    the lines that say what the environment set. A backend knob (HOROVOD_FUSION_THRESHOLD, …) is adopted by
    its ranks, which see the same environment; here it is only checked, so that a contradiction is refused in
    one line before anything runs (InputError) rather than by every job."""
    chosen = dataclasses.replace(cfg, threads=threads or cfg.threads)
    chosen, adopted = environment.adopt(chosen, (), env)
    for backend, argv in knobs.items():
        section = backends.options_of(backend)
        parser = argparse.ArgumentParser(add_help=False)
        config.add_arguments(parser, section)
        given = parser.parse_args(argv)
        _, more = environment.adopt(config.from_namespace(section, given), config.given_explicitly(given), env)
        adopted.update(more)
    return chosen.threads, tuple(environment.adoption_notes(adopted, "distbench"))


def jobs_for(
    cfg: RunConfig,
    chosen: list[Variant],
    sizes: list[int],
    global_batch: int | None,
    knobs: dict[str, list[str]],
    threads: int | None = None,
    strategies: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    hosts: Hosts | None = None,
    steps: list[dict[str, str]] | None = None,
) -> list[Job]:
    """One job per world size, variant and validation strategy (`strategies`, cfg's own by default), in the
    order they interleave. Weak scaling (no `global_batch`) keeps cfg's per-rank batch; strong gives each
    world size global_batch ÷ (ranks × accumulate) per rank. A one-process variant gets the whole global
    batch, so it trains on the samples the others do. With several strategies a run's name carries its own
    (`ddp-sampler-r0`). Threads: `threads`, else cfg's --threads, else the user's environment (`env`, this
    process's by default; `environment_rule`), else the cores of a host ÷ its ranks. `hosts`: where the ranks
    run (this machine by default). `steps`: the step options' combinations (parse_steps), each its own jobs, named
    by what varies (`ddp-bf16-compiled`), interleaved with the rest."""
    hosts = hosts or Hosts()
    hosts.check_sizes(sizes)
    batches = per_rank_batches(global_batch, sizes, cfg.accumulate) if global_batch else {}
    strategies = strategies or [cfg.val_strategy]
    threads, notes = environment_rule(cfg, threads, knobs, os.environ if env is None else env)
    jobs = []
    for n in sizes:
        at_n = dataclasses.replace(cfg, batch_size=batches.get(n, cfg.batch_size))
        for v in chosen:
            mine = one_process(at_n, n) if v.backend in backends.ONE_PROCESS else at_n
            prefix = v.slug if len(sizes) == 1 else f"{v.slug}-w{n}"
            for step, strategy in itertools.product(steps or [{}], strategies):
                named = prefix + step_suffix(step, steps or [{}]) + ("" if len(strategies) == 1 else f"-{strategy}")
                job_cfg = dataclasses.replace(mine, val_strategy=strategy, **step)
                own = knobs.get(v.backend, [])
                jobs.append(Job(v, n, job_cfg, own, threads or hosts.threads(n), named, notes, hosts))
    return jobs
