"""`distbench project`: each variant's step time projected to N ranks — a model, labelled so everywhere.

From a compare directory's runs: the compute baseline (the step with no communication, at the placement
it ran at) and the gradient-ready schedule (run.json `compute_baseline`), the run's own knobs (run.json
`knobs`); from `distbench allreduce` results (`--allreduce DIR`, fitted per implementation) or a link
(`--link 25gbit --latency 5us`): what each message costs, carried to N by the ring formulas
(benchmarks.analysis.costmodel). Each framework's schedule is simulated (benchmarks.analysis.schedule).
At the world sizes the compare ran, the projection is set beside the measured step.

    distbench project results/runs/<compare-id> --ranks 8,64,512 --allreduce results/runs/<allreduce-id>
    distbench project results/runs/<compare-id> --ranks 8,64,512 --link 25gbit --latency 5us
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import backends
from benchmarks.analysis import collectives, costmodel, decision, load, rundir, schedule, stats
from benchmarks.analysis.costmodel import Fit
from benchmarks.errors import InputError
from benchmarks.run import collectives as rank_side
from benchmarks.run import recorder as results

LABEL = "projection (a model, not a measurement)"
ASSUMPTIONS = (
    "a flat network: every rank one link from every other, each message at the fitted (or given) cost",
    "ring collectives: allreduce 2(N−1) steps and 2(N−1)/N of the bytes per rank, reduce-scatter and "
    "all-gather half of each",
    "per-rank compute unchanged by N: the compute baseline as measured at the compare's placement",
    "no stragglers: every rank ends backward together",
    "on CPU, the CPU time of a collective's own threads (measured by the sweep) while backward runs is taken "
    "from compute, and lengthens the step by as much; on a GPU it takes none, nor with a given link",
)
JSON, CSV, FIGURE = "projection.json", "projection.csv", "projection.png"
CHECK_BOUND = 0.20
"""How far from a measured step a projection may be before `distbench project` warns that its picks rest on a
model that does not hold there (docs/benchmarks.md's bound)."""
HOROVOD_SWEEP_CYCLE_S = 1e-3
"""The cycle time `distbench allreduce` runs Horovod at (its default): a call waits half of it on average for
the next cycle, which the fit's intercept holds and the simulated cycle adds again, so the fit leaves it out."""


@dataclass
class Inputs:
    """One variant at one measured world size: what the projection is made from."""

    variant: str
    backend: str
    schedule: str
    """How it is simulated (backends.Declared.schedule): `ddp`, `horovod` or `fsdp`."""
    workload: str
    world_size: int
    samples_per_rank: float
    knobs: dict[str, Any]
    accumulate: int
    impl: str | None
    device: str
    compute_s: list[float]
    """Each run's compute-baseline step (median of its steps)."""
    forward_s: float
    backward_s: float
    """The last micro-batch's backward (the baseline's backward ÷ accumulate), medians over runs."""
    grads: list[schedule.Gradient]
    units: list[str]
    measured_s: list[float]
    """Each run's median step."""


def _interval(values: list[float]) -> tuple[float, float, float]:
    """The mean and its 95 % t-interval from 2 runs up; from 1 the mean alone, as both bounds."""
    mean, low, high = stats.mean_ci(values, least=2)
    return (mean, mean, mean) if np.isnan(low) else (mean, low, high)


def modelled() -> list[str]:
    """The backends the projection can simulate: those that declare a schedule."""
    return [d.name for d in backends.DECLARED.values() if d.schedule]


def schedule_of(meta: dict[str, Any]) -> str | None:
    """The schedule its backend declares for this run, None for a backend the projection does not model."""
    name = meta.get("backend")
    return backends.DECLARED[name].schedule_of(meta.get("knobs") or {}) if name in backends.DECLARED else None


def inputs(path: Path) -> list[Inputs]:
    """Every modelled variant × world size among the completed runs under `path` that hold a ready schedule."""
    rs = load.load_runs(path)
    groups: dict[tuple[str, int], list[tuple[dict[str, Any], pd.Series]]] = {}
    for run in rs.runs.to_dict("records"):
        meta = rundir.read(Path(run["run_key"]))
        if schedule_of(meta) is None or not (meta.get("compute_baseline") or {}).get("ready"):
            continue
        summary = pd.read_csv(Path(run["run_key"]) / results.SUMMARY_CSV).iloc[0]
        groups.setdefault((run["variant"], int(meta["world_size"])), []).append((meta, summary))
    found = []
    for (variant, world), runs in groups.items():
        meta = runs[0][0]
        k = int(meta.get("config", {}).get("accumulate", 1))
        baselines = [m["compute_baseline"] for m, _ in runs]
        backward = float(np.median([b["backward_s"] for b in baselines])) / k
        ready = baselines[0]["ready"]
        scale = backward / ready["backward_s"] if ready["backward_s"] else 1.0
        grads = [
            schedule.Gradient(p["name"], float(p["bytes"]), float(p["ready_s"]) * scale)
            for p in ready["params"]
            if p["ready_s"] is not None
        ]
        found.append(
            Inputs(
                variant,
                meta["backend"],
                str(schedule_of(meta)),
                meta["workload"],
                world,
                meta["global_batch"] / world,
                meta.get("knobs") or {},
                k,
                backends.DECLARED[meta["backend"]].collectives_of(meta.get("knobs") or {}),
                str(meta.get("config", {}).get("device", "cpu")),
                [float(b["step_s"]) for b in baselines],
                float(np.median([b["forward_s"] for b in baselines])) / k,
                backward,
                grads,
                list((meta.get("knobs") or {}).get("units") or []),
                [float(s["step_p50_s"]) for _, s in runs],
            )
        )
    if not found:
        raise InputError(
            f"no completed runs of a modelled backend ({', '.join(modelled())}) with a gradient-ready schedule under "
            f"{path}; project a "
            "compare directory made by this version with --compute-baseline-steps above 0 (the default, 10)"
        )
    return sorted(found, key=lambda i: (i.world_size, i.variant))


def fits_from(allreduce_dir: Path) -> dict[tuple[str, str], Fit]:
    """Per (implementation, collective): the fit at the largest world size measured (float32)."""
    frame = collectives.load(allreduce_dir)
    return fits_from_frame(frame[frame["correct"] & (frame["dtype"] == "float32")], str(allreduce_dir))


def fits_from_frame(frame: pd.DataFrame, source: str) -> dict[tuple[str, str], Fit]:
    """`fits_from` over a sweep's correct rows; `source` names it in each fit's label."""
    frame = frame[frame["time_mean_s"].notna()]
    out: dict[tuple[str, str], Fit] = {}
    for (impl, collective), rows in frame.groupby(["impl", "collective"]):
        if rows["world_size"].max() < 2:
            continue
        n = int(rows["world_size"].max())
        at = rows[rows["world_size"] == n].groupby("size_bytes")
        label = f"{impl} {collective}, {n} ranks ({source})"
        wait = HOROVOD_SWEEP_CYCLE_S / 2 if str(impl).startswith("horovod") else 0.0
        times = at["time_mean_s"].median()
        found = costmodel.fit(list(times.index), list(times.to_numpy()), collective, n, label, wait)
        if set(rank_side.CPU_COLUMNS) <= set(rows.columns):  # sweeps before schema 3 lack them
            # The collective's own threads' CPU: the process's less the caller's, who only waits for it. Their idle
            # use (`idle_cpu_per_s`, also in the compute baseline) is not taken off: doing so projected horovod@gloo
            # further short than it is, since the delays backward imposes on its thread are in no term
            # (docs/benchmarks.md, the fifth sitting).
            cpu = (at["cpu_mean_s"].median() - at["caller_cpu_mean_s"].median()).clip(lower=1e-9)
            if cpu.notna().all():
                found.cpu = costmodel.fit(list(cpu.index), list(cpu.to_numpy()), collective, n, label).cost
        out[(str(impl), str(collective))] = found
    return out


class Costs:
    """The fit each variant's collectives use: one link for all, or per implementation from a sweep."""

    def __init__(self, link: Fit | None = None, fitted: dict[tuple[str, str], Fit] | None = None) -> None:
        self.link, self.fitted = link, fitted or {}

    def of(self, item: Inputs, collective: str) -> Fit | None:
        if self.link is not None:
            return self.link
        return self.fitted.get((item.impl or "", collective)) or self.fitted.get((item.impl or "", "allreduce"))

    def used(self) -> list[Fit]:
        return [self.link] if self.link is not None else list(self.fitted.values())


def knob(item: Inputs, name: str, default: float) -> float:
    """A numeric knob of the run; where Horovod's autotuner chose it, the value it settled on."""
    value = item.knobs.get(name, default)
    if not isinstance(value, (int, float)):  # "autotuned"
        value = (item.knobs.get("autotuned") or {}).get(name, default)
    return float(value) if isinstance(value, (int, float)) else default


def simulate(item: Inputs, costs: Costs, n: int, end: str = "cost", overlap: bool = True) -> schedule.Outcome | None:
    """The communication of one step of `item` at `n` ranks; `end`: the fit's `cost`, `low` or `high`."""
    fit = costs.of(item, "allreduce")
    if fit is None:
        return None
    cost: costmodel.Cost = getattr(fit, end)
    fp16 = bool(item.knobs.get("fp16_allreduce")) or item.knobs.get("compression") == "fp16"

    def wire(collective: str, chosen: costmodel.Cost = cost) -> schedule.Wire:
        return lambda nbytes: chosen.time(collective, nbytes, n)

    def cpu_of(collective: str, chosen: Fit) -> schedule.Wire | None:
        """On CPU the collective's own threads take their CPU time from compute; a GPU computes apart."""
        return wire(collective, chosen.cpu) if chosen.cpu is not None and item.device == "cpu" else None

    def halved(per_message: schedule.Wire | None) -> schedule.Wire | None:
        return (lambda nbytes: per_message(nbytes / 2)) if fp16 and per_message else per_message

    cpu = cpu_of("allreduce", fit)

    # fp16 compression halves what DDP buckets and Horovod fuses; FSDP2 reduces in fp16 but gathers in fp32.
    grads = [schedule.Gradient(g.name, g.nbytes / 2, g.ready_s) for g in item.grads] if fp16 else item.grads
    if item.schedule == "ddp":
        # DDP given bucket_cap_mb caps its first bucket likewise; its own default starts with 1 MiB (run.json knobs
        # first_bucket_mb; runs from before it was recorded were always given a cap).
        cap = knob(item, "bucket_cap_mb", 25.0)
        first = knob(item, "first_bucket_mb", cap)
        overlap = overlap and bool(item.knobs.get("grads_overlap_backward", True))  # DeepSpeed's records it
        return schedule.ddp(grads, item.backward_s, wire("allreduce"), cap, overlap, first_bucket_mb=first, cpu=cpu)
    if item.schedule == "horovod":
        # A given link has no agreement in it; Horovod's own sweep does (its fit's α), so none is added to it.
        negotiate = 2 * (n - 1) * cost.alpha_s if fit is costs.link else 0.0
        cycle, fusion = knob(item, "cycle_time_ms", 1.0), knob(item, "fusion_threshold_mb", 128.0)
        return schedule.horovod(grads, item.backward_s, wire("allreduce"), negotiate, cycle, fusion, overlap, cpu)
    gather, scatter = (costs.of(item, c) or fit for c in ("all_gather", "reduce_scatter"))
    return schedule.fsdp(
        schedule.units_of(item.grads, item.units),
        item.forward_s,
        item.backward_s,
        wire("all_gather", getattr(gather, end)),
        halved(wire("reduce_scatter", getattr(scatter, end))),
        bool(item.knobs.get("reshard_after_forward", True)),
        overlap,
        item.accumulate,
        cpu_of("all_gather", gather),
        halved(cpu_of("reduce_scatter", scatter)),
    )


def project(items: list[Inputs], costs: Costs, ranks: list[int], overlap: bool = True) -> pd.DataFrame:
    """One row per variant and N: the projected step (with its band), throughput, efficiency, hidden share."""
    largest = {i.variant: i for i in items}  # the inputs of each variant's largest measured world size
    rows = []
    for item in largest.values():
        compute, compute_low, compute_high = _interval(item.compute_s)
        for n in ranks:
            mid, low, high = (simulate(item, costs, n, end, overlap) for end in ("cost", "low", "high"))
            if mid is None or low is None or high is None:
                continue
            step = compute + mid.exposed_s + mid.taken_s
            rows.append(
                {
                    "variant": item.variant,
                    "ranks": n,
                    "step_s": step,
                    "step_low_s": compute_low + low.exposed_s + low.taken_s,
                    "step_high_s": compute_high + high.exposed_s + high.taken_s,
                    "samples_per_s": n * item.samples_per_rank / step,
                    "efficiency": compute / step,
                    "comm_s": mid.comm_s,
                    "exposed_s": mid.exposed_s,
                    "cpu_taken_s": mid.taken_s,
                    "hidden_share": mid.hidden_share,
                    "messages": mid.messages,
                    "compute_s": compute,
                    "inputs_world_size": item.world_size,
                }
            )
    return pd.DataFrame(rows)


def check(items: list[Inputs], costs: Costs, overlap: bool = True) -> pd.DataFrame:
    """At each measured world size: the projection from that size's own inputs beside the measured step."""
    rows = []
    for item in items:
        outcome = simulate(item, costs, item.world_size, "cost", overlap)
        if outcome is None:
            continue
        projected = float(np.mean(item.compute_s)) + outcome.exposed_s + outcome.taken_s
        measured, low, high = _interval(item.measured_s)
        rows.append(
            {
                "variant": item.variant,
                "ranks": item.world_size,
                "projected_step_s": projected,
                "measured_step_s": measured,
                "measured_low_s": low,
                "measured_high_s": high,
                "runs": len(item.measured_s),
                "error": projected / measured - 1,
            }
        )
    return pd.DataFrame(rows)


def picks(table: pd.DataFrame) -> pd.DataFrame:
    """Per N: the variant projected fastest, and whether its band clears every other variant's."""
    rows = []
    for n, at in table.dropna(subset=["step_s"]).groupby("ranks"):
        best = at.loc[at["step_s"].idxmin()]
        others = at[at["variant"] != best["variant"]]
        apart = not len(others) or bool((best["step_high_s"] < others["step_low_s"]).all())
        rows.append({"ranks": int(n), "pick": best["variant"], "bands_apart": apart})
    return pd.DataFrame(rows)


def measured_picks(path: Path) -> list[dict[str, Any]]:
    """The compare's resolved decisions (its decision.json), to set the projection's picks beside."""
    target = path / decision.DECISION_JSON
    if not target.is_file():
        return []
    setups = json.loads(target.read_text()).get("setups", [])
    return [
        {"ranks": s["world_size"], "pick": s["recommended"]["variant"]}
        for s in setups
        if s.get("status") == "resolved" and s.get("recommended")
    ]


def band(items: list[Inputs], costs: Costs) -> str:
    """What the band around each projected step is made of: only the intervals the inputs have."""
    parts = []
    if any(len(i.compute_s) > 1 for i in items):
        parts.append("the compute baseline's 95 % t-interval over runs")
    if costs.link is None:
        parts.append(
            "the fit's 95 % intervals on α and β, each end taken together (conservative: α and β of a fit vary "
            "against each other)"
        )
    if not parts:
        return (
            "none: one run of each variant and a given link, so neither the compute baseline nor the cost has an "
            "interval (run the compare with --repeats 2 or more)"
        )
    return " with ".join(parts)


def make(path: Path, ranks: list[int], costs: Costs) -> tuple[dict[str, Any], pd.DataFrame]:
    """The projection of the compare under `path` at `ranks`: projection.json's content and its table."""
    items = inputs(path)
    missing = sorted({i.variant for i in items if costs.of(i, "allreduce") is None})
    if len(missing) == len({i.variant for i in items}):
        raise InputError(
            f"the allreduce results hold none of {', '.join(sorted({i.impl or '?' for i in items}))}; run "
            "`distbench allreduce --compare` where the compare ran (the same hosts and link), or give --link"
        )
    table = project(items, costs, ranks)
    checked = check(items, costs)
    measured = [
        {
            "variant": i.variant,
            "ranks": i.world_size,
            "step_s": float(np.mean(i.measured_s)),
            "efficiency": float(np.mean(i.compute_s)) / float(np.mean(i.measured_s)),
        }
        for i in items
    ]
    document = {
        "kind": LABEL,
        "source": str(path),
        "workload": items[0].workload,
        "samples_per_rank": {i.variant: i.samples_per_rank for i in items},
        "ranks": ranks,
        "assumptions": list(ASSUMPTIONS),
        "band": band(items, costs),
        "costs": [
            {
                "label": f.label,
                "alpha_s": f.cost.alpha_s,
                "beta_s_per_byte": f.cost.beta_s_per_byte,
                "cpu_alpha_s": None if f.cpu is None else f.cpu.alpha_s,
                "cpu_beta_s_per_byte": None if f.cpu is None else f.cpu.beta_s_per_byte,
                "worst_residual": f.worst_residual,
                "residuals": f.residuals,
            }
            for f in costs.used()
        ],
        "not_projected": missing,
        "projected": table.to_dict("records"),
        "picks": picks(table).to_dict("records") if len(table) else [],
        "measured": measured,
        "check": checked.to_dict("records"),
        "measured_picks": measured_picks(path),
    }
    return document, table
