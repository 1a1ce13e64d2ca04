"""Workloads of a user's own, as docs/workloads.md has them written, for compare's sizing and planning tests.

- `gru`: a 2-layer GRU language model (about 60 k parameters) on 1024 training samples of a seeded token
  stream: at compare's default batch an epoch is a few dozen steps, too short for a timed window.
- `noisy`: the mlp whose forward sleeps 0, 10 or 30 ms a step, drawn once per process, so that its runs'
  throughputs spread far more than any budget can settle.
"""

from __future__ import annotations

import os
import random
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.run import workloads

VOCAB, CONTEXT = 64, 32


class GRULM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 48)
        self.gru = nn.GRU(48, 48, num_layers=2, batch_first=True)
        self.head = nn.Linear(48, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(idx))
        return self.head(out)


def _tokens(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(1, 4, (n, CONTEXT + 1), generator=g)
    return torch.cumsum(steps, dim=1) % VOCAB  # a learnable stream: each token a small step from the last


def gru(seed: int, train_size: int | None = None, val_size: int | None = None) -> workloads.Workload:
    n_train, n_val = train_size or 1024, val_size or 128
    data = _tokens(seed, n_train + n_val)
    x, y = data[:, :-1], data[:, 1:]
    return workloads.Workload(
        name="gru",
        build_model=GRULM,
        train=(x[:n_train], y[:n_train]),
        val=(x[n_train:], y[n_train:]),
        loss=lambda out, t: F.cross_entropy(out.transpose(1, 2), t, reduction="none").mean(dim=1),
    )


class Noisy(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        # One delay for the whole run, drawn anew by every process: runs differ, steps within one do not.
        self.delay = random.Random(os.getpid() ^ time.time_ns()).choice((0.0, 0.01, 0.03))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(self.delay)
        return self.inner(x)


def noisy(seed: int, train_size: int | None = None, val_size: int | None = None) -> workloads.Workload:
    plain = workloads.load("mlp", seed, train_size, val_size)
    return workloads.Workload(
        name="noisy",
        build_model=lambda: Noisy(plain.build_model()),
        train=plain.train,
        val=plain.val,
        loss=plain.loss,
        correct=plain.correct,
    )
