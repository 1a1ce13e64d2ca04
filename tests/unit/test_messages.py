"""Messages that name the fix, and small things a new user meets: the loss-shape hint, report and check on
a path that cannot hold runs, compare's header for a custom workload, a progress bar that says how old its
loss is, run.json versions, and `make notebook`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import environment
from benchmarks.cli import build_parser, main
from benchmarks.errors import InputError
from benchmarks.run.workloads import Workload, checks
from benchmarks.suite import compare, variants

REPO = Path(__file__).resolve().parents[2]


def _workload(loss, outputs: int = 1) -> Workload:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    y = torch.randn(8, outputs, generator=torch.Generator().manual_seed(1))
    return Workload("w", lambda: nn.Linear(4, outputs), (x, y), (x, y), loss)


@pytest.mark.parametrize(
    ("loss", "outputs", "hint"),
    [
        (
            lambda out, y: F.mse_loss(out, y, reduction="none"),
            1,
            "got (2, 1); reduce over the dimensions after the first, e.g. .mean(dim=1)",
        ),
        (lambda out, y: F.mse_loss(out, y, reduction="none").view(2, 3, 2), 6, "e.g. .mean(dim=(1, 2))"),
        (F.mse_loss, 1, "got (); return it unreduced, e.g. F.cross_entropy"),
    ],
    ids=["B-1", "B-3-2", "reduced"],
)
def test_the_loss_shape_hint_fits_the_shape_it_got(loss, outputs: int, hint: str) -> None:
    with pytest.raises(InputError) as caught:
        checks.check_workload(_workload(loss, outputs), "mine:factory")
    assert hint in str(caught.value), caught.value


def test_report_and_check_name_a_missing_path_and_a_file(tmp_path, capsys) -> None:
    missing, a_file = tmp_path / "nope", tmp_path / "run.json"
    a_file.write_text("{}")
    for command in ("report", "check"):
        assert main([command, str(missing)]) == 2
        assert capsys.readouterr().err == (
            f"distbench: error: {missing} does not exist; give a run directory or a "
            "compare directory (results/runs/<id>)\n"
        )
        assert main([command, str(a_file)]) == 2
        said = capsys.readouterr().err
        assert f"{a_file} is a file, not a directory" in said and f"({tmp_path})" in said
        assert main([command, str(tmp_path / "x*")]) == 2
        assert "matches nothing" in capsys.readouterr().err


def test_compare_header_says_a_custom_workload_brings_its_own_sizes() -> None:
    args = build_parser().parse_args(["compare", "--workload", "mymodule:factory", "--backends", "ddp"])
    cfg, preset = compare.effective_config(args)
    jobs = variants.jobs_for(cfg, variants.parse("ddp"), [2], None, {}, None)
    header = compare.describe(cfg, preset, jobs, "3 repeats interleaved")
    assert "--train-size the workload's own, --val-size the workload's own" in header
    assert "None" not in header and "the rest" not in header


@pytest.mark.processes
def test_the_progress_line_says_which_step_its_loss_is_of(tmp_path) -> None:
    """Losses reach rank 0 only at a flush: a loss shown between flushes is an old one, and says so."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.cli",
        "run",
        "--backend",
        "single",
        "--workload",
        "linear",
        "--epochs",
        "1",
        "--flush-every",
        "25",
        "--compute-baseline-steps",
        "0",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if " steps, " in line]
    shown = [re.search(r": (\d+)/\d+ steps.* loss [\d.]+ at step (\d+) \(all ranks\)", line) for line in lines]
    assert any(shown) and all(m or "loss" not in line for m, line in zip(shown, lines, strict=True)), lines
    for match in filter(None, shown):
        done, of_step = int(match.group(1)), int(match.group(2))
        assert of_step <= done and of_step % 25 == 0  # a flushed step, never ahead of the bar


def test_versions_name_transformers_when_a_run_imported_it(monkeypatch) -> None:
    assert "transformers" not in environment.versions() or "transformers" in sys.modules
    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))
    found = environment.versions()
    assert found["transformers"] and found["transformers"][0].isdigit()


def test_versions_name_cuda_and_nccl_on_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    found = environment.versions()
    assert (found["cuda"], found["cudnn"], found["nccl"]) == ("12.4", "90100", "2.21.5")


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_make_notebook_runs_it_from_the_root_and_writes_outside_the_tree(tmp_path) -> None:
    out = tmp_path / "executed.ipynb"
    dry = subprocess.run(["make", "-n", "notebook", f"NOTEBOOK_OUT={out}"], capture_output=True, text=True, cwd=REPO)
    assert f"results/execute_notebook.py {out}" in dry.stdout, dry.stdout + dry.stderr
    before = sorted(p.name for p in (REPO / "results").iterdir())
    proc = subprocess.run(
        [sys.executable, "results/execute_notebook.py", str(out)], capture_output=True, text=True, cwd=REPO, timeout=220
    )
    assert proc.returncode == 0 and proc.stdout.strip() == str(out), proc.stderr[-3000:]
    outputs = "".join(str(o) for cell in json.loads(out.read_text())["cells"] for o in cell.get("outputs", []))
    assert "image/png" in outputs and "samples/s" in outputs and "Traceback" not in outputs
    assert sorted(p.name for p in (REPO / "results").iterdir()) == before  # nothing written into the tree
    assert (tmp_path / "executed-report" / "report.md").is_file()  # its report beside it, not in a fixed place


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_make_notebook_reads_the_runs_it_is_given(tmp_path) -> None:
    from tests.helpers import make_run

    make_run(tmp_path / "mine", "ddp-r0", "ddp", [[1.0, 0.1, 0.1]], 1.0, losses=[1.0, 0.8, 0.6])
    make_run(tmp_path / "mine", "hvd-r0", "horovod", [[1.0, 0.2, 0.2]], 1.0, losses=[1.0, 0.8, 0.6])
    out = tmp_path / "mine.ipynb"
    dry = subprocess.run(
        ["make", "-n", "notebook", f"NOTEBOOK_OUT={out}", f"RUNS={tmp_path / 'mine'}"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert f"results/execute_notebook.py {out} {tmp_path / 'mine'}" in dry.stdout, dry.stdout + dry.stderr
    cmd = [sys.executable, "results/execute_notebook.py", str(out), str(tmp_path / "mine")]
    subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=220)
    outputs = "".join(str(o) for cell in json.loads(out.read_text())["cells"] for o in cell.get("outputs", []))
    assert "ddp-r0" in outputs or "synthetic" in outputs, outputs[:2000]
    assert "2026-12-01-cpu-2core" not in outputs
