"""A workload that holds a known amount of memory: mlp whose training forward fills BALLAST_MB MiB.

`--workload tests.integration.ballast_workload:ballast`: the tensor lives only during the forward (every
page written, then freed), so only a high-water mark over training sees it, not the RSS after.
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.run import workloads
from benchmarks.run.memory import MIB

BALLAST_MB = 300


class Ballast(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            filled = torch.ones(BALLAST_MB * MIB // 4, dtype=torch.float32)
            del filled
        return self.inner(x)


def ballast(seed: int, train_size: int | None = None, val_size: int | None = None) -> workloads.Workload:
    plain = workloads.load("mlp", seed, train_size, val_size)
    return workloads.Workload(
        name="ballast",
        build_model=lambda: Ballast(plain.build_model()),
        train=plain.train,
        val=plain.val,
        loss=plain.loss,
        correct=plain.correct,
    )
