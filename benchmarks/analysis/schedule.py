"""Each framework's gradient communication, simulated against a measured backward: how much of it is left
exposed after backward ends.

Times are seconds from the start of the step's last backward (earlier micro-batches of an accumulating
step communicate nothing). The wire carries one message at a time, in the order the framework issues them:
- DDP: buckets in the order gradients became ready (DDP rebuilds them so after its first step), each up to
  `bucket_cap_mb`, the first up to `first_bucket_mb` (torch's 1 MiB where DDP is given no cap, as distbench
  gives none unless asked; the cap itself otherwise); a bucket goes when its last gradient is ready, and
  never before the bucket ahead of it.
- Horovod: a background cycle every `cycle_time_ms`; each cycle first agrees on what is ready (one small
  collective), then sends it fused into buffers of up to `fusion_threshold_mb`, and the next cycle starts
  when this one is done and the cycle time has passed. The cycle's phase against backward is unknown, so
  the result is the mean over four phases.
- FSDP2: each unit's parameters all-gathered before its forward (no prefetch in forward) and, when resharded
  after forward, again before its backward (prefetched one unit ahead), and its gradients reduce-scattered
  after its backward. A unit's forward takes the forward's time in proportion to its share of backward.

Where a collective's CPU time is known (`cpu`, seconds per message like `Wire`), the part of it spent while
backward runs is reported as `taken_s`: on a CPU rank, compute and communication share the cores, so that
time lengthens the step (first order: it delays backward and nothing after it). FSDP2's counts its
backward's prefetched gathers and its reduce-scatters; its forward's gathers stall compute, which waits.

`overlap=False` (the negative control) sends every gradient message only after backward has ended (FSDP2's
all-gathers stay where they are: a unit cannot compute without its parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""torch.distributed's `_DEFAULT_FIRST_BUCKET_BYTES`: DDP's first bucket is small so it goes early."""
HOROVOD_PHASES = 4
MiB = 1024 * 1024

Wire = Callable[[float], float]
"""The seconds one message of so many bytes takes on the wire (the collective and N already chosen)."""


@dataclass(frozen=True)
class Gradient:
    name: str
    nbytes: float
    ready_s: float
    """When it is ready, from the start of the last backward."""


@dataclass(frozen=True)
class Outcome:
    exposed_s: float
    """Communication time left after backward (FSDP2: and before forward's units), added to the step."""
    comm_s: float
    """Every message's time on the wire, summed."""
    messages: int
    taken_s: float = 0.0
    """CPU time of the messages on the wire while backward runs (their share of it), when `cpu` was given."""

    @property
    def hidden_share(self) -> float | None:
        return None if self.comm_s <= 0 else max(0.0, min(1.0, 1 - self.exposed_s / self.comm_s))


def _during_backward(start: float, took: float, backward_s: float) -> float:
    """The share of a message on the wire from `start` for `took` seconds that falls before backward ends."""
    if took <= 0:
        return 0.0
    return max(0.0, min(1.0, (backward_s - start) / took))


def _send(
    messages: Sequence[tuple[float, float]], wire: Wire, backward_s: float, overlap: bool, cpu: Wire | None = None
) -> Outcome:
    """Messages (issue time, bytes), in issue order, one at a time on the wire."""
    end, total, taken = 0.0, 0.0, 0.0
    for issued, nbytes in messages:
        took = wire(nbytes)
        start = max(end, issued if overlap else backward_s)
        if cpu is not None:
            taken += cpu(nbytes) * _during_backward(start, took, backward_s)
        end = start + took
        total += took
    return Outcome(max(0.0, end - backward_s), total, len(messages), taken)


def buckets(
    grads: Sequence[Gradient], cap_bytes: float, first_bytes: float = DDP_FIRST_BUCKET_BYTES
) -> list[list[Gradient]]:
    """DDP's bucket assignment over gradients in ready order: a bucket closes once it holds its limit."""
    out: list[list[Gradient]] = [[]]
    size, limit = 0.0, first_bytes
    for g in sorted(grads, key=lambda g: g.ready_s):
        out[-1].append(g)
        size += g.nbytes
        if size >= limit:
            out.append([])
            size, limit = 0.0, cap_bytes
    return [b for b in out if b]


def ddp(
    grads: Sequence[Gradient],
    backward_s: float,
    wire: Wire,
    bucket_cap_mb: float,
    overlap: bool = True,
    first_bucket_mb: float | None = None,
    cpu: Wire | None = None,
) -> Outcome:
    """`first_bucket_mb`: None when the first bucket is capped like the rest (DDP given `bucket_cap_mb`)."""
    issued, messages = 0.0, []
    first = bucket_cap_mb * MiB if first_bucket_mb is None else first_bucket_mb * MiB
    for bucket in buckets(grads, bucket_cap_mb * MiB, first):
        issued = max(issued, max(g.ready_s for g in bucket))  # launched in bucket order
        messages.append((issued, sum(g.nbytes for g in bucket)))
    return _send(messages, wire, backward_s, overlap, cpu)


def horovod(
    grads: Sequence[Gradient],
    backward_s: float,
    wire: Wire,
    negotiate_s: float,
    cycle_time_ms: float,
    fusion_threshold_mb: float,
    overlap: bool = True,
    cpu: Wire | None = None,
) -> Outcome:
    if not grads:
        return Outcome(0.0, 0.0, 0)
    cycle = max(cycle_time_ms / 1000, 1e-5)  # HOROVOD_CYCLE_TIME=0 still takes a turn of the loop
    fusion = fusion_threshold_mb * MiB
    results = []
    for phase in range(HOROVOD_PHASES):
        pending = sorted(grads, key=lambda g: g.ready_s)
        start = cycle * phase / HOROVOD_PHASES if overlap else backward_s
        total, messages, taken = 0.0, 0, 0.0

        def sent(nbytes: float, at: float) -> float:
            nonlocal total, messages, taken
            took = wire(nbytes)
            total, messages = total + took, messages + 1
            if cpu is not None:
                taken += cpu(nbytes) * _during_backward(at, took, backward_s)
            return at + took

        while pending:
            now = start + negotiate_s
            ready = [g for g in pending if g.ready_s <= start]
            pending = pending[len(ready) :]
            group = 0.0
            for g in ready:  # fused in ready order, each buffer up to the threshold (0: no fusion)
                if group and group + g.nbytes > fusion:
                    now, group = sent(group, now), 0.0
                group += g.nbytes
            if group:
                now = sent(group, now)
            start = max(start + cycle, now)
        results.append(Outcome(max(0.0, now - backward_s), total, messages, taken))
    n = len(results)
    return Outcome(
        sum(r.exposed_s for r in results) / n,
        sum(r.comm_s for r in results) / n,
        round(sum(r.messages for r in results) / n),
        sum(r.taken_s for r in results) / n,
    )


@dataclass(frozen=True)
class Unit:
    name: str
    nbytes: float
    """The unit's own parameters, whole (unsharded)."""
    ready_s: float
    """When its last gradient is ready: its backward ends."""


def units_of(grads: Sequence[Gradient], unit_names: Sequence[str]) -> list[Unit]:
    """Each parameter to the innermost unit whose name prefixes it ("" the root), in backward order."""
    named = sorted((u for u in unit_names if u), key=len, reverse=True)
    owned: dict[str, list[Gradient]] = {}
    for g in grads:
        owner = next((u for u in named if g.name.startswith(u + ".")), "")
        owned.setdefault(owner, []).append(g)
    units = [Unit(u, sum(g.nbytes for g in gs), max(g.ready_s for g in gs)) for u, gs in owned.items()]
    return sorted(units, key=lambda u: u.ready_s)


def fsdp(
    units: Sequence[Unit],
    forward_s: float,
    backward_s: float,
    all_gather: Wire,
    reduce_scatter: Wire,
    reshard_after_forward: bool,
    overlap: bool = True,
    accumulate: int = 1,
    cpu_gather: Wire | None = None,
    cpu_scatter: Wire | None = None,
) -> Outcome:
    """Forward then backward of FSDP2's units; `exposed_s` is the step's growth over the bare compute.

    With `accumulate` k, the k − 1 earlier micro-batches gather as the last does (only the reduce-scatter
    waits for the last); their gathers are counted exposed. `overlap=False` delays the reduce-scatters only:
    a unit cannot compute before its parameters are gathered."""
    if not units:
        return Outcome(0.0, 0.0, 0)
    order = list(units)  # backward order; the root ("") is first in forward and last in backward
    spans = [u.ready_s - (order[i - 1].ready_s if i else 0.0) for i, u in enumerate(order)]
    total_span = sum(spans) or 1.0
    forward_order = sorted(range(len(order)), key=lambda i: (order[i].name != "", -i))
    gathers = [all_gather(u.nbytes) for u in order]
    scatters = [reduce_scatter(u.nbytes) for u in order]
    clock = 0.0
    for i in forward_order:  # each unit's all-gather, then its forward
        clock += gathers[i] + forward_s * spans[i] / total_span
    forward_exposed = clock - forward_s
    # Backward: the wire carries, in issue order, the prefetched all-gather of the next unit and the
    # reduce-scatter of the one just done; a unit's backward waits for its parameters.
    wire_free, compute = 0.0, 0.0
    regather = [reshard_after_forward and u.name != "" for u in order]
    have = [0.0] * len(order)
    if regather[0]:
        wire_free = have[0] = gathers[0]
    compute = have[0]
    on_wire: list[tuple[float, float, float]] = []  # (start, seconds, CPU seconds) of backward's messages
    for i in range(len(order)):
        start = max(compute, have[i])
        if i + 1 < len(order) and regather[i + 1]:
            begin = max(wire_free, start)
            wire_free = have[i + 1] = begin + gathers[i + 1]
            on_wire.append((begin, gathers[i + 1], cpu_gather(order[i + 1].nbytes) if cpu_gather else 0.0))
        compute = start + spans[i]
        begin = max(wire_free, compute if overlap else max(compute, backward_s))
        wire_free = begin + scatters[i]
        on_wire.append((begin, scatters[i], cpu_scatter(order[i].nbytes) if cpu_scatter else 0.0))
    end = max(wire_free, compute)
    # What of it falls while backward computes; the stalls between units are not compute's time.
    taken = sum(c * _during_backward(b, t, compute) for b, t, c in on_wire)
    gathered = sum(gathers) + sum(g for g, r in zip(gathers, regather, strict=True) if r)
    earlier = (accumulate - 1) * gathered
    exposed = forward_exposed + max(0.0, end - backward_s) + earlier
    return Outcome(
        exposed,
        accumulate * gathered + sum(scatters),
        accumulate * (len(order) + sum(regather)) + len(order),
        taken,
    )
