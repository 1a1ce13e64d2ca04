"""compare's variants (BACKEND[@LAUNCHER]), world-size lists and strong scaling, before anything starts;
and which launchers a backend accepts (ddp under horovodrun --mpi)."""

from __future__ import annotations

import pytest

import backends
import backends as launch_variants
from benchmarks import cli, launch
from benchmarks.errors import InputError
from benchmarks.suite import compare, hosts, slurm, variants


def names(text: str | None, launcher: str | None = None) -> list[str]:
    return [v.name for v in variants.parse(text, launcher)]


def test_bare_names_keep_their_launcher_and_variants_name_theirs() -> None:
    assert names(None) == ["ddp@torchrun", "horovod@gloo", "horovod@mpi"]  # the default
    assert names("ddp,horovod,single") == ["ddp@torchrun", "horovod@gloo", "single"]
    assert names("horovod@mpirun, ddp@mpirun") == ["horovod@mpirun", "ddp@mpirun"]  # order kept, spaces ignored


def test_launcher_applies_to_bare_names_only() -> None:
    assert names(None, "mpirun") == ["ddp@mpirun", "horovod@mpirun"]  # `compare --launcher mpirun` as before
    assert names("ddp,horovod@gloo,single", "mpirun") == ["ddp@mpirun", "horovod@gloo", "single"]
    assert names("horovod", "horovodrun") == ["horovod@gloo"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backends", "ddp,tensorflow"], "unknown variant 'tensorflow' in --backends; valid: ddp@torchrun, "),
        (["--backends", "horovod@torchrun"], "unknown variant 'horovod@torchrun'"),
        (["--backends", "ddp@gloo"], "unknown variant 'ddp@gloo'"),
        (["--backends", "ddp,ddp@torchrun"], "variant 'ddp@torchrun' is listed twice"),
        (["--backends", " , "], "--backends is empty"),
        (["--backends", "ddp", "--launcher", "horovodrun"], "backend 'ddp' cannot run under horovodrun"),
        (["--nproc", "1,x"], "--nproc takes positive integers"),
        (["--nproc", "2,2"], "lists a world size twice"),
        (["--nproc", "1,2,4", "--global-batch", "30"], "--global-batch 30 does not divide into 4 rank(s)"),
        (["--nproc", "2", "--global-batch", "64", "--accumulate", "3"], "give a multiple of 6"),
        (["--global-batch", "64", "--batch-size", "8"], "give it or --batch-size, not both"),
        (["--repeats", "0"], "--repeats must be a positive integer"),
        (["--backends", "ddp,fsdp", "--fsdp-units", "blocks"], "--fsdp-units blocks names no module of this model"),
        (["--margin", "0"], "--margin is a relative difference between 0 and 1"),
        (["--memory-limit-mb", "-1"], "--memory-limit-mb is a positive number of MB per rank"),
        (["--global-batch", "0"], "--global-batch must be a positive integer, got 0"),
        (["--global-batch", "-8"], "--global-batch must be a positive integer, got -8"),
        (["--cycle-time-ms", "0"], "--cycle-time-ms must be greater than 0"),
        (["--backends", "ddp@srun"], "ddp@srun runs each job as a step of a Slurm allocation"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_starts(tmp_path, capsys, argv, message) -> None:
    out = tmp_path / "out"
    code = cli.main(["compare", *argv, "--workload", "linear", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT, err
    assert err.count("\n") == 1 and err.startswith("distbench: error: ") and message in err, err
    assert not out.exists()


def test_a_bad_variant_lists_every_valid_one(capsys) -> None:
    assert cli.main(["compare", "--backends", "nope"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert all(name in err for name in launch_variants.BY_NAME)


def test_strong_scaling_arithmetic() -> None:
    assert variants.per_rank_batches(64, [1, 2, 4], 1) == {1: 64, 2: 32, 4: 16}
    assert variants.per_rank_batches(48, [1, 2], 3) == {1: 16, 2: 8}  # ÷ (ranks × accumulate)
    with pytest.raises(InputError, match="give a multiple of 12"):
        variants.per_rank_batches(20, [1, 2, 3], 2)  # 20 is not a multiple of 3 × 2


def _jobs(*argv: str) -> list[compare.Job]:
    args = cli.build_parser().parse_args(["compare", "--workload", "linear", *argv])
    cfg, _ = compare.effective_config(args)
    chosen = variants.parse(args.backends, args.launcher)
    return compare.jobs_for(cfg, chosen, variants.parse_nproc(args.nproc), args.global_batch, {})


def test_jobs_interleave_world_sizes_and_give_single_the_global_batch() -> None:
    weak = _jobs("--backends", "ddp,single", "--nproc", "1,2", "--batch-size", "8")
    assert [(j.variant.name, j.nproc, j.ranks, j.cfg.batch_size) for j in weak] == [
        ("ddp@torchrun", 1, 1, 8),
        ("single", 1, 1, 8),
        ("ddp@torchrun", 2, 2, 8),
        ("single", 2, 1, 16),
    ]
    assert [j.run_prefix for j in weak] == ["ddp-w1", "single-w1", "ddp-w2", "single-w2"]
    strong = _jobs("--backends", "horovod@mpi,single", "--nproc", "1,4", "--global-batch", "64")
    assert [(j.nproc, j.cfg.batch_size) for j in strong] == [(1, 64), (1, 64), (4, 16), (4, 64)]
    one = _jobs("--backends", "ddp,horovod@gloo", "--nproc", "2")  # one world size: the old run names
    assert [j.run_prefix for j in one] == ["ddp", "horovod-gloo"]


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        ("ddp@torchrun", ["torchrun", "--standalone", "--nproc-per-node=4"]),
        ("ddp@mpirun", ["mpirun", "-np", "4", "--oversubscribe"]),
        ("horovod@gloo", ["horovodrun", "-np", "4", "--gloo"]),
        ("horovod@mpi", ["horovodrun", "-np", "4", "--mpi"]),
        ("horovod@mpirun", ["mpirun", "-np", "4", "--oversubscribe"]),
        ("single", ["python", "-m", "benchmarks.cli"]),
        ("ddp@srun", ["srun", "--exact", "--ntasks=4", "--cpus-per-task=2", "--cpu-bind=none", "--quit-on-interrupt"]),
        ("horovod@srun", ["srun", "--exact", "--ntasks=4", "--mpi=pmix", "--kill-on-bad-exit=1"]),
    ],
)
def test_each_variant_starts_under_its_launcher(variant: str, words: list[str]) -> None:
    [cmd] = hosts.Hosts().commands(launch_variants.BY_NAME[variant], 4, ["run"], {"OMP_NUM_THREADS": "2"})
    assert cmd[0].endswith(words[0]) and all(w in cmd for w in words[1:]), cmd
    assert ("--mpi=pmix" in cmd) == (variant == "horovod@srun")


def test_srun_variants_run_inside_an_allocation_of_enough_tasks() -> None:
    steps = variants.parse("ddp@srun,horovod@srun")
    inside = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}
    slurm.check(steps, [2, 4], many_hosts=False, env=inside)
    slurm.check(variants.parse("ddp@torchrun"), [2], many_hosts=False, env={})  # no @srun: no allocation needed
    with pytest.raises(InputError, match="outside one"):
        slurm.check(steps, [2], many_hosts=False, env={})
    with pytest.raises(InputError, match="more than allocation 7's 4 tasks"):
        slurm.check(steps, [8], many_hosts=False, env=inside)
    with pytest.raises(InputError, match="leave out --hosts"):
        slurm.check(steps, [2], many_hosts=True, env=inside)
    assert names("ddp,horovod", "srun") == ["ddp@srun", "horovod@srun"]


def test_run_json_maps_back_to_its_variant() -> None:
    for v in launch_variants.KNOWN:
        assert launch_variants.label(v.backend, v.launcher, v.controller) == v.name
    assert launch_variants.label("single", "srun") == "single"
    assert launch_variants.label("ddp", "horovodrun") == "ddp@horovodrun"


OMPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
PINS = {"NCCL_SOCKET_IFNAME": "eth0", "OMPI_MCA_btl_tcp_if_include": "eth0", "OMPI_MCA_orte_tag_output": "1"}


@pytest.mark.parametrize(
    ("env", "ok"),
    [
        (OMPI, True),  # plain mpirun
        ({**OMPI, **PINS}, True),  # horovodrun --mpi, or an mpirun given --tag-output: never refused
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, False),  # horovodrun --gloo: no rendezvous for DDP
    ],
)
def test_ddp_accepts_every_mpi_launch(env: dict[str, str], ok: bool) -> None:
    info = launch.detect(env)
    ddp = backends.get("ddp")
    assert launch.accepts(ddp.launchers, info) is ok
    assert launch.uses_mpi(info) is ok  # and then its rendezvous goes over MPI
    if not ok:
        with pytest.raises(launch.WrongLauncherError, match="cannot run under horovodrun --gloo; .*horovodrun --mpi"):
            launch.check_supported("ddp", ddp.launchers, info)
