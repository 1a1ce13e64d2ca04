"""Launcher detection from the environment alone."""

from __future__ import annotations

import pytest

from benchmarks import launch


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "TORCHELASTIC_RUN_ID": "x",
                "RANK": "3",
                "LOCAL_RANK": "1",
                "WORLD_SIZE": "4",
                "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": "1",
                "MASTER_ADDR": "h0",
                "MASTER_PORT": "1234",
            },
            launch.LaunchInfo("torchrun", 3, 1, 4, 2, 1, "h0", 1234),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            launch.LaunchInfo("mpirun", 1, 1, 2, 2, detail="mpi"),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "2",
                "NCCL_SOCKET_IFNAME": "lo",
                "OMPI_MCA_btl_tcp_if_include": "lo",
                "OMPI_MCA_orte_tag_output": "1",
            },
            launch.LaunchInfo("horovodrun", 0, 0, 2, 1, detail="mpi"),
        ),
        (  # a plain mpirun across hosts pins the interfaces too: still mpirun
            {
                "OMPI_COMM_WORLD_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "2",
                "NCCL_SOCKET_IFNAME": "eth0",
                "OMPI_MCA_btl_tcp_if_include": "eth0",
            },
            launch.LaunchInfo("mpirun", 0, 0, 2, 1, detail="mpi"),
        ),
        (
            {
                "HOROVOD_RANK": "1",
                "HOROVOD_SIZE": "2",
                "HOROVOD_LOCAL_RANK": "1",
                "HOROVOD_LOCAL_SIZE": "2",
                "HOROVOD_CROSS_RANK": "0",
            },
            launch.LaunchInfo("horovodrun", 1, 1, 2, 2, 0, detail="gloo"),
        ),
        ({"PMI_RANK": "2", "PMI_SIZE": "4"}, launch.LaunchInfo("mpirun", 2, 0, 4, 1, detail="mpi")),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "1",
                "SLURM_STEP_ID": "0",
                "SLURM_NODEID": "2",
                "SLURM_TASKS_PER_NODE": "2(x4)",
                "SLURM_JOB_ID": "42",
                "SLURM_JOB_NODELIST": "gpu[07-10]",
            },
            launch.LaunchInfo("srun", 5, 1, 8, 2, 2, "gpu07", 15042),
        ),
        # an sbatch script itself has SLURM_PROCID but no step: a plain single process
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n1"}, launch.LaunchInfo("python")),
        ({}, launch.LaunchInfo("python")),
    ],
)
def test_detect(env: dict[str, str], expected: launch.LaunchInfo) -> None:
    assert launch.detect(env) == expected


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
        ("a[1-2],b5,c[08-09]-ib", ["a1", "a2", "b5", "c08-ib", "c09-ib"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_expand_slurm_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert launch.expand_slurm_nodelist(nodelist) == hosts


SRUN_ENV = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n1"}


@pytest.mark.parametrize(("mpi_type", "detail"), [(None, ""), ("none", ""), ("pmix", "pmix"), ("pmix_v4", "pmix_v4")])
def test_srun_records_its_mpi_plugin(mpi_type: str | None, detail: str) -> None:
    env = {**SRUN_ENV, **({"SLURM_MPI_TYPE": mpi_type} if mpi_type else {})}
    assert launch.detect(env).detail == detail


def test_a_backend_that_needs_mpi_runs_under_srun_only_with_an_mpi_plugin() -> None:
    supported = (launch.HOROVODRUN, launch.MPIRUN, launch.SRUN_MPI, launch.PYTHON)
    launch.check_supported("horovod", supported, launch.detect({**SRUN_ENV, "SLURM_MPI_TYPE": "pmix"}))
    with pytest.raises(launch.WrongLauncherError, match=r"needs MPI under srun.*srun --mpi=pmix"):
        launch.check_supported("horovod", supported, launch.detect(SRUN_ENV))
    # ddp takes its rendezvous from srun's variables, with or without a plugin
    launch.check_supported("ddp", (launch.TORCHRUN, launch.SRUN), launch.detect(SRUN_ENV))


def test_half_set_launcher_variables_are_one_plain_rank_for_saying_an_error() -> None:
    half = {"RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "h"}  # no WORLD_SIZE
    with pytest.raises(KeyError):
        launch.detect(half)
    assert launch.detect_or_plain(half) == launch.LaunchInfo(launcher=launch.PYTHON)
    whole = {**half, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert launch.detect_or_plain(whole) == launch.detect(whole)
