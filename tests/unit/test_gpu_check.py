"""`make gpu-bundle` and `make gpu-check` without a GPU: the one line and exit 2, the bundle's contents,
a bundle of another tree refused before anything is installed, the recipe making the edits the bundle
describes, and the hand-written loop the harness is held to."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_GPU = {"torch": "2.11.0+cu130", "cuda": "13.0", "gpus": 1, "names": ["fake"], "capability": [9, 0]}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "docker" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check, gpu_bundle, gpu_raw_loop = load("gpu_check"), load("gpu_bundle"), load("gpu_raw_loop")


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert lines[0].startswith("distbench: error: ")
    return lines[0]


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_without_cuda_it_says_so_in_one_line_and_exits_2_before_installing(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert gpu_check.main(["--bundle", str(tmp_path / "nothing-here"), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert "needs a CUDA GPU" in line and "sees no CUDA device" in line and "make gpu-bundle" in line
    assert not out.exists()


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_make_gpu_check_exits_2_with_that_line() -> None:
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "gpu-check", f"GPU_PYTHON={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 2 and done.stdout == ""
    # make adds its own "*** [gpu-check] Error 2" after the script's line.
    assert done.stderr.splitlines()[0].startswith("distbench: error: gpu-check needs a CUDA GPU")


def test_no_bundle_and_a_bundle_of_another_tree_are_refused(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(gpu_check, "probe_cuda", lambda python: dict(FAKE_GPU))
    out = tmp_path / "out"
    assert gpu_check.main(["--bundle", str(tmp_path), "--out", str(out)]) == 2
    assert "no gpu bundle" in one_error_line(capsys)
    (tmp_path / "horovod-0.28.1.tar.gz").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "distbench-0.1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("benchmarks/cli.py", "an older cli\n")
    assert gpu_check.main(["--bundle", str(tmp_path), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert "holds another tree" in line and "files differ" in line and "make gpu-bundle again" in line
    assert not out.exists()


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_the_bundle_holds_what_the_gpu_machine_lacks(tmp_path) -> None:
    """Built for real (the sdist and wheels come from the cache the recipe shares, else the registry)."""
    dest = tmp_path / "gpu-bundle"
    manifest = gpu_bundle.build(dest)
    names = set(manifest["files"])
    assert json.loads((dest / "bundle.json").read_text())["files"] == manifest["files"]
    assert {"horovod-0.28.1.tar.gz", "horovod-0.28.1-cmake.patch"} <= names
    assert {n.split("/")[1].split("-")[0] for n in names if n.startswith("wheels/")} == set(gpu_bundle.WHEELS)
    (wheel,) = dest.glob("distbench-*-py3-none-any.whl")
    assert manifest["files"][wheel.name]["sha256"] == gpu_bundle.sha256(wheel)
    assert gpu_check.stale_files(wheel) == []  # what gpu-check installs is this tree
    with zipfile.ZipFile(wheel) as archive:
        assert {"benchmarks/run/phases.py", "benchmarks/cli.py", "backends/ddp.py"} <= set(archive.namelist())
    patch = (dest / "horovod-0.28.1-cmake.patch").read_text()
    added = [line[1:].strip() for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ["set(CMAKE_CXX_STANDARD 17)"] * 2 + ["set(CMAKE_CUDA_STANDARD 17)"]
    assert 3 << 20 < manifest["total_bytes"] < 40 << 20  # a few MB: the sdist is 3.4
    assert not list(tmp_path.glob("*.partial"))


def test_the_recipe_makes_the_edits_the_bundle_describes() -> None:
    recipe = (ROOT / "docker" / "install-horovod.sh").read_text()
    for old, new in gpu_bundle.EDITS.values():
        assert f"s/{old}/{new}/" in recipe
    assert "HOROVOD_SDIST" in recipe and "HOROVOD_WITHOUT_MPI" in recipe


def test_the_hand_written_loop_runs_on_cpu_and_says_what_it_timed(capsys) -> None:
    gpu_raw_loop.main(["--workload", "mlp", "--steps", "3", "--warmup", "1", "--device", "cpu"])
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["samples_per_s"] > 0 and said["samples_per_s_sync_each_step"] > 0
    assert said["batch_size"] == 32 and said["steps"] == 3 and said["cuda_max_allocated_mb"] is None
