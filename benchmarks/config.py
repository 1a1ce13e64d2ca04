"""Run configuration: one dataclass per concern, every field documented, turned into CLI options.

The `help` in each field's metadata is both its documentation and its `--option` help text, so the
CLI, `run.json` and this file cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class RunConfig:
    """What to train and how; identical for every backend."""

    workload: str = _opt("mlp", "workload name (linear, mlp, cnn, transformer) or package.module:factory")
    epochs: int = _opt(2, "number of epochs")
    steps_per_epoch: int | None = _opt(None, "cap on optimizer steps per epoch (default: one pass)")
    batch_size: int | None = _opt(
        None, "per-rank micro-batch size; global batch = batch × world size × accumulate (default: the workload's)"
    )
    train_size: int | None = _opt(None, "training samples (default: the workload's own)")
    val_size: int | None = _opt(None, "validation samples (default: the workload's own)")
    lr: float | None = _opt(
        None, "learning rate of SGD (momentum 0.9), the same for every backend, never scaled (default: the workload's)"
    )
    seed: int = _opt(0, "seed for data, initial weights and shuffling")
    warmup_steps: int = _opt(5, "first steps flagged warm-up and left out of summary.csv")
    device: str = _opt("cpu", "cpu or cuda", choices=("cpu", "cuda"))
    threads: int | None = _opt(None, "torch intra-op threads per rank (default: cores ÷ local ranks)")
    out: str = _opt("results/runs", "directory that receives <run-id>/")
    run_id: str | None = _opt(None, "name of the run directory (default: time-backend-workload-wN-xxxx)")
    flush_every: int = _opt(100, "gather per-rank rows to rank 0 every N steps (off the timed path)")
    accumulate: int = _opt(1, "micro-batches per optimizer step (DDP no_sync / Horovod backward_passes)")
    fp16_allreduce: bool = _opt(False, "compress gradients to fp16 for the allreduce (both backends)")
    timeout: float = _opt(300.0, "seconds a rank may wait in start-up or a collective before failing")
    quiet: bool = _opt(False, "no progress bar")
    overwrite: bool = _opt(False, "replace an existing run directory of the same --run-id")
    inject_fault: str | None = _opt(
        None, "testing: fail as MODE@STEP[:RANK], MODE one of exception, exit0, exit1, abort, sigkill, sigterm, hang"
    )


@dataclass
class DDPConfig:
    """Knobs of torch.nn.parallel.DistributedDataParallel (defaults are PyTorch's)."""

    dist_backend: str | None = _opt(None, "torch.distributed backend (default: gloo on CPU, nccl on CUDA)")
    bucket_cap_mb: float = _opt(25.0, "DDP gradient bucket size in MB")
    gradient_as_bucket_view: bool = _opt(False, "let gradients alias the DDP buckets")
    static_graph: bool = _opt(False, "tell DDP the graph is the same every step")
    broadcast_buffers: bool = _opt(True, "broadcast buffers (BatchNorm stats) every forward; Horovod never does")
    find_unused_parameters: bool = _opt(False, "search the graph for parameters that got no gradient")


@dataclass
class HorovodConfig:
    """Knobs of horovod.torch (defaults are Horovod 0.28's)."""

    fusion_threshold_mb: float = _opt(128.0, "Horovod tensor-fusion buffer in MB (HOROVOD_FUSION_THRESHOLD)")
    cycle_time_ms: float = _opt(1.0, "Horovod background cycle time in ms (HOROVOD_CYCLE_TIME)")
    hvd_op: str = _opt("average", "Horovod reduction op", choices=("average", "adasum"))


@dataclass
class NoOptions:
    """A backend without knobs of its own (`single`)."""


class InputError(ValueError):
    """Bad input caught before any work: one line naming the fix, exit code 2, no result files."""


SECTIONS: tuple[type, ...] = (RunConfig, DDPConfig, HorovodConfig)
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser, section: type) -> None:
    """Add one `--kebab-case` option per field of a config dataclass."""
    group = parser.add_argument_group(section.__name__, section.__doc__)
    for f in dataclasses.fields(section):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if f.type in ("bool", bool):
            action = argparse.BooleanOptionalAction if f.default else "store_true"
            group.add_argument(flag, action=action, default=f.default, help=help_text)
            continue
        kind = {"int": int, "int | None": int, "float": float, "float | None": float}.get(str(f.type), str)
        group.add_argument(
            flag,
            type=kind,
            default=f.default,
            help=f"{help_text} (default: {f.default})",
            choices=f.metadata.get("choices"),
        )


def from_namespace(section: type[T], args: argparse.Namespace) -> T:
    return section(**{f.name: getattr(args, f.name) for f in dataclasses.fields(section)})


def to_argv(section_obj: Any) -> list[str]:
    """The CLI options that reproduce a config object (used by `compare` to pass options through)."""
    argv: list[str] = []
    for f in dataclasses.fields(section_obj):
        value = getattr(section_obj, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            if value != f.default:
                argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None and value != f.default:
            argv += [flag, str(value)]
    return argv
