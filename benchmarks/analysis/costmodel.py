"""What a collective costs on a link, carried to N ranks: the α–β model of ring collectives.

A ring allreduce of S bytes over n ranks takes 2(n−1) steps and sends 2(n−1)/n·S bytes from each rank;
reduce-scatter and all-gather take half of each. With α the time of one step and β the time of one byte,

    allreduce(S, n)      = 2(n−1)·α + 2(n−1)/n·S·β
    reduce_scatter(S, n) = all_gather(S, n) = (n−1)·α + (n−1)/n·S·β        (S the whole buffer)

α and β come from a fit of `distbench allreduce` results (one implementation, one collective, the world size
it ran at), or from a link one does not have (`--link 25gbit --latency 5us`: β = 8 ÷ rate, α = latency).
The fit is weighted by each time's own size (relative residuals): a 4-byte call and a 64 MiB one count
alike. Its residuals are kept and shown; the band is the fit's 95 % intervals on α and β. Where the sweep
recorded each call's CPU time, the same form is fitted to it: what a collective takes from a core it shares
with compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

FIT_FROM_BYTES = 64 * 1024
"""The fit uses sizes from here up (gradients go in buckets and fused buffers of this size and more; below
it, on this machine's emulated links, a call's time is a floor that no line through the large sizes
meets). Where fewer than 3 sizes are that large, all are used. Every size's residual is kept. A sharded
collective's sweep rounds each size down to whole elements per rank (at most `8 × ranks` bytes less), and a
size so rounded still counts as the size it was asked at."""
RING = {"allreduce": 2, "reduce_scatter": 1, "all_gather": 1}
"""Per collective: how many times (n − 1) ring steps it takes, and (n − 1)/n of the buffer each rank sends."""


@dataclass(frozen=True)
class Cost:
    """One link's ring cost: `alpha_s` per step, `beta_s_per_byte` per byte a rank sends."""

    alpha_s: float
    beta_s_per_byte: float

    def time(self, collective: str, nbytes: float, n: int) -> float:
        if n < 2 or nbytes <= 0:
            return 0.0
        k = RING[collective]
        return k * (n - 1) * self.alpha_s + k * (n - 1) / n * nbytes * self.beta_s_per_byte


@dataclass
class Fit:
    """A cost fitted from one implementation's sweep of one collective, with what it leaves unexplained."""

    label: str
    """e.g. `torch-gloo allreduce, 2 ranks` or `link 25gbit, latency 5us`."""
    cost: Cost
    low: Cost
    """The cheaper end of the fit's 95 % intervals (α and β each at its low end, never below 0)."""
    high: Cost
    world_size: int | None = None
    residuals: list[dict[str, Any]] = field(default_factory=list)
    """Per measured size: `size_bytes`, `measured_s`, `fitted_s`, `residual` ((fitted − measured) ÷ measured),
    `in_fit` (whether the fit used it)."""
    cpu: Cost | None = None
    """The same ring form fitted to the CPU time of the collective's own threads per call (the sweep's
    `cpu_mean_s` − `caller_cpu_mean_s`); None for a given link or a sweep from before those columns."""

    @property
    def worst_residual(self) -> float | None:
        """The largest residual in size among the sizes fitted, with its sign."""
        fitted = [r["residual"] for r in self.residuals if r["in_fit"]]
        return max(fitted, key=abs, default=None)


def link(rate_bps: int, latency_s: float, label: str) -> Fit:
    """A link given rather than measured: no interval, no residuals."""
    cost = Cost(latency_s, 8.0 / rate_bps)
    return Fit(label, cost, cost, cost)


def fit(
    sizes: list[float], times: list[float], collective: str, world_size: int, label: str, wait_s: float = 0.0
) -> Fit:
    """Least squares of time = A + B·S over the measured sizes, relative to each time, turned into α and β.

    `wait_s`: a part of A that is no ring step (Horovod's wait for its next cycle, which the simulation of
    its schedule adds itself), taken out before A is shared among the 2(n−1) steps."""
    if world_size < 2:
        raise ValueError(f"{label}: a fit needs results of 2 or more ranks, not {world_size}")
    every_s, every_t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if len(set(every_s.tolist())) < 3:
        raise ValueError(f"{label}: a fit needs 3 or more message sizes, got {len(set(every_s.tolist()))}")
    large = every_s >= FIT_FROM_BYTES - 8 * world_size
    s, t = (every_s[large], every_t[large]) if len(set(every_s[large].tolist())) >= 3 else (every_s, every_t)
    design = np.column_stack([np.ones_like(s), s]) / t[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    fitted = coef[0] + coef[1] * s
    dof = len(s) - 2
    sigma2 = float(np.sum((fitted / t - 1) ** 2)) / dof if dof else 0.0
    half = scipy_stats.t.ppf(0.975, dof) * np.sqrt(np.diag(sigma2 * np.linalg.pinv(design.T @ design))) if dof else 0
    k = RING[collective]
    steps, share = k * (world_size - 1), k * (world_size - 1) / world_size

    def cost(a: float, b: float) -> Cost:
        return Cost(max(a - wait_s, 0.0) / steps, max(b, 0.0) / share)

    return Fit(
        label,
        cost(coef[0], coef[1]),
        cost(coef[0] - half[0], coef[1] - half[1]) if dof else cost(coef[0], coef[1]),
        cost(coef[0] + half[0], coef[1] + half[1]) if dof else cost(coef[0], coef[1]),
        world_size,
        [
            {
                "size_bytes": float(a),
                "measured_s": float(b),
                "fitted_s": float(coef[0] + coef[1] * a),
                "residual": float((coef[0] + coef[1] * a) / b - 1),
                "in_fit": bool(a >= s.min()),
            }
            for a, b in zip(every_s, every_t, strict=True)
        ],
    )
