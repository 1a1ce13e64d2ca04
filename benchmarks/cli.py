"""`distbench` command line: run, compare, report, check, allreduce, project, cluster, doctor.

distbench doctor                                   what this machine can run
torchrun --standalone --nproc-per-node 2 -m benchmarks.cli run --backend ddp --workload mlp
horovodrun -np 2 --gloo python -m benchmarks.cli run --backend horovod --workload mlp
distbench compare                                  the default DDP-vs-Horovod comparison
distbench report results/runs/<compare-id>         tables, plots, report.md/html
distbench check results/runs/*                     validate result files against the contract
distbench allreduce --compare                      allreduce time and bandwidth by message size, per implementation
distbench cluster up --hosts 2 --link 1gbit        emulated hosts on this machine (root); compare --cluster dbc
distbench project results/runs/<compare-id> --ranks 8,64,512 --link 25gbit   step time projected to N ranks (a model)
"""

from __future__ import annotations

import argparse
import datetime
import glob
import io
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import backends
from benchmarks import config, environment, files
from benchmarks.config import RunConfig
from benchmarks.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, InputError, bad_input, error


def add_run_options(parser: argparse.ArgumentParser) -> None:
    for section in config.SECTIONS:
        config.add_arguments(parser, section)


def _cmd_run(args: argparse.Namespace) -> int:
    from benchmarks import launch
    from benchmarks.run import workloads
    from benchmarks.run.validate import validate

    info = launch.detect()
    cfg = workloads.resolve(config.from_namespace(RunConfig, args))
    try:
        validate(args.backend, cfg)
    except InputError as exc:
        return bad_input(info.rank, exc)

    from benchmarks.run import harness  # imports torch: only past the checks that need none
    from benchmarks.run import recorder as results

    notes = [
        f"distbench: warning: {flag} cannot affect backend '{args.backend}' (another backend's option); "
        "recorded in run.json only"
        for flag in config.inert_options(args, backends.options_of(args.backend))
    ]
    if info.launcher == launch.PYTHON and args.backend not in backends.ONE_PROCESS:
        notes.append("no launcher detected: 1 rank; use torchrun/mpirun/horovodrun for more")
    try:
        options = config.from_namespace(backends.options_of(args.backend), args)
        config.check_values(options)
        run_dir = harness.run(
            args.backend, cfg, options, config.all_options(args), notes, config.given_explicitly(args)
        )
    except (InputError, launch.WrongLauncherError) as exc:
        return bad_input(info.rank, exc)
    except results.ResultsWriteError as exc:
        if info.rank == 0:
            error(exc.strerror)
        return 1
    except harness.RunFailed as exc:
        return exc.exit_code  # rank 0 has said it in one line; run.json holds it
    if run_dir is not None:
        print(run_dir)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from benchmarks.suite import compare

    return compare.command(args)


def _cmd_tune(args: argparse.Namespace) -> int:
    from benchmarks.suite import tune

    return tune.command(args)


def path_problem(paths: Sequence[str]) -> str | None:
    """What is wrong with a path given to report or check that cannot hold runs: missing, or a file."""
    for text in paths:
        if any(c in text for c in "*?["):
            if not glob.glob(text):
                return f"{text} matches nothing; give run directories or compare directories (results/runs/<id>)"
            continue
        path = Path(text)
        if not path.exists():
            return f"{text} does not exist; give a run directory or a compare directory (results/runs/<id>)"
        if not path.is_dir():
            return f"{text} is a file, not a directory; give the run or compare directory that holds it ({path.parent})"
    return None


def _cmd_report(args: argparse.Namespace) -> int:
    from benchmarks.analysis import load, report

    if problem := path_problem(args.paths):
        error(problem)
        return EXIT_BAD_INPUT
    formats = {f.strip() for f in args.format.split(",") if f.strip()}
    if not formats <= {"md", "html"}:
        print(f"distbench: error: --format takes md and/or html, not {args.format!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out = Path(args.out) if args.out else default_report_dir(args.paths)
    blocker = next((p for p in (out, *out.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        error(f"--out {out} is not a directory ({blocker} is a file); choose a directory for the report")
        return EXIT_BAD_INPUT
    try:
        print(report.write(args.paths, out, formats, include_failed=args.include_failed))
    except (FileNotFoundError, load.SchemaError) as exc:
        error(str(exc))
        return EXIT_BAD_INPUT
    except OSError as exc:
        if files.is_no_space(exc):
            raise  # not the --out's fault: main says it, exit 1
        error(f"cannot write the report to {out}: {exc.strerror or exc}; choose another --out")
        return EXIT_BAD_INPUT
    print(out)
    return 0


def default_report_dir(paths: Sequence[str]) -> Path:
    """<dir>/report for one directory, otherwise a fresh results/reports/<time>."""
    if len(paths) == 1 and Path(paths[0]).is_dir():
        return Path(paths[0]) / "report"
    return Path("results/reports") / datetime.datetime.now().strftime("%Y%m%dT%H%M%S")


def _cmd_check(args: argparse.Namespace) -> int:
    from benchmarks.analysis import check, load

    if problem := path_problem(args.paths):
        error(problem)
        return EXIT_BAD_INPUT
    dirs = load.find_run_dirs(*args.paths)
    if not dirs:
        print(f"distbench: error: no run directories (with run.json) under {' '.join(args.paths)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bad = 0
    for run_dir in dirs:
        problems = check.check_run(run_dir)
        bad += bool(problems)
        for problem in problems:
            print(problem)
        if not problems:
            print(f"ok: {run_dir}")
    print(f"{len(dirs) - bad} of {len(dirs)} runs pass")
    return 1 if bad else 0


def parse_ranks(text: str) -> list[int]:
    """--ranks '8,64,512' → [8, 64, 512]: each a whole number of 1 or more."""
    try:
        ranks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 1:
        raise InputError(f"--ranks takes world sizes of 1 or more separated by commas, such as 8,64,512; got {text!r}")
    return ranks


def _cmd_project(args: argparse.Namespace) -> int:
    from benchmarks.analysis import costmodel, load, project, projection_view
    from benchmarks.launch import network

    try:
        if problem := path_problem([args.path]):
            raise InputError(problem)
        ranks = parse_ranks(args.ranks)
        if (args.link is None) == (args.allreduce is None):
            raise InputError(
                "give the cost of communication: --allreduce DIR (a `distbench allreduce --compare` directory made "
                "where the compare ran) or --link RATE [--latency T] (a network you do not have), "
                + ("not both" if args.link is not None else "one of the two")
            )
        if args.link is not None:
            rate = network.parse_rate(args.link)
            if rate is None:
                raise InputError("--link needs a rate here (an unlimited link costs nothing); e.g. --link 25gbit")
            latency = network.parse_latency(args.latency)
            costs = project.Costs(link=costmodel.link(rate, latency, f"link {args.link}, latency {args.latency}"))
        else:
            if problem := path_problem([args.allreduce]):
                raise InputError(
                    problem.replace("a run directory or a compare directory", "a distbench allreduce directory")
                )
            costs = project.Costs(fitted=project.fits_from(Path(args.allreduce)))
        document, table = project.make(Path(args.path), ranks, costs)
    except (InputError, FileNotFoundError, load.SchemaError, ValueError) as exc:
        error(str(exc))
        return EXIT_BAD_INPUT
    out = Path(args.out) if args.out else Path(args.path) / "projection"
    projection_view.write(out, document, table)
    print("\n".join(projection_view.words(document)))
    print(out)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from benchmarks import environment

    return environment.doctor()


def no_space_line(args: argparse.Namespace, exc: OSError) -> str:
    """A write the disk refused, in one line: the file, what is kept, and how to finish the job afterwards."""
    cause = exc.strerror or "no space left on device"
    path = Path(exc.filename) if exc.filename else None
    said = f"{cause[:1].lower()}{cause[1:]} writing {path or 'the results'}"
    if args.command == "report":
        again = ["distbench", "report", *args.paths, *(["--out", args.out] if args.out else [])]
        return f"{said}; the runs under {' '.join(args.paths)} are unchanged; free space and run `{shlex.join(again)}`"
    out = Path(getattr(args, "out", None) or ".")
    root = next((p for p in (path.parents if path else ()) if p.parent.resolve() == out.resolve()), None)
    if args.command == "run" or (args.command == "allreduce" and not args.compare) or root is None:
        return f"{said}; the rows written before it are whole; free space and run it again"
    from benchmarks.analysis import check, load

    # Counted, not assumed: the disk may have filled during a run as well as after the last one.
    runs = load.find_run_dirs(root)
    completed = sum((check.meta_problems(d)[0] or {}).get("status") == "completed" for d in runs)
    passing = sum(not check.check_run(d) for d in runs)
    target = root / "final" if args.command == "tune" and load.find_run_dirs(root / "final") else root
    return (
        f"{said}; kept: the {len(runs)} runs under {root} ({completed} completed, {passing} pass `distbench "
        f"check`); free space and run `distbench report {target}`"
    )


class _Version(argparse.Action):
    """`distbench --version`, worked out only when asked (every rank parses the command line)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"distbench {environment.distbench_version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (an unknown option, a value of the wrong type) said as all bad input is: one line
    naming the fix, exit 2, by rank 0 alone under a launcher; not the whole usage once a rank."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("distbench").strip()
        said = InputError(f"{command + ': ' if command else ''}{message}; see {self.prog} --help")
        from benchmarks import launch  # the rank, from the launcher's variables (no torch)

        sys.exit(bad_input(launch.detect_or_plain().rank, said))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="distbench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print distbench's version (and git commit) and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one benchmark inside the current launcher")
    run.add_argument("--backend", required=True, help=f"one of {', '.join(backends.NAMES)}")
    add_run_options(run)
    run.set_defaults(func=_cmd_run)

    cmp = sub.add_parser(
        "compare",
        help="run the same workload over several backends and compare them",
    )
    add_run_options(cmp)
    from benchmarks.suite import compare  # light: neither torch nor the analysis stack

    compare.add_arguments(cmp)
    cmp.set_defaults(func=_cmd_compare)

    tune = sub.add_parser("tune", help="sweep each variant's communication knobs, then compare each at its best")
    add_run_options(tune)
    from benchmarks.suite import tune as tuning  # light: neither torch nor the analysis stack

    tuning.add_arguments(tune)
    tune.set_defaults(func=_cmd_tune)

    rep = sub.add_parser("report", help="tables, plots and report.md/report.html for runs or comparisons")
    rep.add_argument("paths", nargs="+", help="run directories, compare directories or globs")
    rep.add_argument("--out", help="output directory (default: <PATH>/report for one directory)")
    rep.add_argument("--format", default="md,html", help="md, html or md,html (default)")
    rep.add_argument("--include-failed", action="store_true", help="also load runs whose status is not completed")
    rep.set_defaults(func=_cmd_report)

    chk = sub.add_parser("check", help="validate run directories against the CSV contract")
    chk.add_argument("paths", nargs="+", help="run directories, compare directories or globs")
    chk.set_defaults(func=_cmd_check)

    ar = sub.add_parser("allreduce", help="allreduce micro-benchmark: torch.distributed, Horovod and MPI by size")
    from benchmarks.suite import allreduce  # light: neither torch nor the analysis stack

    allreduce.add_arguments(ar)
    ar.set_defaults(func=allreduce.command)

    emulate = sub.add_parser("cluster", help="emulated hosts on this machine: up, status, down, exec")
    from benchmarks.suite import cluster  # light: neither torch nor the analysis stack

    cluster.add_arguments(emulate)
    emulate.set_defaults(func=cluster.command)

    proj = sub.add_parser(
        "project", help="project each variant's step time to N ranks from a compare's measurements (a model)"
    )
    proj.add_argument("path", help="a compare directory (results/runs/<id>) whose runs have a compute baseline")
    proj.add_argument("--ranks", default="8,64,512", help="world sizes to project to (default: 8,64,512)")
    proj.add_argument(
        "--allreduce", help="a `distbench allreduce --compare` directory: costs fitted per implementation"
    )
    proj.add_argument("--link", help="instead: a link's rate (25gbit, 100mbit, …), every collective at its cost")
    proj.add_argument("--latency", default="5us", help="with --link: one ring step's latency (default: 5us)")
    proj.add_argument("--out", help="output directory (default: <PATH>/projection)")
    proj.set_defaults(func=_cmd_project)

    doctor = sub.add_parser("doctor", help="print versions and what Horovod was built with")
    doctor.set_defaults(func=_cmd_doctor)
    return parser


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub-)command `args` chose: `distbench cluster up`'s, not `distbench`'s."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or getattr(args, sub.dest, None) not in sub.choices:
            return parser
        parser = sub.choices[getattr(args, sub.dest)]


def whole_lines() -> None:
    """stderr a line at a time. Python writes it through, so print()'s text and newline reach a pipe as two
    writes, and Open MPI's --tag-output (horovodrun --mpi) tags each: "...step/s[1,0]<stderr>:"."""
    if isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr.reconfigure(write_through=False, line_buffering=True)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # a process of its own (not called in-process by a test or a notebook)
        whole_lines()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser, whose --help lists what it takes
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if (out := getattr(args, "out", None)) and (said := environment.out_outside_mounts(str(out))):
        print(f"distbench: warning: {said}", file=sys.stderr, flush=True)
        os.environ[environment.OUT_SAID] = "1"  # once: not again from the processes this one starts
    try:
        code = args.func(args)
    except KeyboardInterrupt:  # before a command's own handling is in place (imports, checks): nothing ran
        print("distbench: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except OSError as exc:
        if not files.is_no_space(exc):
            raise
        error(no_space_line(args, exc))
        return 1
    # Only a completed run: after a failure the peers may be gone or waiting out errors.RANK0_GRACE_S, and
    # MPI_Finalize would wait for them.
    if args.command == "run" and code == 0 and argv is None:
        from benchmarks.launch import rendezvous

        rendezvous.exit_process(code)  # the process is ending anyway (argv None: not called in-process)
    return code


if __name__ == "__main__":
    sys.exit(main())
