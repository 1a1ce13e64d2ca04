"""The image for real (`make test-docker`): built from this checkout by `make image`'s script, doctor in it,
a compare of the default variants as a user the image does not know (`--network none --user`) into a mounted
directory, and `docker stop` in the middle of one.

The engine: the daemon that answers, or else one started here without a bridge of its own
(`dockerd --bridge=none --iptables=false …`) and stopped at the end. After the module no container of these
tests, no `docker0` and no daemon started here is left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.full_matrix  # an end-to-end rehearsal of minutes: make test-all (and test-docker)
IMAGE = "distbench:cpu"
DOCKERD = ["dockerd", "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false"]
USER = "1234:1234"
SHORT = ["--workload", "mlp", "--steps-per-epoch", "6", "--warmup-steps", "1", "--repeats", "2", "--quiet"]
LONG = ["--workload", "linear", "--epochs", "200", "--warmup-steps", "1", "--compute-baseline-steps", "0"]


def _docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert not check or proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def _has_docker0() -> bool:
    return subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A Docker daemon that answers: the running one, or one started here and stopped after."""
    if os.geteuid() != 0:
        pytest.skip("no Docker engine can be started: dockerd runs as root")
    if not (shutil.which("docker") and shutil.which("dockerd")):
        pytest.skip("no Docker engine installed (as root: docker/install-system-deps.sh docker)")
    started = None
    if not _answers():
        log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
        with log.open("w") as out:
            started = subprocess.Popen(DOCKERD, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _answers():
            assert started.poll() is None, f"dockerd exited {started.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"dockerd did not answer in 60 s: {log.read_text()[-3000:]}"
            time.sleep(0.5)
    try:
        yield
    finally:
        left = _docker("ps", "-aq", "--filter", "label=distbench-test", check=False).stdout.split()
        if left:
            _docker("rm", "-f", *left, check=False)
        if started is not None:
            started.terminate()
            started.wait(timeout=60)
        assert not left, f"containers left by the tests: {left}"
        assert not _has_docker0(), "docker0 exists: a daemon made its default bridge"


@pytest.fixture(scope="module")
def image(engine) -> str:
    build = [str(REPO / "docker" / "build-image.sh"), IMAGE]
    proc = subprocess.run(build, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return IMAGE


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return _docker("run", "--rm", "--label", "distbench-test", *args, timeout=timeout, check=False)


def _owned_by(root: Path, uid: int) -> list[str]:
    """Paths under `root` not owned by `uid`."""
    return [str(p) for p in root.rglob("*") if p.stat().st_uid != uid]


@pytest.mark.timeout(1900)
def test_doctor_in_the_image_finds_horovod_with_pytorch_gloo_and_mpi(image: str) -> None:
    proc = _run("--network", "none", image)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "horovod with: PyTorch yes, Gloo yes, MPI yes" in proc.stdout, proc.stdout


@pytest.mark.timeout(900)
def test_compare_as_an_unknown_user_decides_and_leaves_its_files_to_that_user(image: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 1234, 1234)
    proc = _run(
        "--network", "none", "--user", USER, "-v", f"{out}:/out", image,
        "distbench", "compare", *SHORT, "--out", "/out", "--run-id", "c",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^Decision \(", proc.stdout, re.MULTILINE), proc.stdout[-3000:]
    # Without a network the container's name does not resolve: Horovod's Gloo controller is left out, once.
    assert proc.stderr.count("horovod@gloo left out of the default variants") == 1, proc.stderr[-3000:]
    assert {p.name for p in (out / "c").iterdir() if p.is_dir()} >= {"ddp-torchrun-r0", "horovod-mpi-r0"}
    assert (out / "c" / "comparison.csv").is_file() and (out / "c" / "report" / "report.html").is_file()
    assert not _owned_by(out, 1234)
    assert "deleted with the container" not in proc.stderr  # --out is on a mount
    assert "errno = 1" not in proc.stderr, proc.stderr[-3000:]  # Open MPI's refused single copy, said up front


@pytest.mark.timeout(900)
def test_deepspeed_runs_in_the_image_with_its_op_built_in(image: str, tmp_path: Path) -> None:
    # The runtime stage has no compiler: DeepSpeed's shared-memory op must come built with the image.
    assert _run("--network", "none", image, "sh", "-c", "command -v c++ || command -v g++ || command -v cc").returncode
    doctor = _run("--network", "none", image)
    assert re.search(r"deepspeed\b.*0\.19\.8", doctor.stdout), doctor.stdout
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 1234, 1234)
    proc = _run(
        "--network", "none", "--user", USER, "-v", f"{out}:/out", image,
        "distbench", "compare", "--backends", "ddp,deepspeed", "--zero-stage", "2", *SHORT, "--out", "/out",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "deepspeed: its shared-memory op found built" in proc.stderr, proc.stderr[-3000:]
    assert "train 0.00e+00" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.timeout(900)
def test_out_not_on_a_mount_is_said_once(image: str) -> None:
    run = ["distbench", "run", "--backend", "single", "--workload", "linear", "--epochs", "1", "--quiet"]
    proc = _run("--network", "none", image, *run, "--steps-per-epoch", "2", "--warmup-steps", "1", "--out", "/tmp/r")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("deleted with the container") == 1, proc.stderr


@pytest.mark.timeout(900)
def test_docker_stop_mid_compare_records_the_run_interrupted(image: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    name = f"distbench-stop-{os.getpid()}"
    started = _docker(
        "run", "-d", "--rm", "--label", "distbench-test", "--name", name, "--network", "none", "-v", f"{out}:/out",
        image, "distbench", "compare", "--backends", "ddp", "--repeats", "2", *LONG, "--out", "/out", "--run-id", "c",
    )  # fmt: skip
    assert started.stdout.strip()
    deadline = time.monotonic() + 180
    loss = out / "c" / "ddp-r0" / "loss.csv"
    while not (loss.is_file() and len(loss.read_text().splitlines()) > 1):  # its ranks are training
        assert time.monotonic() < deadline, _docker("logs", name, check=False).stderr[-3000:]
        time.sleep(0.5)
    waiter = subprocess.Popen(["docker", "wait", name], stdout=subprocess.PIPE, text=True)
    _docker("stop", "-t", "30", name, timeout=60)
    code, _ = waiter.communicate(timeout=60)
    assert code.strip() == "130", code
    meta = json.loads((out / "c" / "ddp-r0" / "run.json").read_text())
    assert meta["status"] == "failed" and meta["interrupted"] is True, meta
    deadline = time.monotonic() + 30  # --rm removes it after `docker wait` has seen it exit
    while _docker("ps", "-aq", "--filter", f"name={name}").stdout.strip():
        assert time.monotonic() < deadline, f"container {name} left after docker stop"
        time.sleep(0.2)
