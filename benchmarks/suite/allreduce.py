"""`distbench allreduce`: allreduce time and bandwidth by message size, in the manner of nccl-tests / OSU
(with `--collective`, torch's reduce-scatter or all-gather, the collectives FSDP2 uses, instead).

Under a launcher, one implementation (`--impl torch|horovod|mpi4py`) sweeps the sizes and rank 0 writes
`allreduce.csv` and `run.json` into its own run directory (the rank side is `benchmarks.run.collectives`).
`--compare` starts each implementation under its own launcher, like `distbench compare` does for
training runs, then writes one combined CSV and a log-log bandwidth plot.

This module is imported by the parser of every `distbench` process, ranks included, so it imports
neither torch nor the analysis stack (pandas, scipy, matplotlib) at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from benchmarks import config, errors, files, launch
from benchmarks.config import DTYPES, AllreduceConfig, format_size
from benchmarks.errors import EXIT_BAD_INPUT, InputError, bad_input, error
from benchmarks.launch import variants as launch_variants
from benchmarks.suite import compare as training_compare
from benchmarks.suite import host_options, hosts
from benchmarks.suite import jobs as processes

# What each implementation can be started under (launch.accepts' terms). mpi4py needs MPI, which horovodrun
# gives only with --mpi and srun only with an MPI plugin.
LAUNCHERS = {
    "torch": (launch.TORCHRUN, launch.MPIRUN, launch.SRUN, launch.PYTHON),
    "horovod": (launch.HOROVODRUN, launch.MPIRUN, launch.SRUN_MPI, launch.PYTHON),
    "mpi4py": (launch.MPIRUN, launch.HOROVODRUN_MPI, launch.SRUN_MPI, launch.PYTHON),
}
# --compare: implementation → (--impl, launcher); the name is the impl column and the run directory.
VARIANTS = {
    "torch": ("torch", launch.TORCHRUN),
    "horovod-gloo": ("horovod", "horovodrun --gloo"),
    "horovod-mpi": ("horovod", "horovodrun --mpi"),
    "mpi4py": ("mpi4py", launch.MPIRUN),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """allreduce's options (parsed by every rank: nothing here imports torch)."""
    parser.description = (
        "Time an in-place SUM allreduce per message size (nccl-tests' algbw and busbw) under the launcher that "
        "started this process, checking every reduced value; or, with --compare, every implementation under "
        "its own launcher. A default sweep (4 B to 256 MiB) takes under a minute per implementation on "
        "2 ranks of 2 cores."
    )
    add = parser.add_argument
    add(
        "--compare",
        action="store_true",
        help="run each of --impls under its own launcher, then write a combined CSV, a table and a log-log plot",
    )
    add(
        "--impls",
        default=None,
        help=f"--compare: which, in order (default: {','.join(VARIANTS)} with --collective allreduce, torch "
        "with the others: torch under torchrun, horovod-gloo under horovodrun --gloo, horovod-mpi under "
        "horovodrun --mpi, mpi4py under mpirun)",
    )
    add("--nproc", type=int, default=2, help="--compare: ranks per implementation (default: 2; across hosts: all)")
    config.add_arguments(parser, AllreduceConfig)
    host_options.add_arguments(parser)


def validate(opts: AllreduceConfig) -> None:
    """Refuse bad input that needs neither torch nor a process group."""
    width = DTYPES[opts.dtype]
    odd = [s for s in opts.sizes if s % width]
    if odd:
        raise InputError(
            f"--sizes {odd[0]} is not a whole number of {opts.dtype} elements ({width} bytes each); "
            f"use multiples of {width}"
        )
    for name in ("iters", "threads"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            raise InputError(f"--{name} must be a positive integer, got {value}")
    if opts.warmup is not None and opts.warmup < 0:
        raise InputError(f"--warmup must be >= 0, got {opts.warmup}")
    if opts.warmup == 0 and opts.iters is None:
        raise InputError("--warmup 0 leaves nothing to size the timed loop by; give --iters too, or --warmup >= 1")
    if not opts.timeout > 0:
        raise InputError(f"--timeout must be a positive number of seconds, got {opts.timeout}")
    if opts.impl == "mpi4py" and opts.device == "cuda":
        raise InputError("--impl mpi4py measures host buffers only; use --device cpu")
    if opts.collective != "allreduce" and opts.impl not in (None, "torch"):
        raise InputError(
            f"--collective {opts.collective} is measured with torch.distributed only; use --impl torch "
            "(--impls torch with --compare), or --collective allreduce"
        )


def check_launcher(impl: str, info: launch.LaunchInfo) -> None:
    """An implementation started under a launcher that cannot give it what it needs is bad input."""
    if launch.accepts(LAUNCHERS[impl], info):
        return
    if info.launcher == launch.SRUN:
        raise InputError(f"--impl {impl} needs MPI under srun, and this srun has none; use {launch.SRUN_MPI_HINT}")
    where = info.launcher + (f" --{info.detail}" if info.launcher == launch.HOROVODRUN else "")
    fits = {
        "torch": "torchrun, mpirun, srun or python",
        "mpi4py": "mpirun, horovodrun --mpi, srun --mpi=pmix or python",
        "horovod": "horovodrun --gloo, horovodrun --mpi, mpirun, srun --mpi=pmix or python",
    }[impl]
    raise InputError(f"--impl {impl} cannot run under {where}; launch it with {fits}")


def command(args: argparse.Namespace) -> int:
    """`distbench allreduce`: one implementation under this launcher, or `--compare`."""
    from benchmarks.run import collectives  # torch only once a sweep runs

    if args.compare:
        try:
            names = _compare_names(args)
            opts = config.from_namespace(
                AllreduceConfig, argparse.Namespace(**{**vars(args), "impl": VARIANTS[names[0]][0]})
            )
            for name in names:
                validate(dataclasses.replace(opts, impl=VARIANTS[name][0]))
            with host_options.emulated(args) as made:
                where = host_options.from_args(args, made)
                where.check_sizes([args.nproc])
                where.check()
                root = training_compare.make_compare_dir(Path(opts.out), opts.run_id or collectives.new_id("compare"))
                return run_compare(names, opts, args.nproc, root, where)
        except InputError as exc:
            error(str(exc))
            return EXIT_BAD_INPUT

    info = launch.detect()
    try:
        host_options.refuse_outside_compare(args)
        if args.impl is None:
            raise InputError("--impl is required (torch, horovod or mpi4py), or give --compare")
        opts = config.from_namespace(AllreduceConfig, args)
        validate(opts)
        check_launcher(opts.impl, info)
        if opts.run_id and not opts.overwrite and (Path(opts.out) / opts.run_id).exists():
            raise InputError(
                f"run directory {Path(opts.out) / opts.run_id} already exists; "
                "choose another --run-id or pass --overwrite"
            )
    except InputError as exc:
        return bad_input(info.rank, exc)

    try:
        code = collectives.run(opts, info)
    except InputError as exc:
        return bad_input(info.rank, exc)
    if "mpi4py.MPI" in sys.modules and code != EXIT_BAD_INPUT:
        from benchmarks.launch import rendezvous

        # Every rank is here (a wrong result is agreed on by all of them), so MPI_Finalize waits for no one.
        rendezvous.exit_process(code)
    return code


def _compare_names(args: argparse.Namespace) -> list[str]:
    alias = {"torch-gloo": "torch", "torch-nccl": "torch"}  # the impl column's names for torch
    impls = args.impls or (",".join(VARIANTS) if args.collective == "allreduce" else "torch")
    names = list(dict.fromkeys(alias.get(n.strip(), n.strip()) for n in impls.split(",") if n.strip()))
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise InputError(f"--impls takes a comma-separated list of {', '.join(VARIANTS)}; got '{impls}'")
    if args.nproc < 1:
        raise InputError(f"--nproc must be a positive integer, got {args.nproc}")
    if args.impl is not None:
        raise InputError("--impl is for one implementation under a launcher; with --compare use --impls")
    return names


def impl_column(name: str, device: str) -> str:
    """The `impl` value (and run directory) a --compare variant records: torch says its process-group backend."""
    return f"torch-{'nccl' if device == 'cuda' else 'gloo'}" if name == "torch" else name


def variant_of(name: str) -> launch_variants.Variant:
    """A --compare implementation as the variant its launcher starts."""
    launcher, _, controller = VARIANTS[name][1].partition(" --")
    return launch_variants.Variant(name, VARIANTS[name][0], launcher, controller)


def rank_argv(opts: AllreduceConfig) -> list[str]:
    """The options every variant's ranks get (the same sweep for each)."""
    sizes = ",".join(map(str, opts.sizes))
    argv = ["--sizes", sizes, "--dtype", opts.dtype, "--device", opts.device, "--timeout", str(opts.timeout)]
    argv += ["--collective", opts.collective]
    for name in ("iters", "warmup", "threads"):
        if getattr(opts, name) is not None:
            argv += [f"--{name}", str(getattr(opts, name))]
    return argv + ["--quiet"] * opts.quiet + ["--inject-wrong-result"] * opts.inject_wrong_result


def run_compare(
    names: list[str], opts: AllreduceConfig, nproc: int, root: Path, where: hosts.Hosts | None = None
) -> int:
    """Each variant under its launcher into `root` (on `where`'s hosts: this machine by default), then the
    combined CSV, plot and table; 0 if all passed, 130 when a signal stopped it."""
    started = time.perf_counter()
    where = where or hosts.Hosts()
    threads = opts.threads or where.threads(nproc)
    opts = dataclasses.replace(opts, threads=threads)
    extra = {"OMP_NUM_THREADS": str(threads), **where.env()}  # the same OpenMP setting under every launcher
    env = {**os.environ, **extra}
    if os.geteuid() == 0:  # Open MPI refuses root unless told; horovodrun --mpi passes its own flag
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    plan = ", ".join(f"{impl_column(n, opts.device)} ({VARIANTS[n][1]})" for n in names)
    span = f"{len(opts.sizes)} sizes {format_size(opts.sizes[0])}–{format_size(opts.sizes[-1])}"
    print(
        f"distbench allreduce --compare: {opts.collective} of {plan}; {nproc} ranks, {opts.dtype}, {span}, "
        f"OMP_NUM_THREADS={threads}" + (f"; across {where.words()}" if where.many else ""),
        file=sys.stderr,
        flush=True,
    )
    with processes.Supervisor(root) as supervisor:
        failed, interrupted = run_variants(names, opts, nproc, root, env, supervisor, where, extra)
        from benchmarks.analysis import collectives  # pandas: only once the jobs are done

        try:
            section = collectives.write_compare_outputs(root, [impl_column(n, opts.device) for n in names])
            print(section.text)
        except FileNotFoundError:  # nothing completed: nothing to tabulate or plot
            print("[allreduce] no combined results: no implementation completed a size", file=sys.stderr)
        if interrupted:
            mark_interrupted_row(root, interrupted)
        if failed:
            print(f"distbench: error: failed: {', '.join(failed)} (see their run.json under {root})", file=sys.stderr)
        print(f"time: {time.perf_counter() - started:.1f} s wall for {len(names)} implementations")
        print(root)
        if supervisor.interrupted:
            print(supervisor.closing_line(), file=sys.stderr)
            return errors.EXIT_INTERRUPTED
    return 1 if failed else 0


def run_variants(
    names: list[str],
    opts: AllreduceConfig,
    nproc: int,
    root: Path,
    env: dict[str, str],
    supervisor: processes.Supervisor,
    where: hosts.Hosts,
    extra: dict[str, str],
) -> tuple[list[str], str | None]:
    """Each variant's job in turn until a signal stops one; the failed run ids, and the interrupted one."""
    from benchmarks.run import recorder

    failed = []
    for i, name in enumerate(names, 1):
        if supervisor.interrupted:
            break
        run_id = impl_column(name, opts.device)
        args = ["allreduce", "--impl", VARIANTS[name][0], *rank_argv(opts), "--out", str(root), "--run-id", run_id]
        cmds = where.commands(variant_of(name), nproc, args, extra)
        shown = " ".join(cmds[0]) if not where.many else f"{where.launch_words(variant_of(name), nproc)} …"
        print(f"[allreduce {i}/{len(names)}] {run_id}: {shown}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            code = supervisor.run_all(cmds, env, root / f"{run_id}.interrupted.log")
        except FileNotFoundError as exc:
            print(f"[allreduce] cannot start {run_id}: {exc}", file=sys.stderr)
            code = 127
        if supervisor.interrupted and processes.record_interrupted(
            root / run_id, supervisor.signal_name, "distbench allreduce --compare"
        ):
            print(f"[allreduce] {run_id}: interrupted", file=sys.stderr, flush=True)
            return failed, run_id
        if supervisor.interrupted:  # the signal came as it ended: the exit code is the signal's, the sweep whole
            code = 0
        recorder.mark_abandoned(root / run_id, f"the job exited {code} before the sweep completed")
        lost = where.diagnose() if code and where.many else None
        outcome = (f"FAILED (exit {code})" + (f": {lost}" if lost else "")) if code else "ok"
        print(f"[allreduce] {run_id}: {outcome} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        if code:
            failed.append(run_id)
    return failed, None


def mark_interrupted_row(root: Path, run_id: str) -> None:
    """allreduce-comparison.csv: the interrupted run's sizes marked `interrupted`, or one row saying so when
    it recorded none."""
    import pandas as pd

    from benchmarks.analysis import collectives
    from benchmarks.run import collectives as rank_side

    path = root / collectives.COMPARISON_CSV
    frame = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=[*rank_side.COLUMNS, "run_key", "status"])
    mine = frame["run_id"] == run_id
    if mine.any():
        frame.loc[mine, "status"] = "interrupted"
    else:
        row = {"run_id": run_id, "impl": run_id, "run_key": str(root / run_id), "status": "interrupted"}
        frame = pd.concat([frame, pd.DataFrame([row])], ignore_index=True)
    files.write_csv(frame, path, index=False)
