"""A workload whose fp16 gradients overflow at GradScaler's first scales: `linear` with targets a thousand
times larger, so that fp16's loss scaler must skip steps (non-finite gradients) before it settles.

`--workload tests.integration.step_workload:overflowing --amp fp16`: run.json step.loss_scaler counts them.
"""

from __future__ import annotations

from benchmarks.run import workloads

TARGET_SCALE = 1000.0


def overflowing(seed: int, train_size: int | None = None, val_size: int | None = None) -> workloads.Workload:
    plain = workloads.load("linear", seed, train_size, val_size)
    (x, y), (vx, vy) = plain.train, plain.val
    return workloads.Workload(
        name="overflowing",
        build_model=plain.build_model,
        train=(x, y * TARGET_SCALE),
        val=(vx, vy * TARGET_SCALE),
        loss=plain.loss,
    )
