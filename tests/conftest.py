"""Shared helpers: real launchers (torchrun, horovodrun, mpirun) from the test's own environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
CLI = [str(BIN / "python"), "-m", "benchmarks.cli"]


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    # Open MPI refuses root unless told; CI runs as root.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    env.update(extra)
    return env


def torchrun(nproc: int, *extra: str) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", *extra, "-m", "benchmarks.cli"]


def horovodrun(nproc: int, controller: str = "--gloo") -> list[str]:
    return [str(BIN / "horovodrun"), "-np", str(nproc), controller, *CLI]


def mpirun(nproc: int) -> list[str]:
    return ["mpirun", "-np", str(nproc), "--oversubscribe", "--allow-run-as-root", *CLI]


def run_cmd(cmd: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command from the repository root with the launcher environment (plus `env`), capturing output."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=launcher_env(**env))


def run_ok(cmd: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; on failure show its output in the assertion."""
    proc = run_cmd(cmd, timeout, **env)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


def read_run(run_dir: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(run_dir / f"{name}.csv") for name in ("timing", "loss", "summary")}


@pytest.fixture(scope="session")
def horovod_available() -> None:
    try:
        import horovod.torch  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"Horovod is part of the set-up (make setup); it is missing: {exc}")
