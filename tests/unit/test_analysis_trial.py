"""A new user's trial of `report`: failed runs taken in, launchers never pooled, several workloads,
rounding, the scaling section, and a run whose process died."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.analysis import load, report, tables, terminal
from benchmarks.cli import main
from benchmarks.run import recorder as results
from tests.helpers import make_run

ONE_RANK, TWO_RANKS = [[1.0, 0.1, 0.1]], [[1.0, 0.1, 0.1], [1.0, 0.1, 0.1]]


def failed_run(root: Path, run_id: str, backend: str, error: str = "rank 1 exited with 1") -> Path:
    """A run that failed before it timed a step: run.json and header-only CSVs, no summary."""
    meta = {
        "run_id": run_id,
        "backend": backend,
        "launcher": "torchrun",
        "world_size": 1,
        "workload": "synthetic",
        "global_batch": 10,
        "threads": 1,
    }
    rec = results.Recorder(root / run_id, meta)
    rec.finish("failed", error=error)
    return root / run_id


def test_report_include_failed_when_every_run_failed(tmp_path, capsys) -> None:
    failed_run(tmp_path / "A", "ddp-r0", "ddp", "ddp exploded")
    failed_run(tmp_path / "A", "horovod-r0", "horovod", "horovod exploded")
    summary = report.write([tmp_path / "A"], tmp_path / "out", {"md", "html"}, include_failed=True)
    assert f"FAILED: {tmp_path / 'A' / 'ddp-r0'}/run.json: ddp exploded" in summary
    assert f"FAILED: {tmp_path / 'A' / 'horovod-r0'}/run.json: horovod exploded" in summary
    assert not list((tmp_path / "out").glob("*.png"))  # nothing completed: nothing to plot
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / "report.html").is_file()
    # Without the flag: one line, exit 2, naming each failed run's error.
    assert main(["report", str(tmp_path / "A"), "--out", str(tmp_path / "out2")]) == 2
    lines = [li for li in capsys.readouterr().err.splitlines() if li.startswith("distbench: error")]
    assert len(lines) == 1 and "no usable runs" in lines[0]
    assert "ddp exploded" in lines[0] and "horovod exploded" in lines[0]


def test_report_include_failed_with_failed_and_good_runs(tmp_path) -> None:
    failed_run(tmp_path / "A", "ddp-r0", "ddp", "ddp exploded")
    failed_run(tmp_path / "A", "horovod-r0", "horovod", "horovod exploded")
    make_run(tmp_path / "B", "ddp-r0", "ddp", ONE_RANK, wall=0.2)
    make_run(tmp_path / "B", "horovod-r0", "horovod", ONE_RANK, wall=0.3)
    summary = report.write([tmp_path / "A", tmp_path / "B"], tmp_path / "out", {"md"}, include_failed=True)
    assert "ddp            1/1" in summary and "horovod        1/1" in summary
    assert "ddp exploded" in summary and "horovod exploded" in summary
    assert {p.stem for p in (tmp_path / "out").glob("*.png")} == {"throughput", "step_times", "phases", "loss_curves"}


def test_a_backend_under_two_launchers_gets_a_row_per_launcher(tmp_path) -> None:
    for i in range(3):  # ddp ×6: three under torchrun at ~100/s, three under mpirun at ~50/s
        make_run(tmp_path, f"a-t{i}", "ddp", ONE_RANK, wall=0.2 * (1 + i / 100))
        make_run(tmp_path, f"b-m{i}", "ddp", ONE_RANK, wall=0.4 * (1 + i / 100), meta={"launcher": "mpirun"})
    for i, (launcher, controller) in enumerate([("horovodrun", "gloo"), ("mpirun", "mpi")]):
        meta = {"launcher": launcher, "launcher_detail": controller, "knobs": {"controller": controller}}
        make_run(tmp_path, f"c-h{i}", "horovod", ONE_RANK, wall=0.3, meta=meta)
    per_run = tables.per_run_stats(load.load_runs(tmp_path))
    table = tables.backend_table(per_run).set_index("backend")
    assert table.loc["ddp (torchrun)", "runs_ok"] == 3 and table.loc["ddp (mpirun)", "runs_ok"] == 3
    assert table.loc["ddp (torchrun)", "ci_low"] > 95 and table.loc["ddp (mpirun)", "ci_high"] < 55
    assert set(table.index) == {"ddp (torchrun)", "ddp (mpirun)", "horovod (gloo)", "horovod (mpi)"}
    text = terminal.format_table(table.reset_index(), 0.0)
    assert "ddp (mpirun) is 0.50× ddp (torchrun)" in text
    assert "\nddp (torchrun)     3/0 " in text and "\nhorovod (gloo)     1/0 " in text  # columns stay aligned
    assert set(per_run.launcher) == {"torchrun", "mpirun", "horovodrun"}
    # one launcher: the plain name
    only = tables.backend_table(tables.per_run_stats(load.load_runs(tmp_path / "a-t0", tmp_path / "a-t1")))
    assert list(only.backend) == ["ddp"]


def test_several_workloads_say_which_setup_a_line_is_about(tmp_path) -> None:
    make_run(tmp_path, "a-ddp", "ddp", ONE_RANK, wall=1.0, losses=[1.0, 0.8, 0.6])
    make_run(tmp_path, "a-hvd", "horovod", ONE_RANK, wall=1.0, losses=[1.0, 0.8, 0.7])
    make_run(tmp_path, "b-ddp", "ddp", ONE_RANK, wall=1.0, meta={"workload": "cifar"})
    make_run(tmp_path, "b-hvd", "horovod", ONE_RANK, wall=1.0, meta={"workload": "cifar"})
    rs = load.load_runs(tmp_path)
    agreement = tables.loss_agreement(rs)
    text = terminal.format_table(tables.backend_table(tables.per_run_stats(rs)), agreement)
    lines = text.splitlines()
    compared = "loss, max abs difference between variants (ddp@torchrun, horovod@torchrun;"
    assert f"{compared} synthetic · global batch 10): train 1.00e-01," in text
    assert f"{compared} cifar · global batch 10): train 0.00e+00," in text
    verdicts = [li for li in lines if " from too few runs" in li]
    assert [v.split(":")[0] for v in verdicts] == [
        "synthetic · global batch 10 · 1 rank(s)",
        "cifar · global batch 10 · 1 rank(s)",
    ]
    warnings = [li for li in lines if li.startswith("warning:")]
    assert len(warnings) == 4 and all(w.startswith(("warning: synthetic · ", "warning: cifar · ")) for w in warnings)
    # one setup: the lines stay as they were
    one = terminal.format_table(tables.backend_table(tables.per_run_stats(load.load_runs(tmp_path / "a-ddp"))), 0.0)
    assert "warning: ddp: " in one


def test_seconds_are_printed_with_enough_digits(tmp_path) -> None:
    assert tables.run_warning(100, 1.95) == "timed window 1.95 s (< 2 s)"
    assert tables.run_warning(100, 1.9996) == "timed window 1.9996 s (< 2 s)"
    make_run(tmp_path, "ddp-r0", "ddp", ONE_RANK, wall=0.003, meta={"config": {"train_size": 2048, "lr": 0.1}})
    make_run(tmp_path, "horovod-r0", "horovod", ONE_RANK, wall=0.0042, meta={"config": {"lr": 0.1}})
    report.write([tmp_path], tmp_path / "out", {"md"})
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| --train-size | 2048 | — |" in md and "2048.0" not in md
    compared = md[md.index("## What was compared") : md.index("## Backends")]
    assert "| 0.003, 0.0042 |" in compared  # the timed window per run, not 0.0


def test_scaling_section_only_when_a_backend_spans_world_sizes(tmp_path) -> None:
    make_run(tmp_path, "single-r0", "single", ONE_RANK, wall=0.1)  # 1 rank
    make_run(tmp_path, "ddp-r0", "ddp", TWO_RANKS, wall=0.2)  # 2 ranks: no backend at two world sizes
    rs = load.load_runs(tmp_path)
    assert len(tables.scaling(tables.per_run_stats(rs))) == 0
    report.write([tmp_path], tmp_path / "out", {"md", "html"})
    assert "Scaling" not in (tmp_path / "out" / "report.md").read_text()
    assert "Scaling" not in (tmp_path / "out" / "report.html").read_text()
    assert not (tmp_path / "out" / "scaling.png").exists()
    make_run(tmp_path, "ddp-1", "ddp", ONE_RANK, wall=0.2)
    report.write([tmp_path], tmp_path / "out2", {"md"})
    assert "## Scaling" in (tmp_path / "out2" / "report.md").read_text()
    assert (tmp_path / "out2" / "scaling.png").exists()


def test_a_run_whose_process_died_says_so(tmp_path) -> None:
    make_run(tmp_path, "ddp-r0", "ddp", ONE_RANK, wall=0.2)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    meta = {
        "run_id": "horovod-r0",
        "backend": "horovod",
        "launcher": "torchrun",
        "world_size": 1,
        "workload": "synthetic",
        "global_batch": 10,
        "threads": 1,
        "host": socket.gethostname(),
        "pid": int(gone.stdout),
    }
    results.Recorder(tmp_path / "horovod-r0", meta)  # left `running`, never finished
    assert int(gone.stdout) != os.getpid()
    rs = load.load_runs(tmp_path)
    died = "status running but its process is gone (the job died)"
    assert rs.skipped == [f"{tmp_path / 'horovod-r0'}: {died}"]
    summary = report.write([tmp_path], tmp_path / "out", {"md"})
    assert f"FAILED: {tmp_path / 'horovod-r0'}/run.json: {died}" in summary
    with_flag = report.write([tmp_path], tmp_path / "out2", {"md"}, include_failed=True)
    assert f"FAILED: {tmp_path / 'horovod-r0'}/run.json: {died}" in with_flag


@pytest.mark.parametrize("value, text", [(2048.0, "2048"), (0.1, "0.1"), (None, "—"), ("gloo", "gloo")])
def test_recorded_values_print_as_written(value, text) -> None:
    from benchmarks.analysis import context

    assert context._text(value) == text
