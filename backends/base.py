"""The Backend interface: the small surface the harness needs from a distributed framework."""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn

from backends import step
from benchmarks.config import RunConfig
from benchmarks.launch import LaunchInfo

ReduceOp = Literal["sum", "mean", "max"]
Options = TypeVar("Options")


class Backend(step.Recipe, ABC, Generic[Options]):
    """One data-parallel framework. The harness never branches on which one it holds; its step (backward,
    unscaling, clipping, the optimizer step, compile, the loss scaler) is a step.Recipe its framework overrides."""

    name: ClassVar[str]
    launchers: ClassVar[tuple[str, ...]]
    """Launchers this backend can run under; anything else is refused before any work."""

    def __init__(self, run: RunConfig, options: Options, launch: LaunchInfo) -> None:
        self.run, self.options, self.launch = run, options, launch
        self.device = torch.device("cpu")

    @classmethod
    def check_available(cls) -> None:
        """Raise InputError, naming the fix, when the framework is not installed."""
        return None

    @classmethod
    def check_run(cls, cfg: RunConfig, options: Options) -> str | None:
        """Raise InputError for a run option this backend cannot apply as the others do (one line, before any
        process group), and do what each machine needs once before its ranks start (DeepSpeed builds an op);
        returns a start-up line saying what it did, or None. Most backends take every option and need nothing."""
        return None

    @classmethod
    def check_model(cls, build_model: Callable[[], nn.Module], options: Options) -> None:
        """Raise InputError when this backend's options cannot apply to the workload's model; called before
        any process group, so bad input never leaves a run directory. Most backends take any model."""
        return None

    # --- lifetime ------------------------------------------------------------------------------
    @abstractmethod
    def init(self) -> None:
        """Join the job (process group, hvd.init) and pick this rank's device."""

    @abstractmethod
    def shutdown(self) -> None: ...

    # --- topology --------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def local_rank(self) -> int:
        return self.launch.local_rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    # --- model and optimizer ---------------------------------------------------------------------
    def shard(self, model: nn.Module) -> nn.Module:
        """Called before the optimizer is built, so that a backend that shards the parameters (FSDP2) has the
        optimizer built on its shards; the others return the model as it is."""
        return model

    @abstractmethod
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """Wrap model and optimizer; all ranks start from rank 0's weights and optimizer state."""

    @contextlib.contextmanager
    def evaluation(self, model: nn.Module) -> Iterator[None]:
        """Around one rank's validation forward passes, whose number may differ between ranks (a strategy's
        uneven split, rank0's idle ranks): a backend whose forward is collective (FSDP2) gathers here instead."""
        yield

    def full_copy(self, model: nn.Module, build_model: Callable[[], nn.Module]) -> nn.Module:
        """A plain copy of the (unwrapped) model with its present weights, which steps without the backend: the
        compute baseline. A sharded model is gathered first, so this may communicate (never in a timed step)."""
        return copy.deepcopy(model)

    def baseline_copy(self, model: nn.Module, build_model: Callable[[], nn.Module]) -> nn.Module:
        """The model the compute baseline times: `full_copy`'s plain copy, unless the framework does work of its
        own per step with no network (FSDP2's hooks and copies), which a backend keeps here, alone."""
        return self.full_copy(model, build_model)

    baseline_is_plain: ClassVar[bool] = True
    """Whether `baseline_copy` is `full_copy`'s plain model, whose parameters take their gradients during backward:
    else the gradient-ready schedule is clocked on a plain copy of its own, and the baseline steps under
    `accumulation` as training does."""

    # --- collectives (never inside a timed step) ----------------------------------------------------
    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor: ...

    @abstractmethod
    def all_gather_object(self, obj: Any) -> list[Any]: ...

    @abstractmethod
    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...

    @abstractmethod
    def barrier(self) -> None: ...

    # --- record ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def trace(self, directory: Path | None) -> Iterator[dict[str, Any]]:
        """Trace the steps run inside. `directory` is given on rank 0 only, which writes the files and
        lists them (relative to the run directory) in the dict it yields.

        This default is torch.profiler's Chrome trace of rank 0; a framework with its own tracer overrides it.
        """
        found: dict[str, Any] = {"tracer": "torch.profiler", "files": []}
        if directory is None:
            yield found
            return
        from torch import profiler

        activities = [profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(profiler.ProfilerActivity.CUDA)
        with profiler.profile(activities=activities) as prof:
            yield found
        directory.mkdir(exist_ok=True)
        path = directory / "torch_profiler_rank0.json"
        prof.export_chrome_trace(str(path))
        found["files"].append(f"{directory.name}/{path.name}")

    def settled(self, run_dir: Path) -> dict[str, Any]:
        """Rank 0, after training: knobs the framework chose while it ran (Horovod's autotuner), for run.json."""
        return {}

    def held_state(self) -> dict[str, int] | None:
        """After training: the bytes of training state this rank holds (run.json memory.per_rank's HELD_FIELDS and
        their `_full` twins) where the framework keeps them outside the model's parameters and the optimizer's
        state (DeepSpeed's ZeRO partitions); None: counted from those."""
        return None

    def describe(self) -> dict[str, Any]:
        """Every knob in effect, for run.json."""
        return {"accumulate": self.run.accumulate, "fp16_allreduce": self.run.fp16_allreduce}
