"""Where the ranks run, without starting any: host lists and hostfiles, each launcher's multi-node command lines,
the emulated cluster's pieces (rates, core shares, the ssh stand-in's arguments), threads from the CPUs a
process may use, and compare's bad host options (one line, exit 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from backends import BY_NAME
from benchmarks import cli
from benchmarks.errors import InputError
from benchmarks.launch import placement
from benchmarks.suite import cluster, host_options, hosts, ssh_standin


def test_host_lists_and_hostfiles() -> None:
    assert host_options.parse_hosts("h0:2, h1") == [hosts.Slot("h0", 2), hosts.Slot("h1", None)]
    for bad in ("h0:0", "h0:x", ":2", "", "h0,h0"):
        with pytest.raises(InputError):
            host_options.parse_hosts(bad)


def test_hostfile_in_horovodruns_form(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode0 slots=4\nnode1:2\nnode2\n\n")
    assert host_options.parse_hostfile(str(path)) == [
        hosts.Slot("node0", 4),
        hosts.Slot("node1", 2),
        hosts.Slot("node2"),
    ]
    path.write_text("node0 slots=four\n")
    with pytest.raises(InputError, match="line 1"):
        host_options.parse_hostfile(str(path))
    with pytest.raises(InputError, match="readable"):
        host_options.parse_hostfile(str(tmp_path / "missing"))


def test_world_sizes_spread_as_evenly_as_the_slots_allow() -> None:
    uneven = hosts.Hosts([hosts.Slot("a", 2), hosts.Slot("b", 1)], "eth0")
    assert uneven.counts(3) == [2, 1]  # the hostfile's own fill, as horovodrun and mpirun launch it
    assert uneven.counts(2) == [1, 1] and uneven.counts(1) == [1, 0]
    assert uneven.host_list(3) == "a:2,b:1" and uneven.host_list(1) == "a:1"
    uneven.check_sizes([1, 2, 3])
    with pytest.raises(InputError, match="--nproc 4 is more ranks than the hosts' 3 slots \\(a 2, b 1\\)"):
        uneven.check_sizes([4])
    assert hosts.Hosts([hosts.Slot("a"), hosts.Slot("b")]).counts(5) == [3, 2]  # no slots: no limit
    assert hosts.Hosts([hosts.Slot("a", 1), hosts.Slot("b", 4)]).counts(4) == [1, 3]


def test_uneven_hosts_launch_under_every_launcher_with_their_own_counts() -> None:
    where = hosts.Hosts([hosts.Slot("h0", 2), hosts.Slot("h1", 1)], "eth0", fake_cluster())
    env = {"OMP_NUM_THREADS": "1", **where.env()}
    first, second = where.commands(BY_NAME["ddp@torchrun"], 3, ["run"], env)
    assert "--nproc-per-node=2" in first and "--node-rank=0" in first and "--nnodes=2" in first
    assert "--nproc-per-node=1" in second and "--node-rank=1" in second
    for name in ("ddp@mpirun", "horovod@mpi", "horovod@gloo"):
        [cmd] = where.commands(BY_NAME[name], 3, ["run"], env)
        assert cmd[cmd.index("-H") + 1] == "h0:2,h1:1" and cmd[cmd.index("-np") + 1] == "3", name
    # 1 core each: h0's two ranks get 1 thread each, and so does h1's one (the same threads for every rank).
    assert where.threads(3) == 1 and "3 ranks on 2 emulated hosts" in (where.oversubscription(3) or "")
    assert where.oversubscription(2) is None  # one rank a host


@pytest.fixture(autouse=True)
def _no_settings_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables that can change a measurement are forwarded to other hosts too; a machine that sets some
    of its own (OPENBLAS_CORETYPE, say) would add them to every command line these tests read."""
    for name in hosts.forwarded():
        monkeypatch.delenv(name)


def fake_cluster() -> cluster.Cluster:
    made = [cluster.Host(f"h{i}", f"distbench-x-h{i}", f"169.254.100.{i + 1}", str(i), False) for i in range(2)]
    return cluster.Cluster("x", "1gbit", 10**9, made, "distbench-x-sw", "now")


def test_each_launchers_multi_node_form() -> None:
    where = hosts.Hosts([hosts.Slot("h0"), hosts.Slot("h1")], "eth0", fake_cluster())
    env = {"OMP_NUM_THREADS": "1", **where.env()}
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == env["HOROVOD_GLOO_IFACE"] == "eth0"
    per_host = where.commands(BY_NAME["ddp@torchrun"], 4, ["run"], env)
    assert len(per_host) == 2  # torchrun on each host, in its namespace
    for i, cmd in enumerate(per_host):
        assert cmd[:4] == ["ip", "netns", "exec", f"distbench-x-h{i}"]
        tail = cmd[cmd.index("sh") + 3 :]
        assert "--nnodes=2" in tail and "--nproc-per-node=2" in tail and f"--node-rank={i}" in tail
        assert tail[tail.index("--master-addr") + 1] == "h0"
    [mpi] = where.commands(BY_NAME["ddp@mpirun"], 4, ["run"], env)
    assert mpi[3] == "distbench-x-h0"  # the launcher runs on the first host
    assert "-H" in mpi and mpi[mpi.index("-H") + 1] == "h0:2,h1:2"
    assert mpi[mpi.index("plm_rsh_agent") + 1].endswith("/x/bin/ssh")
    assert mpi[mpi.index("btl_tcp_if_include") + 1] == "eth0"
    assert {mpi[i + 1] for i, a in enumerate(mpi) if a == "-x"} == set(env)
    [hvd] = where.commands(BY_NAME["horovod@mpi"], 2, ["run"], env)
    assert hvd[hvd.index("-H") + 1] == "h0:1,h1:1" and "--mpi" in hvd
    assert hvd[hvd.index("--network-interface") + 1] == "eth0"


def test_over_ssh_the_environment_and_directory_go_on_the_command_line() -> None:
    where = hosts.Hosts([hosts.Slot("localhost"), hosts.Slot("node1.invalid")], "ib0")
    first, second = where.commands(BY_NAME["ddp@torchrun"], 2, ["run"], {"OMP_NUM_THREADS": "3"})
    assert first[0].endswith("torchrun")  # this machine: no ssh
    assert second[: len(hosts.SSH)] == list(hosts.SSH) and second[len(hosts.SSH) :][:2] == ["-tt", "node1.invalid"]
    assert second[-1].startswith("cd ") and "env OMP_NUM_THREADS=3 " in second[-1] and "--node-rank=1" in second[-1]


def test_a_first_host_the_others_cannot_reach_is_refused() -> None:
    where = hosts.Hosts([hosts.Slot("localhost"), hosts.Slot("node1.invalid")], "eth0")
    with pytest.raises(InputError, match="host localhost resolves to 127.0.0.1, which the other hosts cannot reach"):
        where.check()


def test_rates_core_shares_and_the_ssh_stand_ins_arguments() -> None:
    assert cluster.parse_rate("1gbit") == 10**9 and cluster.parse_rate("2.5gbit") == 25 * 10**8
    assert cluster.parse_rate("100mbit") == 10**8 and cluster.parse_rate("unlimited") is None
    for bad in ("1gb", "fast", "0gbit"):
        with pytest.raises(InputError, match="--link"):
            cluster.parse_rate(bad)
    assert cluster.split_cores([0, 1, 2, 3], 2) == [("0-1", False), ("2-3", False)]
    assert cluster.split_cores([0, 1], 3) == [("0", True), ("1", True), ("0", True)]  # more hosts than cores
    c = fake_cluster()
    # Horovod puts ssh options on both sides of the host; Open MPI passes its orted command as words.
    host, cmd, _ = ssh_standin.agent_argv(
        c, ["-o", "PasswordAuthentication=no", "h1", "-o", "ConnectTimeout=5", "date"]
    )
    assert host is not None and host.name == "h1" and cmd == "date"
    host, cmd, _ = ssh_standin.agent_argv(c, ["-x", "root@h0", "orted", "-mca", "ess", "env"])
    assert host is not None and host.name == "h0" and cmd == "orted -mca ess env"
    assert ssh_standin.agent_argv(c, ["h9", "true"])[0] is None


def test_threads_come_from_the_cpus_a_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "available", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(placement, "cpu_quota", lambda: None)
    monkeypatch.setattr(placement, "affinity", lambda: [0, 1, 2, 3])
    assert placement.default_threads(2) == 2  # unbound: the host's cores shared by its local ranks
    monkeypatch.setattr(placement, "affinity", lambda: [3])
    assert placement.default_threads(1) == 1  # confined to one core (taskset, a launcher's binding)
    monkeypatch.setattr(placement, "affinity", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(placement, "cpu_quota", lambda: 1.5)
    assert placement.default_threads(1) == 1  # a cgroup's quota of 1.5 CPUs
    assert placement.oversubscribed(2) is True


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--emulate-hosts", "0"], "--emulate-hosts takes a positive number"),
        (["--emulate-hosts", "2", "--link", "fast"], "--link takes a rate"),
        (["--link", "1gbit"], "give it with --emulate-hosts"),
        (["--emulate-hosts", "2", "--cluster", "x"], "--emulate-hosts and --cluster each say where"),
        (["--iface", "eth0"], "give it with --hosts"),
        (["--cluster", "nosuch"], "no cluster nosuch is up"),
        (["--hosts", "localhost:1,127.0.0.1:1"], "both resolve to 127.0.0.1"),
        (["--hosts", "localhost:1,127.0.0.2:1", "--nproc", "3"], "more ranks than the hosts' 2 slots"),
        (["--hosts", "a:1", "--hostfile", "f"], "--hosts and --hostfile each say where the ranks run"),
    ],
)
def test_bad_host_options_are_one_line_and_exit_2(argv: list[str], said: str, capsys, tmp_path) -> None:
    code = cli.main(["compare", *argv, "--workload", "linear", "--repeats", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_software_under_tmp_stays_visible_on_every_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone under /tmp: its venv and checkout are kept on the hosts whose /tmp is otherwise their own."""
    clone = tmp_path / "clone"
    clone.mkdir()
    monkeypatch.setattr(sys, "prefix", str(clone / ".venv"))
    monkeypatch.chdir(clone)
    kept = cluster.kept_in_tmp()
    assert str(clone.resolve()) in kept
    assert not [k for k in kept if k != str(clone.resolve()) and Path(k).is_relative_to(clone.resolve())]


def test_horovod_gloo_on_one_host_needs_a_hostname_that_resolves(monkeypatch, capsys) -> None:
    gloo, others = [BY_NAME["horovod@gloo"]], [BY_NAME["ddp@torchrun"], BY_NAME["horovod@mpi"]]
    hosts.check_hostname(gloo, hosts.Hosts())  # this machine's name resolves

    def no_such_name(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(hosts.socket, "gethostname", lambda: "distbench-nowhere")
    monkeypatch.setattr(hosts.socket, "getaddrinfo", no_such_name)
    hosts.check_hostname(others, hosts.Hosts())  # torchrun and mpirun rendezvous at 127.0.0.1 on one host
    with pytest.raises(
        InputError, match=r"hostname distbench-nowhere does not resolve.*127\.0\.1\.1 distbench-nowhere"
    ):
        hosts.check_hostname(gloo, hosts.Hosts())
    assert capsys.readouterr().err == ""
    # The default variants go on without it, saying so once.
    assert hosts.check_hostname([*gloo, *others], hosts.Hosts(), asked=False) == others
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "horovod@gloo left out of the default variants" in err and "--hostname" in err


def test_start_up_says_when_ranks_outnumber_cores_before_anything_runs() -> None:
    def made(cpus: list[str], shared: bool) -> hosts.Hosts:
        members = [cluster.Host(f"h{i}", f"ns{i}", f"169.254.0.{i + 1}", c, shared) for i, c in enumerate(cpus)]
        emulated = cluster.Cluster("t", "1gbit", None, members, "br", "now")
        return hosts.Hosts(slots=[hosts.Slot(m.name) for m in members], cluster=emulated)

    assert made(["0", "1"], shared=False).oversubscription(2) is None
    said = made(["0", "1", "0"], shared=True).oversubscription(3)
    assert said is not None and "3 emulated hosts sharing cores, 2 cores in all" in said and "time-slicing" in said
    assert "4 ranks on 2 emulated hosts" in (made(["0", "1"], shared=False).oversubscription(4) or "")


def test_a_hostfile_may_name_an_emulated_clusters_hosts() -> None:
    found = fake_cluster()
    assert host_options.emulated_slots(found, None) == [hosts.Slot("h0"), hosts.Slot("h1")]
    listed = [hosts.Slot("h0", 2), hosts.Slot("h1", 1)]
    assert host_options.emulated_slots(found, listed) == listed
    with pytest.raises(InputError, match="host h7 is not one of cluster x's \\(h0, h1\\)"):
        host_options.emulated_slots(found, [hosts.Slot("h0"), hosts.Slot("h7")])
    with pytest.raises(InputError, match="list h0 first"):
        host_options.emulated_slots(found, [hosts.Slot("h1"), hosts.Slot("h0")])
