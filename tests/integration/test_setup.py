"""Foundation: the Horovod recipe is idempotent, doctor reports the build, every --help works."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest

from benchmarks.cli import build_parser
from tests.helpers import BIN, CLI, REPO, cli_here, launcher_env, run_cmd, run_ok


@pytest.mark.timeout(120)
def test_second_horovod_install_uses_cache_and_is_fast() -> None:
    start = time.monotonic()
    proc = run_ok(["bash", str(REPO / "docker/install-horovod.sh"), str(BIN / "python")], timeout=110)
    elapsed = time.monotonic() - start
    assert "already installed" in proc.stderr or "using the cached wheel" in proc.stderr
    assert "lists PyTorch, MPI and Gloo" in proc.stderr  # the recipe's own `horovodrun --check-build`
    assert elapsed < 30, f"a second install took {elapsed:.1f}s"


@pytest.mark.timeout(60)
def test_doctor_reports_versions_and_controllers() -> None:
    proc = run_ok([*CLI, "doctor"])
    out = proc.stdout
    for fact in ("python", "torch", "horovod", "mpi4py", "mpi", "cpus", "cuda"):
        assert f"{fact}:" in out
    assert "0.28.1" in out and "Open MPI" in out
    assert "Gloo yes" in out and "MPI yes" in out and "PyTorch yes" in out
    assert "deepspeed: 0.19.8" in out and "deepspeed on: cpu (" in out
    unset = {k: v for k, v in launcher_env().items() if k != "DS_ACCELERATOR"}  # an in-process test may set it
    said = subprocess.run([*CLI, "doctor"], capture_output=True, text=True, timeout=60, cwd=REPO, env=unset).stdout
    assert "deepspeed on: cpu (DS_ACCELERATOR unset: the run's device)" in said, said
    assert "deepspeed on: cpu (DS_ACCELERATOR=cpu)" in run_ok([*CLI, "doctor"], DS_ACCELERATOR="cpu").stdout


@pytest.mark.timeout(60)
def test_doctor_fails_with_hint_when_horovod_missing(tmp_path) -> None:
    # A horovod package that cannot be imported shadows the real one.
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("raise ImportError('simulated missing horovod')\n")
    proc = run_cmd([*CLI, "doctor"], timeout=60, PYTHONPATH=f"{tmp_path}:{REPO}")
    assert proc.returncode != 0
    assert "make setup" in proc.stderr


SUBCOMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["", *SUBCOMMANDS])
def test_help_works_for_every_subcommand(command: str) -> None:
    # The console script itself once; each subcommand's help in this process (it starts nothing).
    proc = cli_here([command, "--help"]) if command else run_ok([str(BIN / "distbench"), "--help"])
    assert proc.returncode == 0 and "usage: distbench" in proc.stdout


@pytest.mark.timeout(60)
def test_system_deps_as_non_root_print_the_exact_command() -> None:
    """Without mpirun, cmake or g++ on PATH and without root, the set-up stops with the apt-get line."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to become an unprivileged user")
    with tempfile.TemporaryDirectory(dir="/tmp") as bin_dir:  # pytest's tmp_path is private to root
        os.chmod(bin_dir, 0o755)
        os.symlink(shutil.which("id"), os.path.join(bin_dir, "id"))
        cmd = [
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "env",
            f"PATH={bin_dir}",
            "/bin/bash",
            str(REPO / "docker/install-system-deps.sh"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 1
    assert "apt-get update && apt-get install -y openmpi-bin libopenmpi-dev cmake g++" in proc.stderr
