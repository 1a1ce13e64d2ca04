"""CPU placement and the environment: threads and core binding, variables recorded and never silently overridden.

The rules in words are docs/fairness.md's; these tests hold the code to them without starting a launcher
(tests/integration/test_placement.py does, under each one).
"""

from __future__ import annotations

import os

import pytest

from backends import BY_NAME
from benchmarks import cli, config, environment
from benchmarks.analysis import check, context, load
from benchmarks.config import HorovodConfig, RunConfig
from benchmarks.errors import InputError
from benchmarks.launch import placement
from benchmarks.suite import variants
from tests.helpers import make_run

MPIRUN_ENV = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1",
    "OMPI_MCA_ess_base_vpid": "0",
    "OMPI_MCA_orte_precondition_transports": "abc-def",
    "OMPI_MCA_btl": "^openib",
    "OMPI_MCA_mpi_oversubscribe": "0",
    "PMIX_RANK": "0",
    "OMPI_ARGV": "-m benchmarks.cli",
    "HOROVOD_RANK": "1",
    "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234",
}


# --- what is recorded --------------------------------------------------------------------------------------
def test_only_variables_that_can_change_a_measurement_are_recorded() -> None:
    env = {
        **MPIRUN_ENV,
        "NCCL_DEBUG": "INFO",
        "HOROVOD_AUTOTUNE": "1",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "OMP_NUM_THREADS": "4",
        "LD_PRELOAD": "libjemalloc.so",
        "HOME": "/root",
        "PATH": "/bin",
        "MASTER_PORT": "29500",
    }
    assert environment.recorded_variables(env) == {
        "HOROVOD_AUTOTUNE": "1",
        "LD_PRELOAD": "libjemalloc.so",
        "NCCL_DEBUG": "INFO",
        "OMPI_MCA_btl": "^openib",
        "OMPI_MCA_mpi_oversubscribe": "0",
        "OMP_NUM_THREADS": "4",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
    }


def test_a_secret_is_recorded_as_set_never_its_value() -> None:
    found = environment.recorded_variables({"HOROVOD_SECRET_KEY": "s3cr3t", "TORCH_HUB_TOKEN": "t0k3n"})
    assert found == {"HOROVOD_SECRET_KEY": environment.REDACTED, "TORCH_HUB_TOKEN": environment.REDACTED}


def test_rank_zeros_set_and_only_what_another_rank_has_differently() -> None:
    ranks = [
        {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0"},
        {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1", "UCX_TLS": "tcp"},
    ]
    assert environment.by_rank(ranks) == {
        "variables": ranks[0],
        "ranks_differing": {"2": {"CUDA_VISIBLE_DEVICES": "1", "NCCL_DEBUG": None, "UCX_TLS": "tcp"}},
    }


# --- the override rule -----------------------------------------------------------------------------------------
def test_a_variable_not_contradicted_by_an_option_becomes_its_value() -> None:
    env = {"HOROVOD_FUSION_THRESHOLD": str(32 << 20), "HOROVOD_CYCLE_TIME": "5"}
    options, adopted = environment.adopt(HorovodConfig(), set(), env)
    assert (options.fusion_threshold_mb, options.cycle_time_ms) == (32.0, 5.0)
    assert adopted["fusion_threshold_mb"] == {"from": f"HOROVOD_FUSION_THRESHOLD={32 << 20}", "value": 32.0}
    assert environment.adoption_notes(adopted)[0] == (
        f"distbench: HOROVOD_FUSION_THRESHOLD={32 << 20} from the environment sets --fusion-threshold-mb 32 "
        "(docs/fairness.md)"
    )


def test_a_given_option_that_the_environment_contradicts_is_refused_naming_the_option() -> None:
    env = {"HOROVOD_FUSION_THRESHOLD": str(32 << 20)}
    with pytest.raises(InputError, match=r"and --fusion-threshold-mb 128 disagree; give the value one way: "):
        environment.adopt(HorovodConfig(), {"fusion_threshold_mb"}, env)  # given, at its default value
    with pytest.raises(InputError, match="--fusion-threshold-mb 64 disagree"):
        environment.adopt(HorovodConfig(fusion_threshold_mb=64.0), set(), env)  # given: differs from its default
    same, adopted = environment.adopt(HorovodConfig(fusion_threshold_mb=32.0), set(), env)
    assert same.fusion_threshold_mb == 32.0 and adopted == {}


def test_thread_variables_that_disagree_or_are_not_numbers_are_refused() -> None:
    with pytest.raises(InputError, match="OMP_NUM_THREADS=4 and MKL_NUM_THREADS=2 in the environment disagree"):
        environment.adopt(RunConfig(), set(), {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "2"})
    with pytest.raises(InputError, match="OMP_NUM_THREADS='4,2' in the environment is not a valid --threads value"):
        environment.adopt(RunConfig(), set(), {"OMP_NUM_THREADS": "4,2"})
    cfg, adopted = environment.adopt(RunConfig(), set(), {"MKL_NUM_THREADS": "3", "OMP_NUM_THREADS": ""})
    assert cfg.threads == 3 and adopted["threads"]["from"] == "MKL_NUM_THREADS=3"


def test_torchruns_own_one_thread_is_not_the_users() -> None:
    env = {"OMP_NUM_THREADS": "1"}
    cfg, _, adopted = environment.adopt_for_run(RunConfig(), HorovodConfig(), set(), env, "torchrun", 2)
    assert cfg.threads is None and adopted == {}
    cfg, _, adopted = environment.adopt_for_run(RunConfig(), HorovodConfig(), set(), env, "mpirun", 2)
    assert cfg.threads == 1 and "threads" in adopted
    cfg, _, _ = environment.adopt_for_run(RunConfig(threads=2), HorovodConfig(), set(), env, "torchrun", 2)
    assert cfg.threads == 2  # a given --threads is not contradicted by torchrun's own value


def test_trace_with_a_users_horovod_timeline_is_refused() -> None:
    with pytest.raises(InputError, match="unset HOROVOD_TIMELINE or leave out --trace"):
        environment.adopt_for_run(
            RunConfig(trace=True), HorovodConfig(), set(), {"HOROVOD_TIMELINE": "/t.json"}, "horovodrun", 2
        )


def test_the_parser_knows_which_options_were_given_even_abbreviated() -> None:
    args = cli.build_parser().parse_args(["run", "--backend", "horovod", "--fusion-thr", "128", "--threads", "2"])
    assert config.given_explicitly(args) == {"fusion_threshold_mb", "threads"}
    assert config.given_explicitly(cli.build_parser().parse_args(["run", "--backend", "ddp"])) == frozenset()


# --- compare and tune: the same rule for the user's environment, before anything starts -------------------------
def cfg() -> RunConfig:
    return RunConfig(workload="mlp", batch_size=8, lr=0.1)


def test_compare_takes_the_users_threads_for_every_job_and_says_so() -> None:
    jobs = variants.jobs_for(
        cfg(), [BY_NAME["ddp@torchrun"], BY_NAME["single"]], [2], None, {}, env={"OMP_NUM_THREADS": "3"}
    )
    assert {j.threads for j in jobs} == {3}
    assert jobs[0].notes == ("distbench: OMP_NUM_THREADS=3 from the environment sets --threads 3 (docs/fairness.md)",)
    with pytest.raises(InputError, match="OMP_NUM_THREADS=3 in the environment and --threads 2 disagree"):
        variants.jobs_for(cfg(), [BY_NAME["ddp@torchrun"]], [2], None, {}, threads=2, env={"OMP_NUM_THREADS": "3"})


def test_compare_refuses_a_horovod_knob_the_environment_contradicts_before_any_job() -> None:
    env = {"HOROVOD_CYCLE_TIME": "5"}
    hvd = [BY_NAME["horovod@gloo"]]
    with pytest.raises(InputError, match="HOROVOD_CYCLE_TIME=5 in the environment and --cycle-time-ms 2 disagree"):
        variants.jobs_for(cfg(), hvd, [2], None, {"horovod": ["--cycle-time-ms", "2"]}, env=env)
    [job] = variants.jobs_for(cfg(), hvd, [2], None, {"horovod": []}, env=env)
    assert job.knobs == [] and "HOROVOD_CYCLE_TIME=5 from the environment sets --cycle-time-ms 5" in job.notes[0]


def test_a_compare_refused_by_the_rule_exits_2_with_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cli.main(["compare", "--workload", "mlp", "--threads", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--threads alone (unset OMP_NUM_THREADS)" in err[0]
    assert not any(tmp_path.iterdir())  # nothing started, no compare directory


def test_every_job_gives_its_threads_and_placement_and_mpirun_does_not_bind(tmp_path) -> None:
    [job] = variants.jobs_for(cfg(), [BY_NAME["ddp@mpirun"]], [2], None, {}, env={})
    cmd = job.command(tmp_path, "r0")
    assert cmd[cmd.index("--bind-to") + 1] == "none"
    assert cmd[cmd.index("--threads") + 1] == str(job.threads) and cmd[cmd.index("--bind") + 1] == "none"
    [job] = variants.jobs_for(RunConfig(workload="mlp", bind="cores"), [BY_NAME["horovod@mpi"]], [2], None, {}, env={})
    cmd = job.command(tmp_path, "r0")
    assert cmd[cmd.index("--bind") + 1] == "cores" and "--bind-to" not in cmd  # horovodrun --mpi: -bind-to none


# --- placement ---------------------------------------------------------------------------------------------
def test_cpu_lists_read_and_write_the_kernels_format() -> None:
    assert placement.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert placement.cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"


@pytest.mark.parametrize(
    ("cpus", "ranks", "shares"),
    [(8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]), (2, 2, [[0], [1]]), (5, 2, [[0, 1], [2, 3]]), (2, 3, [[0], [1], [0]])],
)
def test_bind_cores_gives_each_local_rank_its_own_equal_share(cpus: int, ranks: int, shares: list[list[int]]) -> None:
    assert [placement.share(list(range(cpus)), r, ranks) for r in range(ranks)] == shares


def test_the_record_says_whether_a_rank_was_bound() -> None:
    every = placement.cpu_list(placement.available())
    free = placement.of_rank()
    assert free["cpus"] == placement.cpu_list(os.sched_getaffinity(0)) and free["device"] == "cpu"
    record = placement.record(None, [free, {**free, "cpus": "0", "cpu_count": 1}])
    assert record["policy"] == placement.AS_LAUNCHED and record["available"] == every
    assert record["bound"] is (len(placement.available()) > 1)
    assert placement.summary(record) == f"as launched: {free['cpus']} | 0"
    assert placement.summary(placement.record("none", [free, free])) == f"none: every rank on {free['cpus']}"


# --- the contract and the report -------------------------------------------------------------------------------
def test_check_accepts_run_json_without_them_and_catches_a_malformed_one() -> None:
    assert check.conditions_problems({"world_size": 2}) == []
    bad = {"world_size": 2, "placement": {"per_rank": [{"cpus": "0"}]}, "environment": {"variables": {"A": 1}}}
    assert len(check.conditions_problems(bad)) == 2


def test_the_report_lists_the_variables_and_placement_that_differ(tmp_path) -> None:
    one_rank = [[1.0, 0.1, 0.1]]
    free = {"policy": "none", "per_rank": [{"rank": 0, "cpus": "0-1", "cpu_count": 2}]}
    make_run(
        tmp_path,
        "ddp-r0",
        "ddp",
        one_rank,
        wall=1.0,
        meta={"placement": free, "environment": {"variables": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1"}}},
    )
    make_run(
        tmp_path,
        "horovod-r0",
        "horovod",
        one_rank,
        wall=1.0,
        meta={"placement": {**free, "policy": "cores"}, "environment": {"variables": {"OMP_NUM_THREADS": "1"}}},
    )
    rs = load.load_runs(tmp_path)
    differing = context.differing_options(rs).set_index("option")
    assert differing.loc["environment NCCL_DEBUG"].tolist() == ["INFO", "—"]
    assert "environment OMP_NUM_THREADS" not in differing.index
    facts = context.backend_facts(rs).set_index("")
    assert facts.loc["CPU placement"].tolist() == ["none: every rank on 0-1", "cores: every rank on 0-1"]


MOUNTS = """\
22 1 0:45 / / rw,relatime - overlay overlay rw
23 22 0:46 / /proc rw - proc proc rw
31 22 8:1 /srv/runs /out rw,relatime - ext4 /dev/sda1 rw
"""


def test_out_outside_a_mount_is_said_in_the_image_only_and_on_rank_0() -> None:
    image = {environment.IN_CONTAINER: "1"}
    said = environment.out_outside_mounts("/tmp/results", image, MOUNTS)
    assert said and "deleted with the container" in said and "-v" in said
    assert environment.out_outside_mounts("/out/c", image, MOUNTS) is None  # on the mount
    assert environment.out_outside_mounts("/out", image, MOUNTS) is None
    assert environment.out_outside_mounts("/outside", image, MOUNTS)  # a prefix of a mount point is not inside it
    assert environment.out_outside_mounts("/tmp/results", {}, MOUNTS) is None  # not distbench's image
    assert environment.out_outside_mounts("/tmp/r", {**image, environment.OUT_SAID: "1"}, MOUNTS) is None
    assert environment.out_outside_mounts("/tmp/r", {**image, "RANK": "1"}, MOUNTS) is None
    assert environment.out_outside_mounts("/tmp/r", {**image, "RANK": "0"}, MOUNTS)
