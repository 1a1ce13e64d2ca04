"""Placement and the environment under real launchers: the same CPU placement for every variant, and
the environment recorded and never silently overridden (docs/fairness.md).

Each job is started the way `compare` starts it (`variants.jobs_for(...).command`, OMP_NUM_THREADS as compare
sets it), at 2 ranks on the smallest workload, and its run.json is read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends import BY_NAME
from benchmarks.config import RunConfig
from benchmarks.launch import placement
from benchmarks.suite import variants
from tests.helpers import CLI, horovodrun, mpirun, run_cmd, run_ok, torchrun

TINY = [
    "--workload",
    "mlp",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "3",
    "--warmup-steps",
    "1",
    "--quiet",
    "--compute-baseline-steps",
    "0",
    "--val-size",
    "64",
]
EVERY_CORE = placement.cpu_list(placement.available())


def meta_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def compare_job(variant: str, root: Path, bind: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The command and environment compare gives one repeat of `variant` at 2 ranks."""
    cfg = RunConfig(
        workload="mlp",
        epochs=1,
        steps_per_epoch=3,
        warmup_steps=1,
        quiet=True,
        compute_baseline_steps=0,
        val_size=64,
        bind=bind,
    )
    [job] = variants.jobs_for(cfg, [BY_NAME[variant]], [2], None, {}, env={})
    return job.command(root, "r"), {"OMP_NUM_THREADS": str(job.threads)}


# variant: (launcher, launcher_detail, Horovod's controller) as run.json must record them. One job per launcher
# is read for both its placement and its launch (test_launch.py runs the launches compare does not make).
LAUNCHED_AS = {
    "ddp@torchrun": ("torchrun", None, None),
    "ddp@mpirun": ("mpirun", None, None),
    "horovod@gloo": ("horovodrun", "gloo", "gloo"),
    "horovod@mpi": ("horovodrun", "mpi", "mpi"),
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant", list(LAUNCHED_AS))
def test_compare_runs_every_launcher_unbound(tmp_path, variant: str, horovod_available) -> None:
    cmd, env = compare_job(variant, tmp_path)
    run_ok(cmd, 180, **env, NCCL_DEBUG="INFO")
    meta = meta_of(tmp_path / "r")
    launcher, detail, controller = LAUNCHED_AS[variant]
    assert (meta["launcher"], meta["world_size"], meta["status"]) == (launcher, 2, "completed")
    if controller:  # the launcher's own flag and the controller Horovod initialised agree
        assert (meta["launcher_detail"], meta["knobs"]["controller"]) == (detail, controller)
    found = meta["placement"]
    assert (found["policy"], found["available"], found["bound"]) == ("none", EVERY_CORE, False), found
    assert [r["cpus"] for r in found["per_rank"]] == [EVERY_CORE, EVERY_CORE]
    assert meta["environment"]["variables"]["NCCL_DEBUG"] == "INFO"  # the user's variables reach run.json
    assert not any(n.startswith(("OMPI_MCA_orte_", "HOROVOD_RANK")) for n in meta["environment"]["variables"])


@pytest.mark.timeout(200)
@pytest.mark.skipif(len(placement.available()) < 2, reason="Open MPI binds ranks to cores only with ≥ 2 cores")
def test_plain_mpirun_binds_each_rank_which_the_record_shows(tmp_path) -> None:
    """The trap: a `run` under a plain mpirun keeps Open MPI's binding unless given --bind, and says so."""
    run_ok([*mpirun(2), "run", "--backend", "ddp", *TINY, "--out", str(tmp_path), "--run-id", "r"], 180)
    found = meta_of(tmp_path / "r")["placement"]
    assert (found["policy"], found["bound"]) == ("as launched", True)
    assert all(r["cpu_count"] == 1 for r in found["per_rank"]), found


@pytest.mark.timeout(200)
@pytest.mark.skipif(len(placement.available()) < 2, reason="two ranks need two cores to have a share each")
def test_bind_cores_pins_each_rank_to_its_own_share_under_torchrun(tmp_path) -> None:
    cmd, env = compare_job("ddp@torchrun", tmp_path, bind="cores")
    run_ok(cmd, 180, **env)
    found = meta_of(tmp_path / "r")["placement"]
    cores = placement.available()
    expected = [placement.cpu_list(placement.share(cores, rank, 2)) for rank in range(2)]
    assert (found["policy"], found["bound"]) == ("cores", True)
    assert [r["cpus"] for r in found["per_rank"]] == expected


# --- no silent override -------------------------------------------------------------------------------------
@pytest.mark.timeout(200)
def test_horovodrun_adopts_an_exported_fusion_threshold_and_says_so(tmp_path, horovod_available) -> None:
    cmd = [*horovodrun(2), "run", "--backend", "horovod", *TINY, "--out", str(tmp_path), "--run-id", "r"]
    proc = run_ok(cmd, 180, HOROVOD_FUSION_THRESHOLD=str(32 << 20), HOROVOD_AUTOTUNE="0")
    assert "HOROVOD_FUSION_THRESHOLD=33554432 from the environment sets --fusion-threshold-mb 32" in proc.stderr
    meta = meta_of(tmp_path / "r")
    assert meta["knobs"]["fusion_threshold_mb"] == 32.0 and meta["config"]["fusion_threshold_mb"] == 32.0
    assert meta["environment"]["adopted"]["fusion_threshold_mb"]["value"] == 32.0
    assert meta["environment"]["variables"]["HOROVOD_AUTOTUNE"] == "0"


@pytest.mark.timeout(200)
def test_horovodrun_refuses_a_given_option_the_environment_contradicts(tmp_path, horovod_available) -> None:
    cmd = [*horovodrun(2), "run", "--backend", "horovod", *TINY, "--cycle-time-ms", "2", "--out", str(tmp_path)]
    proc = run_cmd(cmd, 180, HOROVOD_CYCLE_TIME="5")
    assert proc.returncode != 0  # horovodrun's own exit code for a rank's 2
    said = [line for line in proc.stderr.splitlines() if "distbench: error:" in line]
    assert said and "HOROVOD_CYCLE_TIME=5 in the environment and --cycle-time-ms 2 disagree" in said[0]
    assert not any(tmp_path.iterdir())  # refused before any process group: no run directory


# `make test` exports the thread count under torchrun, the launcher that would otherwise set its own
# (OMP_NUM_THREADS=1); under mpirun it is `full_matrix`.
@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", [pytest.param("mpirun", marks=pytest.mark.full_matrix), "torchrun"])
def test_an_exported_thread_count_is_adopted_or_refused(tmp_path, launcher: str) -> None:
    start = mpirun(2) if launcher == "mpirun" else torchrun(2)
    run = [*start, "run", "--backend", "ddp", *TINY, "--out", str(tmp_path)]
    proc = run_ok([*run, "--run-id", "r"], 180, OMP_NUM_THREADS="2")
    assert "OMP_NUM_THREADS=2 from the environment sets --threads 2" in proc.stderr
    meta = meta_of(tmp_path / "r")
    assert (meta["threads"], meta["environment"]["adopted"]["threads"]["from"]) == (2, "OMP_NUM_THREADS=2")
    refused = run_cmd([*run, "--run-id", "x", "--threads", "1"], 180, OMP_NUM_THREADS="2")
    assert refused.returncode != 0  # the launcher's own code for its ranks' exit 2
    assert "OMP_NUM_THREADS=2 in the environment and --threads 1 disagree" in refused.stderr
    assert not (tmp_path / "x").exists()


def test_the_cli_under_no_launcher_is_unchanged(tmp_path) -> None:
    """A plain `run` of the one-process backend, under no launcher and given no --bind, records its placement."""
    run_ok([*CLI, "run", "--backend", "single", *TINY, "--out", str(tmp_path), "--run-id", "r"], 120)
    found = meta_of(tmp_path / "r")["placement"]
    assert found["policy"] == "as launched" and len(found["per_rank"]) == 1
