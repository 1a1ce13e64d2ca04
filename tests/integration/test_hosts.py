"""Across hosts: compare over 2 emulated hosts (network namespaces, each its own hostname, cores and /tmp) under
every launcher, over the ssh stand-in from the first host, with a capped link, Ctrl-C, the faults of a
cluster (a host unreachable at start, two names of one address, a link taken down mid-run), and threads
from the CPUs a rank may use. Needs root (namespaces): skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.analysis import check
from benchmarks.suite import cluster as emulation
from tests.helpers import BIN, CLI, REPO, horovodrun, launcher_env, run_cmd, torchrun

DISTBENCH = str(BIN / "distbench")
SHORT = ["--repeats", "1", "--workload", "mlp", "--epochs", "1", "--steps-per-epoch", "20"]
needs_rights = pytest.mark.skipif(
    emulation.missing_rights() is not None, reason=f"no emulated hosts here: {emulation.missing_rights()}"
)
# The tests across emulated hosts run in `make test-all` (marked `full_matrix`, as issue 34 puts the multi-host
# tests there); of the rest, a rank confined to one core runs under torchrun in `make test`, under all three in
# `make test-all`.
across_hosts = pytest.mark.full_matrix


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith("distbench-"))


def _veths() -> int:
    """veth devices in this machine's own namespace (distbench makes its own inside its namespaces only)."""
    return len(
        subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout.splitlines()
    )


def _pids_in(namespaces: list[str]) -> list[str]:
    return [
        p
        for ns in namespaces
        for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    ]


def _runs(root: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in root.glob("*/*/run.json")}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A cluster of 2 hosts for this module, removed at the end: no namespace of it left behind."""
    name = f"t{secrets.token_hex(3)}"
    before = _namespaces()
    up = run_cmd([DISTBENCH, "cluster", "up", "--hosts", "2", "--name", name], timeout=60)
    assert up.returncode == 0, up.stderr
    yield name
    down = run_cmd([DISTBENCH, "cluster", "down", name], timeout=60)
    assert down.returncode == 0, down.stderr
    assert _namespaces() == before


def _link(name: str, host: str, state: str) -> None:
    subprocess.run(["ip", "-n", f"distbench-{name}-{host}", "link", "set", "eth0", state], check=True)


@needs_rights
@across_hosts
@pytest.mark.timeout(300)
def test_compare_runs_across_emulated_hosts_under_every_launcher(cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "out"  # under /tmp, which only the first host sees: rank 0 writes every file
    variants = "ddp@torchrun,ddp@mpirun,horovod@gloo,horovod@mpi"
    done = run_cmd([DISTBENCH, "compare", "--cluster", cluster, "--backends", variants, *SHORT, "--out", str(out)], 240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Decision (" in done.stdout
    assert f"across hosts cluster {cluster}: 2 emulated hosts" in done.stderr
    runs = _runs(out)
    assert len(runs) == 4
    launched = {run: (m["launcher"], m["launcher_detail"]) for run, m in runs.items()}
    assert launched == {
        "ddp-torchrun-r0": ("torchrun", ""),
        "ddp-mpirun-r0": ("mpirun", "mpi"),
        "horovod-gloo-r0": ("horovodrun", "gloo"),
        "horovod-mpi-r0": ("horovodrun", "mpi"),
    }
    for run, meta in runs.items():
        assert meta["status"] == "completed", run
        assert [h["host"] for h in meta["hosts"]] == ["h0", "h1"], run  # rank 0 on the first host
        assert [h["cpus"] for h in meta["hosts"]] == ["0", "1"], run  # each host its own core
        assert {h["iface"] for h in meta["hosts"]} == {"eth0"}, run
        assert meta["network"] == {"hosts": 2, "iface": "eth0", "link": "unlimited", "emulated": True}, run
        assert meta["threads"] == 1 and meta["oversubscribed"] is False, run
        assert check.check_run(next(out.glob(f"*/{run}"))) == [], run
    # The second host has a /tmp of its own: it never saw the results (no shared file system needed).
    seen = run_cmd([DISTBENCH, "cluster", "exec", "h1", "--name", cluster, "--", "test", "-e", str(out)], 30)
    assert seen.returncode == 1


@needs_rights
@across_hosts
@pytest.mark.timeout(400)
def test_a_hostfile_of_uneven_slots_places_ranks_as_horovodrun_and_mpirun_do(cluster: str, tmp_path: Path) -> None:
    """Issue 51: `h0 slots=2` / `h1 slots=1` and --nproc 3, under every launcher: ranks 0-1 on h0, 2 on h1."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("h0 slots=2\nh1 slots=1\n")
    out = tmp_path / "out"
    variants = "ddp@torchrun,ddp@mpirun,horovod@gloo,horovod@mpi"
    cmd = [DISTBENCH, "compare", "--cluster", cluster, "--hostfile", str(hostfile), "--nproc", "3"]
    done = run_cmd([*cmd, "--backends", variants, *SHORT, "--out", str(out)], 360)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "3 ranks on 2 emulated hosts" in done.stderr.split("[compare 1/")[0]  # said before anything ran
    assert "setpgid" not in done.stderr and "]<stderr>:[" not in done.stderr
    runs = _runs(out)
    assert len(runs) == 4
    for run, meta in runs.items():
        assert meta["status"] == "completed", run
        assert meta["world_size"] == 3, run
        assert [h["host"] for h in meta["hosts"]] == ["h0", "h0", "h1"], run
        assert meta["threads"] == 1, run


@needs_rights
@across_hosts
@pytest.mark.timeout(200)
def test_compare_over_ssh_from_the_first_host(cluster: str, tmp_path: Path) -> None:
    """--hosts as on a real cluster: compare started on h0, reaching h1 through `ssh` (the stand-in)."""
    inner = [DISTBENCH, "compare", "--hosts", "h0:1,h1:1", "--backends", "ddp,horovod@gloo", *SHORT]
    cmd = [DISTBENCH, "cluster", "exec", "h0", "--name", cluster, "--", *inner, "--out", str(tmp_path)]
    done = run_cmd(cmd, 180)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = _runs(tmp_path)
    assert set(runs) == {"ddp-r0", "horovod-gloo-r0"}
    for meta in runs.values():
        assert [h["host"] for h in meta["hosts"]] == ["h0", "h1"]
        assert meta["network"]["iface"] == "eth0"  # the route's interface to h1


@needs_rights
@across_hosts
@pytest.mark.timeout(200)
def test_emulate_hosts_makes_a_capped_cluster_for_the_compare_and_removes_it(tmp_path: Path) -> None:
    before, veths = _namespaces(), _veths()
    cmd = [DISTBENCH, "compare", "--emulate-hosts", "2", "--link", "1gbit", "--backends", "ddp,horovod@gloo", *SHORT]
    done = run_cmd([*cmd, "--out", str(tmp_path)], 180)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Decision (" in done.stdout
    assert {m["network"]["link"] for m in _runs(tmp_path).values()} == {"1gbit"}
    assert _namespaces() == before and _veths() == veths


@needs_rights
@across_hosts
@pytest.mark.timeout(200)
def test_ctrl_c_stops_every_rank_on_every_host_and_leaves_no_namespace(tmp_path: Path) -> None:
    before = _namespaces()
    tiny = ["--workload", "linear", "--epochs", "40", "--warmup-steps", "1", "--repeats", "2", "--quiet"]
    cmd = [
        DISTBENCH,
        "compare",
        "--emulate-hosts",
        "2",
        "--backends",
        "ddp,horovod@gloo",
        *tiny,
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("*/ddp-r0/run.json")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first run never started"
        time.sleep(0.1)
    made = [ns for ns in _namespaces() if ns not in before]
    assert len(made) == 3  # two hosts and the switch
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert _pids_in(made) == []
    assert _namespaces() == before
    meta = json.loads(next(tmp_path.glob("*/ddp-r0/run.json")).read_text())
    assert meta["status"] == "failed" and meta["interrupted"] is True


@needs_rights
@across_hosts
@pytest.mark.timeout(120)
def test_an_unreachable_host_or_two_names_of_one_address_are_refused_before_launch(
    cluster: str, tmp_path: Path
) -> None:
    _link(cluster, "h1", "down")
    try:
        t0 = time.monotonic()
        down = run_cmd([DISTBENCH, "compare", "--cluster", cluster, *SHORT, "--out", str(tmp_path)], 60)
        over_ssh = run_cmd(
            [
                DISTBENCH,
                "cluster",
                "exec",
                "h0",
                "--name",
                cluster,
                "--",
                DISTBENCH,
                "compare",
                "--hosts",
                "h0:1,h1:1",
                *SHORT,
                "--out",
                str(tmp_path),
            ],
            60,
        )
        assert time.monotonic() - t0 < 60
    finally:
        _link(cluster, "h1", "up")
    for done in (down, over_ssh):
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "host h1 is unreachable" in lines[0] and "nothing was started" in lines[0], lines
    same = [DISTBENCH, "compare", "--hosts", "h0:1,169.254.100.1:1", *SHORT, "--out", str(tmp_path)]
    twice = run_cmd([DISTBENCH, "cluster", "exec", "h0", "--name", cluster, "--", *same], 60)
    assert twice.returncode == 2
    assert twice.stderr.strip().splitlines() == [
        "distbench: error: hosts h0 and 169.254.100.1 both resolve to 169.254.100.1: ranks meant for one would meet "
        "on the other; name each host once, by a name that resolves to that host"
    ]
    assert not list(tmp_path.iterdir())  # nothing started, no compare directory


@needs_rights
@across_hosts
@pytest.mark.timeout(240)
def test_a_link_taken_down_mid_run_fails_the_job_and_names_the_host(cluster: str, tmp_path: Path) -> None:
    long = ["--workload", "transformer", "--epochs", "1", "--steps-per-epoch", "5000", "--train-size", "200000"]
    cmd = [DISTBENCH, "compare", "--cluster", cluster, "--backends", "ddp", "--repeats", "1", *long, "--timeout", "15"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path)],
        cwd=REPO,
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size > 200 for p in tmp_path.glob("*/ddp-r0/timing.csv")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never started its steps"
            time.sleep(0.2)
        _link(cluster, "h1", "down")
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=150)
        took = time.monotonic() - t0
    finally:
        _link(cluster, "h1", "up")
    assert proc.returncode == 1, err[-3000:]
    assert took < 15 + 60, took  # the collective's timeout, then the launcher and the peers' grace
    assert [line for line in err.splitlines() if "FAILED" in line and "host unreachable: h1" in line], err[-3000:]
    meta = json.loads(next(tmp_path.glob("*/ddp-r0/run.json")).read_text())
    assert meta["status"] == "failed"
    assert _pids_in([f"distbench-{cluster}-h0", f"distbench-{cluster}-h1"]) == []


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to confine a rank to one of them")
@pytest.mark.parametrize(
    "launcher",
    [
        "torchrun",
        pytest.param("mpirun", marks=pytest.mark.full_matrix),
        pytest.param("horovodrun", marks=pytest.mark.full_matrix),
    ],
)
@pytest.mark.timeout(120)
def test_a_rank_confined_to_one_core_takes_one_thread(launcher: str, tmp_path: Path) -> None:
    unbound = ["mpirun", "-np", "1", "--bind-to", "none", "--allow-run-as-root", *CLI]  # the rank sees taskset's core
    prefix = {"torchrun": torchrun(1), "mpirun": unbound, "horovodrun": horovodrun(1)}[launcher]
    args = ["run", "--backend", "ddp" if launcher != "horovodrun" else "horovod", "--workload", "linear"]
    args += [
        "--epochs",
        "1",
        "--steps-per-epoch",
        "3",
        "--warmup-steps",
        "1",
        "--quiet",
        "--out",
        str(tmp_path),
        "--run-id",
        "r",
    ]
    done = run_cmd(["taskset", "-c", "0", *prefix, *args], 100)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["threads"] == 1
    assert meta["placement"]["per_rank"][0]["cpus"] == "0"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop the rights it then lacks")
@pytest.mark.timeout(60)
def test_without_the_rights_one_line_says_what_is_missing(tmp_path: Path) -> None:
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps=-all"]
    for args in (["cluster", "up"], ["compare", "--emulate-hosts", "2", "--out", str(tmp_path)]):
        done = run_cmd([*nobody, DISTBENCH, *args], 30)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            "distbench: error: emulated hosts need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN); run as root, or use "
            "--hosts with real ones"
        ]


@needs_rights
@across_hosts
@pytest.mark.timeout(300)
def test_a_slurm_node_per_emulated_host_runs_a_two_node_compare(cluster: str, tmp_path: Path) -> None:
    """One slurmd per emulated host (its own name and address), slurmctld on h0: `salloc -N 2` there and a
    compare of ddp@srun and horovod@srun whose steps put one rank on each host, as on a real cluster."""
    from tests.slurm_cluster import SlurmCluster, missing

    if why := missing():
        pytest.skip(f"no test Slurm: {why}")
    found = emulation.load(cluster)
    assert found is not None
    root = Path(tempfile.mkdtemp(prefix="distbench-slurm-", dir="/run"))  # not /tmp: h1 has its own
    slurm = SlurmCluster(root, found)
    try:
        slurm.start()
        assert slurm.states() == ["idle", "idle"]
        compare = [
            *CLI,
            "compare",
            "--backends",
            "ddp@srun,horovod@srun",
            *SHORT,
            "--out",
            str(tmp_path),
            "--run-id",
            "c",
        ]
        proc = subprocess.run(
            slurm.command(["salloc", "-N", "2", "-n", "2", *compare]),
            capture_output=True,
            text=True,
            timeout=240,
            cwd=REPO,
            env=slurm.env(launcher_env()),
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        for run_id in ("ddp-srun-r0", "horovod-srun-r0"):
            meta = json.loads((tmp_path / "c" / run_id / "run.json").read_text())
            assert meta["launcher"] == "srun" and meta["status"] == "completed"
            assert [h["emulated"]["host"] for h in meta["hosts"]] == ["h0", "h1"]  # one rank on each node
            assert [r["cpus"] for r in meta["placement"]["per_rank"]] == ["0", "1"]  # each its host's core
    finally:
        slurm.stop()
        left = slurm.leftovers()
        shutil.rmtree(root, ignore_errors=True)
    assert not left, left
