"""`distbench project` against hand-computed numbers: the α–β fit, the ring formulas, each framework's
simulated schedule (and the negative control, overlap modelled away), and the command's bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import cli
from benchmarks.analysis import costmodel, project, projection_view, schedule
from benchmarks.errors import EXIT_BAD_INPUT
from benchmarks.launch import network
from benchmarks.run import recorder as results
from tests.helpers import make_run

MB = 1024 * 1024


def test_fit_recovers_alpha_and_beta_and_the_ring_carries_them_to_n() -> None:
    alpha, beta, n0 = 50e-6, 1e-9, 4
    sizes = [4.0, 1024.0, 65536.0, 1048576.0, 16777216.0]
    times = [2 * (n0 - 1) * alpha + 2 * (n0 - 1) / n0 * s * beta for s in sizes]
    fitted = costmodel.fit(sizes, times, "allreduce", n0, "synthetic")
    assert fitted.cost.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fitted.cost.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert fitted.worst_residual == pytest.approx(0, abs=1e-9)
    cost = fitted.cost
    assert cost.time("allreduce", 1e6, 8) == pytest.approx(14 * alpha + 1.75e6 * beta)
    assert cost.time("reduce_scatter", 1e6, 8) == pytest.approx(7 * alpha + 0.875e6 * beta)
    assert cost.time("allreduce", 1e6, 1) == 0.0
    noisy = costmodel.fit(
        sizes, [t * f for t, f in zip(times, (1.1, 0.9, 1.05, 0.95, 1.0), strict=True)], "allreduce", 2, "n"
    )
    assert noisy.worst_residual > 0.02 and noisy.low.beta_s_per_byte < noisy.high.beta_s_per_byte
    with pytest.raises(ValueError, match="3 or more message sizes"):
        costmodel.fit([4.0, 8.0], [1.0, 2.0], "allreduce", 2, "too few")
    # 64 KiB reduce-scattered over 3 ranks is swept as 65532 B (whole elements per rank): still in the fit.
    rounded = costmodel.fit([1020.0, 65532.0, 262140.0, 1048572.0], [1.0, 1.0, 2.0, 5.0], "reduce_scatter", 3, "r")
    assert [r["in_fit"] for r in rounded.residuals] == [False, True, True, True]


def test_a_link_and_a_latency_given_in_words() -> None:
    given = costmodel.link(network.parse_rate("1gbit"), network.parse_latency("5us"), "1gbit")
    assert given.cost.beta_s_per_byte == pytest.approx(8e-9) and given.cost.alpha_s == pytest.approx(5e-6)
    assert network.parse_latency("0") == 0.0 and network.parse_latency("0.5ms") == pytest.approx(5e-4)
    for bad in ("5", "fast", "-1us"):
        with pytest.raises(network.InputError, match="--latency"):
            network.parse_latency(bad)


def grads(count: int, each: float, backward: float) -> list[schedule.Gradient]:
    """`count` gradients of `each` bytes, ready evenly through `backward` seconds."""
    return [schedule.Gradient(f"layer{i}.weight", each, backward * (i + 1) / count) for i in range(count)]


def test_ddp_buckets_the_first_small_then_at_the_cap_in_ready_order() -> None:
    made = schedule.buckets(grads(10, 0.5 * MB, 1.0), 2 * MB)
    assert [len(b) for b in made] == [2, 4, 4]  # 1 MiB first, then 2 MiB each


def test_ddp_hides_what_backward_covers_and_the_negative_control_hides_nothing() -> None:
    g, backward = grads(8, MB, 0.08), 0.08
    wire = lambda nbytes: nbytes / MB * 0.005  # noqa: E731 - 5 ms a MiB
    overlapped = schedule.ddp(g, backward, wire, bucket_cap_mb=1)
    assert overlapped.messages == 8 and overlapped.comm_s == pytest.approx(0.04)
    assert overlapped.exposed_s == pytest.approx(0.005)  # only the last bucket, ready as backward ends
    after = schedule.ddp(g, backward, wire, bucket_cap_mb=1, overlap=False)
    assert after.exposed_s == pytest.approx(0.04) and after.hidden_share == 0
    one = schedule.ddp(g, backward, wire, bucket_cap_mb=25)  # distbench's DDP: the first bucket is capped alike
    assert one.messages == 1 and one.exposed_s == pytest.approx(0.04)
    small_first = schedule.ddp(g, backward, wire, bucket_cap_mb=25, first_bucket_mb=1)  # torch's own default
    assert small_first.messages == 2 and small_first.exposed_s == pytest.approx(0.035)


def test_the_cpu_a_message_takes_while_backward_runs_is_taken_from_compute_and_none_after_it() -> None:
    g, backward = grads(8, MB, 0.08), 0.08
    wire = lambda nbytes: nbytes / MB * 0.005  # noqa: E731 - 5 ms a MiB
    cpu = lambda nbytes: nbytes / MB * 0.002  # noqa: E731 - 2 ms of CPU a MiB
    taken = schedule.ddp(g, backward, wire, bucket_cap_mb=1, cpu=cpu)
    assert taken.taken_s == pytest.approx(7 * 0.002)  # the last bucket goes after backward
    assert schedule.ddp(g, backward, wire, bucket_cap_mb=1, overlap=False, cpu=cpu).taken_s == 0
    assert schedule.ddp(g, backward, wire, bucket_cap_mb=1).taken_s == 0  # no CPU time known
    half = schedule.ddp([schedule.Gradient("w", MB, 0.0775)], backward, wire, 1, cpu=cpu)
    assert half.taken_s == pytest.approx(0.001)  # half of its 5 ms on the wire falls before backward ends
    hvd = schedule.horovod(g, backward, wire, 0.0, 1.0, 128, cpu=cpu)
    assert 0 < hvd.taken_s <= 8 * 0.002
    sizes = [65536.0, 262144.0, 1048576.0, 4194304.0]
    times = [2e-3 + s * 8e-9 for s in sizes]
    frame = pd.DataFrame(
        {"size_bytes": sizes, "time_mean_s": times, "cpu_mean_s": [t / 2 for t in times], "world_size": 2}
    )
    frame["caller_cpu_mean_s"] = frame["cpu_mean_s"] / 2  # the caller's half of it only waits
    fitted = project.fits_from_frame(frame.assign(impl="torch-gloo", collective="allreduce"), "sweep")
    cpu_cost = fitted[("torch-gloo", "allreduce")].cpu
    assert cpu_cost is not None and cpu_cost.beta_s_per_byte == pytest.approx(2e-9, rel=1e-6)
    # The threads' idle use is recorded, not taken off (docs/benchmarks.md says why).
    idle = project.fits_from_frame(frame.assign(impl="h", collective="allreduce", idle_cpu_per_s=0.1), "sweep")
    idle_cost = idle[("h", "allreduce")].cpu
    assert idle_cost is not None and idle_cost.beta_s_per_byte == pytest.approx(2e-9, rel=1e-6)


def test_horovod_fuses_what_each_cycle_finds_ready() -> None:
    g, backward = grads(8, MB, 0.08), 0.08
    wire = lambda nbytes: nbytes / MB * 0.005  # noqa: E731
    fused = schedule.horovod(g, backward, wire, 0.0, cycle_time_ms=1000, fusion_threshold_mb=128)
    # A cycle at phase 0 finds nothing and the next (1 s) everything; at 0.25, 0.5, 0.75 s everything.
    assert fused.messages == 1 and fused.exposed_s == pytest.approx((0.96 + 0.21 + 0.46 + 0.71) / 4)
    quick = schedule.horovod(g, backward, wire, 0.0, cycle_time_ms=1, fusion_threshold_mb=128)
    assert quick.exposed_s == pytest.approx(0.005, abs=0.0015)  # each gradient sent within a cycle of ready
    unfused = schedule.horovod(g, backward, wire, 0.0, cycle_time_ms=1000, fusion_threshold_mb=0, overlap=False)
    assert unfused.messages == 8 and unfused.exposed_s == pytest.approx(0.04)


def test_fsdp_units_own_their_parameters_and_a_free_wire_costs_nothing() -> None:
    g = [
        schedule.Gradient("head.weight", MB, 0.01),
        schedule.Gradient("blocks.1.w", MB, 0.03),
        schedule.Gradient("blocks.0.w", MB, 0.05),
        schedule.Gradient("tok.weight", MB, 0.06),
    ]
    units = schedule.units_of(g, ["blocks.0", "blocks.1", ""])
    assert [(u.name, u.nbytes) for u in units] == [("blocks.1", MB), ("blocks.0", MB), ("", 2 * MB)]
    free = schedule.fsdp(units, 0.03, 0.06, lambda b: 0.0, lambda b: 0.0, True)
    assert free.exposed_s == 0 and free.comm_s == 0
    costly = schedule.fsdp(units, 0.03, 0.06, lambda b: b / MB * 0.01, lambda b: b / MB * 0.01, True)
    later = schedule.fsdp(units, 0.03, 0.06, lambda b: b / MB * 0.01, lambda b: b / MB * 0.01, True, overlap=False)
    assert 0.04 <= costly.exposed_s < later.exposed_s  # forward's gathers (40 ms) are exposed either way


def synthetic_compare(root: Path) -> Path:
    """Two DDP runs with a compute baseline of 60 ms (backward 40 ms) and eight 0.5 MB gradients."""
    params = [{"name": f"l{i}.w", "bytes": 500_000, "ready_s": 0.005 * (8 - i)} for i in range(8)]
    baseline = {
        "steps": 10,
        "step_s": 0.06,
        "data_s": 0.0,
        "forward_s": 0.015,
        "backward_s": 0.04,
        "optimizer_s": 0.005,
    }
    for r, step in enumerate((0.071, 0.069)):
        meta = {
            "knobs": {"dist_backend": "gloo", "bucket_cap_mb": 1.0},
            "compute_baseline": {**baseline, "ready": {"steps": 3, "backward_s": 0.04, "params": params}},
        }
        run_dir = make_run(root, f"ddp-r{r}", "ddp", [[step] * 30] * 2, wall=30 * step, meta=meta)
        meta = json.loads((run_dir / results.RUN_JSON).read_text())
        row = results.summary_row(meta, [step] * 29, 20 * 29, {}, 29 * step, [0.06] * 10)
        pd.DataFrame([row]).to_csv(run_dir / results.SUMMARY_CSV, index=False, columns=results.SUMMARY_COLUMNS)
    return root


def test_project_a_compare_labels_it_and_checks_it_against_the_measured_step(tmp_path: Path) -> None:
    root = synthetic_compare(tmp_path / "cmp")
    costs = project.Costs(link=costmodel.link(10**9, 0.0, "1gbit"))
    document, table = project.make(root, [2, 8], costs)
    assert document["kind"] == project.LABEL and "no stragglers" in " ".join(document["assumptions"])
    at2 = table[table.ranks == 2].iloc[0]
    # 4 MB at 1 Gbit, 2 ranks: 32 ms on the wire, in 1 MiB buckets of three, three and two 0.5 MB gradients,
    # ready at 15, 30 and 40 ms and 12, 12 and 8 ms long: the last ends at 50 ms, 10 ms after backward.
    assert at2.comm_s == pytest.approx(0.032) and at2.step_s == pytest.approx(0.07)
    assert table[table.ranks == 8].iloc[0].step_s > at2.step_s
    checked = document["check"][0]
    assert checked["ranks"] == 2 and abs(checked["error"]) < 0.02
    negative = project.check(project.inputs(root), costs, overlap=False).iloc[0]
    assert negative["projected_step_s"] == pytest.approx(0.06 + 0.032)
    out = tmp_path / "out"
    projection_view.write(out, document, table)
    assert {p.name for p in out.iterdir()} == {project.JSON, project.CSV, project.FIGURE}
    lines = projection_view.words(document)
    assert lines[0].startswith("Projection (a model, not a measurement)") and any("assumptions:" in x for x in lines)
    assert lines[1].strip().startswith("efficiency = the compute baseline's step")  # what it is measured against
    assert not any(x.startswith("warning:") for x in lines)  # within 2 % of the measured step
    assert document["band"].startswith("the compute baseline's 95 % t-interval") and "α and β" not in document["band"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ([], "give the cost of communication"),
        (["--link", "1gbit", "--allreduce", "x"], "give the cost of communication"),
        (["--link", "1gbit", "--allreduce", "x"], "not both"),
        (["--link", "fast"], "--link takes a rate"),
        (["--link", "unlimited"], "needs a rate"),
        (["--link", "1gbit", "--ranks", "0,8"], "--ranks takes"),
        (["--link", "1gbit", "--latency", "5"], "--latency takes"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, extra: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = synthetic_compare(tmp_path / "cmp")
    assert cli.main(["project", str(root), *extra]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


def test_a_directory_without_a_ready_schedule_says_how_to_get_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path, "ddp-r0", "ddp", [[0.1] * 5] * 2, wall=0.5)
    assert cli.main(["project", str(tmp_path), "--link", "1gbit"]) == EXIT_BAD_INPUT
    assert "--compute-baseline-steps" in capsys.readouterr().err


def test_edge_inputs_cost_nothing_and_autotuned_knobs_are_read_from_what_the_autotuner_settled_on() -> None:
    wire = lambda nbytes: 1.0  # noqa: E731
    assert schedule.horovod([], 0.05, wire, 0.0, 0.0, 128).exposed_s == 0
    assert schedule.fsdp([], 0.01, 0.05, wire, wire, True).exposed_s == 0
    g = grads(4, MB, 0.04)
    assert schedule.horovod(g, 0.04, lambda b: 0.001, 0.0, 0.0, 128).messages >= 1  # a cycle time of 0 ends
    item = project.Inputs(
        "horovod@gloo", "horovod", "horovod", "transformer", 2, 16,
        {"cycle_time_ms": "autotuned", "autotuned": {"cycle_time_ms": 3.5}},
        1, "horovod-gloo", "cpu", [0.06], 0.02, 0.04, g, [], [0.07],
    )  # fmt: skip
    assert project.knob(item, "cycle_time_ms", 1.0) == 3.5 and project.knob(item, "fusion_threshold_mb", 128) == 128


def test_a_projection_far_from_the_measured_step_says_its_picks_rest_on_it(tmp_path: Path) -> None:
    root = synthetic_compare(tmp_path / "cmp")
    slow = project.Costs(link=costmodel.link(10**8, 0.0, "100mbit"))  # 4 MB: 320 ms on the wire, 70 ms measured
    lines = projection_view.words(project.make(root, [2], slow)[0])
    warned = [x for x in lines if x.startswith("warning:")]
    assert len(warned) == 1 and "ddp@torchrun at N = 2 (+" in warned[0], lines


def test_the_band_is_made_of_the_intervals_the_inputs_have_and_none_is_said() -> None:
    item = project.Inputs(
        "ddp@torchrun", "ddp", "ddp", "mlp", 2, 16, {}, 1, "torch-gloo", "cpu", [0.06], 0.02, 0.04, [], [], [0.07]
    )
    link = project.Costs(link=costmodel.link(10**9, 0.0, "1gbit"))
    assert project.band([item], link).startswith("none: one run of each variant and a given link")
    fitted = project.Costs(fitted={})
    assert project.band([item], fitted).startswith("the fit's 95 % intervals")


def test_a_report_over_two_projected_compares_shows_both(tmp_path: Path) -> None:
    costs = project.Costs(link=costmodel.link(10**9, 0.0, "1gbit"))
    roots = [synthetic_compare(tmp_path / name) for name in ("a", "b")]
    for root, ranks in zip(roots, ([2, 8], [2, 16]), strict=True):
        projection_view.write(root / "projection", *project.make(root, ranks, costs))
    (tmp_path / "out").mkdir()
    (tmp_path / "out-one").mkdir()
    images, table = projection_view.report_section(roots, tmp_path / "out")
    assert [p.name for p in images] == ["projection-1.png", "projection-2.png"]
    assert all(p.stat().st_size > 0 for p in images)
    by_source = {source: sorted(rows["ranks"]) for source, rows in table.groupby("source")}
    assert by_source == {str(roots[0]): [2, 8], str(roots[1]): [2, 16]}
    alone = projection_view.report_section([roots[0], tmp_path / "nothing"], tmp_path / "out-one")
    assert alone is not None and [p.name for p in alone[0]] == [project.FIGURE] and "source" not in alone[1]


def test_deepspeeds_reduction_in_backward_is_exposed_unless_it_runs_apart() -> None:
    # ZeRO 1-2 reduce in backward's hooks and block it (overlap_comm off, or on CPU): nothing of it hides.
    g = grads(4, MB, 0.04)
    link = project.Costs(link=costmodel.link(10**9, 0.0, "1gbit"))

    def item(overlapped: bool) -> project.Inputs:
        knobs = {"bucket_cap_mb": 1.0, "first_bucket_mb": 1.0, "grads_overlap_backward": overlapped}
        return project.Inputs(
            "deepspeed@torchrun", "deepspeed", "ddp", "mlp", 2, 16, knobs, 1, "torch-gloo", "cpu",
            [0.06], 0.02, 0.04, g, [], [0.07],
        )  # fmt: skip

    apart, blocking = (project.simulate(item(o), link, 2) for o in (True, False))
    assert apart is not None and blocking is not None
    assert blocking.exposed_s == pytest.approx(blocking.comm_s) and apart.exposed_s < blocking.exposed_s
