"""The built-in workloads' models and data (their defaults, sizes included, are declared once in
`benchmarks/catalog.py`'s REGISTRY; a size left at None here means that default).

Sample i is the same on every rank, backend and world size for a given seed, because each set is
generated whole from a generator seeded only by `seed`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.catalog import REGISTRY
from benchmarks.run.workloads import Workload

CHUNK = 65536
"""Samples per step when a set is built in place (cnn): bounds the temporary, not the result."""


def _generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + salt)


def _sizes(name: str, train_size: int | None, val_size: int | None) -> tuple[int, int]:
    defaults = REGISTRY[name].defaults
    return train_size or defaults["train_size"], val_size or defaults["val_size"]


def _classification_correct(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out.argmax(dim=-1) == y).float()


def _per_sample_ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


def linear(seed: int, train_size: int | None = None, val_size: int | None = None) -> Workload:
    """`nn.Linear(10, 1)` regression with MSE on y = x·w + b + noise."""
    n_train, n_val = _sizes("linear", train_size, val_size)
    g = _generator(seed, 1)
    w, b = torch.randn(10, 1, generator=g), torch.randn(1, generator=g)
    x = torch.randn(n_train + n_val, 10, generator=g)
    y = x @ w + b + 0.1 * torch.randn(n_train + n_val, 1, generator=g)
    return Workload(
        name="linear",
        build_model=lambda: nn.Linear(10, 1),
        train=(x[:n_train], y[:n_train]),
        val=(x[n_train:], y[n_train:]),
        loss=lambda out, t: F.mse_loss(out, t, reduction="none").mean(dim=1),
    )


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled digits, read from its file: `sklearn.datasets` would pull pandas and scipy
    into every rank."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ValueError("the mlp workload needs scikit-learn's bundled digits: pip install scikit-learn")
    table = np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return torch.tensor(table[:, :-1], dtype=torch.float32) / 16.0, torch.tensor(table[:, -1], dtype=torch.long)


def _mlp(hidden: int, layers: int) -> nn.Module:
    widths = [64] + [hidden] * layers
    body = [m for a, b in zip(widths[:-1], widths[1:], strict=True) for m in (nn.Linear(a, b), nn.ReLU())]
    return nn.Sequential(*body, nn.Linear(hidden, 10))


def mlp(
    seed: int, train_size: int | None = None, val_size: int | None = None, hidden: int = 128, layers: int = 2
) -> Workload:
    """A classifier on scikit-learn's bundled 8×8 digits (1797 real images): 64, `layers` hidden layers of
    `hidden`, 10."""
    x, y = _digits()
    n_val = val_size or REGISTRY["mlp"].defaults["val_size"]
    n_train = train_size or len(x) - n_val
    if n_train + n_val > len(x):
        raise ValueError(f"mlp has {len(x)} samples; --train-size + --val-size is {n_train + n_val}")
    order = torch.randperm(len(x), generator=_generator(seed, 2))
    x, y = x[order], y[order]
    return Workload(
        name="mlp",
        build_model=lambda: _mlp(hidden, layers),
        train=(x[:n_train], y[:n_train]),
        val=(x[n_train : n_train + n_val], y[n_train : n_train + n_val]),
        loss=_per_sample_ce,
        correct=_classification_correct,
    )


class _ResidualBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet(width: int = 16, stages: int = 3, blocks: int = 1) -> nn.Module:
    """A ResNet for 32×32 images: a stem of `width` channels, then `stages` stages of `blocks` residual
    blocks, each stage after the first halving the resolution and doubling the channels."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    channels = width
    for stage in range(stages):
        for block in range(blocks):
            out = width * 2**stage
            layers.append(_ResidualBlock(channels, out, 2 if stage > 0 and block == 0 else 1))
            channels = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))


def cnn(
    seed: int,
    train_size: int | None = None,
    val_size: int | None = None,
    width: int = 16,
    stages: int = 3,
    blocks: int = 1,
) -> Workload:
    """A ResNet (BatchNorm) on 3×32×32 images: a class template plus noise, 10 classes."""
    n_train, n_val = _sizes("cnn", train_size, val_size)
    g = _generator(seed, 3)
    templates = torch.randn(10, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n_train + n_val,), generator=g)
    # In place and in chunks: the same values as `templates[y] + 2.0 * randn(...)` without two more copies of
    # the whole set (12 KiB a sample: a million validation samples would otherwise need 36 GiB at once).
    x = torch.randn(n_train + n_val, 3, 32, 32, generator=g).mul_(2.0)
    for start in range(0, len(x), CHUNK):
        x[start : start + CHUNK] += templates[y[start : start + CHUNK]]
    return Workload(
        name="cnn",
        build_model=lambda: resnet(width, stages, blocks),
        train=(x[:n_train], y[:n_train]),
        val=(x[n_train:], y[n_train:]),
        loss=_per_sample_ce,
        correct=_classification_correct,
    )


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder; dropout-free so every backend computes the same function."""

    def __init__(
        self, vocab: int = 512, context: int = 32, dim: int = 128, layers: int = 4, heads: int = 4, tied: int = 0
    ):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[_Block(dim, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        if tied:  # GPT-2's output layer is its token embedding: one parameter, one gradient
            # and GPT-2's init (std 0.02): nn.Embedding's N(0, 1) as output weights makes logits so large
            # that the first loss is ~80 instead of ln(vocab).
            nn.init.normal_(self.tok.weight, std=0.02)
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def transformer(
    seed: int,
    train_size: int | None = None,
    val_size: int | None = None,
    vocab: int = 512,
    context: int = 32,
    dim: int = 128,
    layers: int = 4,
    heads: int = 4,
    tied: int = 0,
) -> Workload:
    """A GPT on seeded token sequences (arithmetic progressions mod the vocabulary)."""
    n_train, n_val = _sizes("transformer", train_size, val_size)
    g = _generator(seed, 4)
    n = n_train + n_val
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 8, (n, 1), generator=g)
    tokens = (stride * torch.arange(context + 1)).add_(start).remainder_(vocab)  # in place: one copy of the set
    x, y = tokens[:, :-1], tokens[:, 1:]
    return Workload(
        name="transformer",
        build_model=lambda: TinyGPT(vocab, context, dim, layers, heads, tied),
        train=(x[:n_train], y[:n_train]),
        val=(x[n_train:], y[n_train:]),
        loss=token_loss,
        correct=token_correct,
    )


def token_loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean next-token cross-entropy (out: batch × length × vocab)."""
    return F.cross_entropy(out.transpose(1, 2), t, reduction="none").mean(dim=1)


def token_correct(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return (out.argmax(dim=-1) == t).float().mean(dim=1)
