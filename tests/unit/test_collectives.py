"""`distbench allreduce` in-process: the bandwidth formulas, size parsing, the check, bad input, the analysis."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import config, launch
from benchmarks.analysis import check
from benchmarks.analysis import collectives as analysis
from benchmarks.cli import EXIT_BAD_INPUT, main
from benchmarks.errors import InputError
from benchmarks.run import collective_impls as impls
from benchmarks.run import collectives as rank_side
from benchmarks.suite import allreduce

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@pytest.mark.parametrize(
    ("size", "seconds", "world", "algbw", "busbw"),
    [
        # 1 MiB in 1 ms: S/t = 1 048 576 B / 0.001 s = 1.048576e9 B/s.
        (MiB, 1e-3, 2, 1.048576, 1.048576),  # 2(n−1)/n = 1
        (MiB, 1e-3, 4, 1.048576, 1.572864),  # × 6/4
        (MiB, 1e-3, 8, 1.048576, 1.835008),  # × 14/8
        (4, 2e-6, 2, 0.002, 0.002),  # 4 B in 2 µs
        (256 * MiB, 0.5, 3, 0.536870912, 0.7158278826666667),  # × 4/3
        (MiB, 1e-3, 1, 1.048576, 0.0),  # one rank moves nothing over a link
    ],
)
def test_bandwidth_formulas_against_hand_computed_values(size, seconds, world, algbw, busbw) -> None:
    assert rank_side.algbw_gbps(size, seconds) == pytest.approx(algbw, rel=1e-12)
    assert rank_side.busbw_gbps(size, seconds, world) == pytest.approx(busbw, rel=1e-12, abs=1e-15)


def test_a_csv_row_takes_the_mean_over_ranks_and_a_wrong_result_claims_nothing() -> None:
    meta = {
        "run_id": "r",
        "impl": "mpi4py",
        "launcher": "mpirun",
        "controller": "none",
        "world_size": 2,
        "device": "cpu",
        "dtype": "float32",
    }
    row = rank_side.size_row(meta, MiB, 2, 10, [1e-3, 3e-3], True, [(5e-4, 1e-4, 0.1), (1e-3, 2e-4, 0.3)])
    assert (row["time_mean_s"], row["time_min_s"], row["time_max_s"]) == (2e-3, 1e-3, 3e-3)
    assert row["algbw_gbps"] == pytest.approx(0.524288) and row["busbw_gbps"] == pytest.approx(0.524288)
    assert row["elements"] == MiB // 4 and set(row) == set(rank_side.COLUMNS)
    assert (row["cpu_mean_s"], row["caller_cpu_mean_s"]) == (pytest.approx(7.5e-4), pytest.approx(1.5e-4))
    assert row["idle_cpu_per_s"] == pytest.approx(0.2)
    wrong = rank_side.size_row(meta, MiB, 2, 10, [1e-3, 3e-3], False, [(5e-4, 1e-4, 0.1), (1e-3, 2e-4, 0.3)])
    assert not {"time_mean_s", "algbw_gbps", "busbw_gbps"} & set(wrong) and wrong["correct"] is False


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("1K,1M,64M", [1024, MiB, 64 * MiB]),
        ("64M, 1K,1k,1024", [1024, 64 * MiB]),
        ("4-64", [4, 8, 16, 32, 64]),
        ("1GiB,256MB,3", [3, 256 * MiB, 1 << 30]),
        ("12-50", [12, 24, 48]),
    ],
)
def test_sizes_parse(text: str, sizes: list[int]) -> None:
    assert config.parse_sizes(text) == sizes


def test_the_default_sweep_is_4_bytes_to_256_mib_in_powers_of_two() -> None:
    sizes = config.parse_sizes(config.DEFAULT_SIZES)
    assert sizes == [4 << k for k in range(27)] and sizes[-1] == 256 * MiB


@pytest.mark.parametrize("text", ["", ",", "abc", "1.5K", "0", "8-4", "-3", "4-", "1T"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--sizes"):
        config.parse_sizes(text)


def test_format_size() -> None:
    assert [config.format_size(s) for s in (4, 1000, 1024, 3 * MiB, 256 * MiB, 1 << 30)] == [
        "4 B",
        "1000 B",
        "1 KiB",
        "3 MiB",
        "256 MiB",
        "1 GiB",
    ]


def test_warm_up_scales_to_the_size_and_the_timed_loop_to_half_a_second() -> None:
    assert [rank_side.warmup_count(s) for s in (4, 4 * MiB, 8 * MiB, 32 * MiB, 64 * MiB, 256 * MiB)] == [
        10,
        10,
        8,
        2,
        1,
        1,
    ]
    assert rank_side.iteration_count(2e-6) == 100_000  # capped
    assert rank_side.iteration_count(1e-3) == 500
    assert rank_side.iteration_count(0.12) == 5  # at least 5
    assert rank_side.iteration_count(0.0) == 100_000


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("elements", [1, 2, 3, 7, 1000])
def test_the_check_accepts_the_exact_sum_and_catches_any_wrong_element(dtype, elements: int) -> None:
    world = 5
    buffers = [np.zeros(elements, dtype) for _ in range(world)]
    for rank, buf in enumerate(buffers):
        impls.fill_pattern(buf, rank)
    total = np.sum(buffers, axis=0, dtype=dtype)
    assert impls.first_wrong(total, world) is None
    assert impls.first_wrong(buffers[0], world) is not None  # an unreduced buffer
    wrong = total.copy()
    wrong[-1] += 1
    index, value, expected = impls.first_wrong(wrong, world)
    assert (index, value, expected) == (elements - 1, float(total[-1]) + 1, float(total[-1]))
    if elements > 3:  # the same values in the wrong places
        assert impls.first_wrong(np.roll(total, 1), world) is not None


def test_float16_sums_stay_exact_at_the_largest_world_it_allows() -> None:
    world = 2048 // impls.PERIOD
    expected = impls.expected_sum(world, np.float16)
    assert expected.astype(np.float64).tolist() == impls.expected_sum(world, np.float64).tolist()


def _options(**changes) -> config.AllreduceConfig:
    return config.AllreduceConfig(**{"impl": "torch", "sizes": [4, 1024], **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sizes": [6], "dtype": "float32"}, "--sizes 6 is not a whole number of float32 elements"),
        ({"sizes": [3], "dtype": "float16"}, "use multiples of 2"),
        ({"iters": 0}, "--iters must be a positive integer"),
        ({"threads": 0}, "--threads must be a positive integer"),
        ({"warmup": -1}, "--warmup must be >= 0"),
        ({"warmup": 0}, "--warmup 0 leaves nothing to size the timed loop by; give --iters too"),
        ({"timeout": 0.0}, "--timeout must be a positive number"),
        ({"impl": "mpi4py", "device": "cuda"}, "--impl mpi4py measures host buffers only"),
    ],
)
def test_bad_options_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        allreduce.validate(_options(**changes))


@pytest.mark.parametrize(
    ("impl", "info", "ok"),
    [
        ("torch", launch.LaunchInfo(launch.TORCHRUN), True),
        ("torch", launch.LaunchInfo(launch.MPIRUN), True),
        ("torch", launch.LaunchInfo(launch.HOROVODRUN, detail="gloo"), False),
        ("horovod", launch.LaunchInfo(launch.HOROVODRUN, detail="gloo"), True),
        ("horovod", launch.LaunchInfo(launch.HOROVODRUN, detail="mpi"), True),
        ("horovod", launch.LaunchInfo(launch.TORCHRUN), False),
        ("mpi4py", launch.LaunchInfo(launch.MPIRUN), True),
        ("mpi4py", launch.LaunchInfo(launch.HOROVODRUN, detail="mpi"), True),
        ("mpi4py", launch.LaunchInfo(launch.HOROVODRUN, detail="gloo"), False),
        ("mpi4py", launch.LaunchInfo(launch.TORCHRUN), False),
    ],
)
def test_an_implementation_under_a_launcher_that_cannot_serve_it_is_bad_input(impl, info, ok: bool) -> None:
    if ok:
        allreduce.check_launcher(impl, info)
    else:
        with pytest.raises(InputError, match=f"--impl {impl} cannot run under {info.launcher}.*; launch it with"):
            allreduce.check_launcher(impl, info)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--impl", "mpi4py", "--sizes", "6"], "--sizes 6 is not a whole number of float32 elements"),
        (["--impl", "torch", "--sizes", "lots"], "--sizes: 'lots' is not a size"),
        (["--sizes", "4"], "--impl is required (torch, horovod or mpi4py), or give --compare"),
        (["--compare", "--impls", "torch,nccl-tests"], "--impls takes a comma-separated list of"),
        (["--compare", "--impl", "torch"], "with --compare use --impls"),
        (["--compare", "--nproc", "0"], "--nproc must be a positive integer"),
        (["--compare", "--sizes", "2-1K"], "--sizes 2 is not a whole number of float32 elements"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["allreduce", *argv, "--out", str(tmp_path / "out")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distbench: error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_an_existing_compare_directory_is_refused(tmp_path, capsys) -> None:
    (tmp_path / "c").mkdir()
    assert main(["allreduce", "--compare", "--out", str(tmp_path), "--run-id", "c"]) == EXIT_BAD_INPUT
    assert "already exists; choose another --run-id" in capsys.readouterr().err


@pytest.mark.processes
def test_the_parser_and_the_analysis_import_only_what_they_need() -> None:
    code = (
        "import sys\n"
        "import benchmarks.cli, benchmarks.suite.allreduce\n"
        "print(sorted(m for m in ('torch', 'pandas', 'scipy', 'matplotlib') if m in sys.modules))\n"
        "import benchmarks.run.collectives\n"
        "print(sorted(m for m in ('torch', 'pandas', 'scipy', 'matplotlib') if m in sys.modules))\n"
        "import benchmarks.analysis.collectives\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.stdout.split("\n")[:3] == ["[]", "[]", "False"], proc.stdout + proc.stderr


def write_run(
    root: Path,
    run_id: str,
    impl: str,
    rows: list[tuple[int, float]],
    status: str = "completed",
    world: int = 2,
    dtype: str = "float32",
) -> Path:
    """A run directory as rank 0 writes it, from (size, mean time) pairs (every rank with that mean)."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    meta = {
        "schema_version": rank_side.SCHEMA_VERSION,
        "kind": rank_side.KIND,
        "run_id": run_id,
        "impl": impl,
        "collective": "allreduce",
        "launcher": "mpirun",
        "controller": "none",
        "world_size": world,
        "device": "cpu",
        "dtype": dtype,
        "sizes": [s for s, _ in rows],
        "status": status,
        "run_dir": str(run_dir),
    }
    rank_side._append(run_dir / rank_side.CSV_NAME, [], header=True)
    for size, seconds in rows:
        rank_side._append(
            run_dir / rank_side.CSV_NAME,
            [rank_side.size_row(meta, size, 1, 5, [seconds] * world, True, [(seconds / 2, seconds / 4, 0.0)] * world)],
        )
    rank_side._write_meta(meta)
    return run_dir


def test_a_written_run_passes_the_check_and_tampering_is_caught(tmp_path) -> None:
    run_dir = write_run(tmp_path, "m", "mpi4py", [(4, 2e-6), (1024, 4e-6), (MiB, 3e-4)])
    assert analysis.find_dirs(tmp_path) == [run_dir]
    assert check.allreduce_problems(run_dir) == []
    csv = run_dir / rank_side.CSV_NAME
    frame = pd.read_csv(csv)
    frame.loc[1, "busbw_gbps"] *= 2
    frame.to_csv(csv, index=False)
    assert any("csv:3: busbw_gbps" in p and "2(n−1)/n" in p for p in check.allreduce_problems(run_dir))
    frame.loc[1, "busbw_gbps"] /= 2
    frame.loc[0, "cpu_mean_s"] = -1.0
    frame.to_csv(csv, index=False)
    assert any("csv:2: cpu_mean_s" in p for p in check.allreduce_problems(run_dir))
    frame.loc[0, "cpu_mean_s"] = 1e-6
    frame.loc[2, "correct"] = False
    frame.to_csv(csv, index=False)
    problems = check.allreduce_problems(run_dir)
    assert any("a wrong result claims a time or bandwidth" in p for p in problems), problems
    frame.loc[2, "correct"] = True
    frame.iloc[:2].to_csv(csv, index=False)
    assert any("sizes are not run.json's" in p for p in check.allreduce_problems(run_dir))
    csv.write_text(csv.read_text().rstrip("\n"))
    assert any("cut off" in p for p in check.allreduce_problems(run_dir))
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "schema_version": 99}))
    assert any("schema_version 99" in p for p in check.allreduce_problems(run_dir))


def test_time_at_size_interpolates_on_log_log_inside_the_measured_range(tmp_path) -> None:
    write_run(tmp_path, "a", "mpi4py", [(1024, 1e-5), (4096, 4e-5), (16384, 1e-4)])
    write_run(tmp_path, "b", "torch-gloo", [(1024, 1e-3), (4096, 1e-3)])
    frame = analysis.load(tmp_path)
    assert analysis.time_at_size(frame, 1024) == {"mpi4py": pytest.approx(1e-5), "torch-gloo": pytest.approx(1e-3)}
    at_2k = analysis.time_at_size(frame, 2048)  # halfway in log size: the geometric mean of the neighbours
    assert at_2k == {"mpi4py": pytest.approx(2e-5), "torch-gloo": pytest.approx(1e-3)}
    assert analysis.time_at_size(frame, 8192) == {"mpi4py": pytest.approx((4e-5 * 1e-4) ** 0.5), "torch-gloo": None}
    assert analysis.time_at_size(frame, 512) == {"mpi4py": None, "torch-gloo": None}
    assert analysis.time_at_size(frame, 0) == {"mpi4py": None, "torch-gloo": None}


def test_report_section_gives_tables_and_a_figure(tmp_path) -> None:
    write_run(tmp_path / "runs", "a", "mpi4py", [(4, 2e-6), (MiB, 3e-4)])
    write_run(tmp_path / "runs", "b", "horovod-gloo", [(4, 1e-3), (MiB, 5e-3)])
    write_run(tmp_path / "runs", "c", "torch-gloo", [(4, 1e-3)], status="failed")
    section = analysis.report_section([tmp_path / "runs"], tmp_path / "out", order=["horovod-gloo", "mpi4py"])
    assert section is not None
    assert list(section.busbw.columns) == ["size", "horovod-gloo", "mpi4py"]
    assert section.busbw["size"].tolist() == ["4 B", "1 MiB"]
    assert section.time_us.loc[1, "mpi4py"] == pytest.approx(300.0)
    assert section.busbw.loc[1, "mpi4py"] == pytest.approx(MiB / 3e-4 / 1e9)
    assert section.runs["impl"].tolist()[:2] == ["horovod-gloo", "mpi4py"]
    assert len(section.notes) == 1 and "failed" in section.notes[0]
    assert [p.name for p in section.figures] == [analysis.FIGURE] and section.figures[0].stat().st_size > 0
    text = section.markdown(tmp_path / "out")
    assert "## Allreduce" in text and f"]({analysis.FIGURE})" in text and "| 1 MiB |" in text
    assert analysis.report_section([tmp_path / "nothing"], tmp_path / "out2") is None


def test_report_and_check_of_a_directory_of_allreduce_runs_alone(tmp_path, capsys) -> None:
    """`distbench report` and `distbench check` take a directory holding only allreduce runs."""
    from benchmarks.cli import main

    write_run(tmp_path / "runs", "a", "mpi4py", [(4, 2e-6), (MiB, 3e-4)])
    write_run(tmp_path / "runs", "b", "torch-gloo", [(4, 1e-3), (MiB, 5e-3)])
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Allreduce: bus bandwidth (GB/s)" in md and f"]({analysis.FIGURE})" in md
    assert (tmp_path / "rep" / "report.html").is_file()
    assert main(["check", str(tmp_path / "runs")]) == 0
    assert "2 of 2 runs pass" in capsys.readouterr().out
