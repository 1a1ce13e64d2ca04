"""DeepSpeed: its engine (deepspeed.initialize) with ZeRO stage 0-3, over the torch.distributed group DDP joins.

The engine owns the step: `engine.backward(loss)` reduces the gradients (stage 0-1: allreduce; 2: reduce-scatter;
3: reduce-scatter of gradients whose parameters it gathers per layer), `engine.step()` clips them when the config
says (gradient_clipping: --clip-grad-norm), steps and zeroes them. fp32 and autocast (--amp bf16: the trainer's
torch.autocast around forward, parameters and gradients in fp32) are as under the other backends; what
DeepSpeed would do its own way (its fp16 with its own scaler and fp16 parameters, compile, accumulation) is
refused in one line (`check_run`). On CPU DeepSpeed's comm builds a shared-memory op at start (a C++ build of
about 25 s): `check_run` builds it first (compare: on its own machine, before any job), cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from backends.ddp import DDPBackend, join_process_group
from benchmarks import launch
from benchmarks.config import DeepSpeedConfig, RunConfig
from benchmarks.errors import RANK0_GRACE_S, InputError

INSTALL_FIX = "make setup, or pip install deepspeed==0.19.8"


def import_deepspeed(device_type: str) -> Any:
    """deepspeed, its accelerator chosen first (it reads DS_ACCELERATOR at import: cpu here, unless set)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device_type == "cuda" else "cpu")
    import deepspeed

    return deepspeed


def build_log() -> Path:
    """This process's log of a failed op build: its own, as every rank of a `run` tries the build in turn."""
    return Path(tempfile.gettempdir()) / f"distbench-deepspeed-op-build-{os.getuid()}-{os.getpid()}.log"


@contextlib.contextmanager
def one_build_at_a_time() -> Iterator[None]:
    """This machine's processes load the op in turn. Under torch's own lock a rank that waits on another's build
    then imports a library that a failed build never made: its error would be "cannot open shared object", not the
    compiler's. In turn, each finds the op built (ninja: nothing to do) or tries the build and fails with its own."""
    path = Path(tempfile.gettempdir()) / f"distbench-deepspeed-op-{os.getuid()}.lock"
    lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel too, should this process die holding it
        yield
    finally:
        os.close(lock)


@functools.cache
def build_op(device_type: str) -> str | None:
    """DeepSpeed's shared-memory op, which its comm loads at start on CPU: built here (or found built, in torch's
    extension cache or in DeepSpeed's install) before this machine's ranks start; the start-up line saying so, None
    where DeepSpeed builds nothing."""
    ds = import_deepspeed(device_type)
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not ds.ops.__compatible_ops__.get(builder.NAME, False):
        return None
    started, log = time.time(), build_log()
    # torch's warnings about the compiler go to the build's log with its error, not into the start-up lines.
    torch_log, to_file = logging.getLogger("torch.utils.cpp_extension"), logging.FileHandler(log, delay=True)
    try:
        torch_log.addHandler(to_file)
        torch_log.propagate = False
        with one_build_at_a_time():
            started = time.time()  # once this process's turn comes: another's build is not "built" by this one
            module = builder.load(verbose=False)
    except Exception as exc:  # torch's build error carries the compiler's output: kept in the log, not the line
        log.write_text(f"{type(exc).__name__}: {exc}\n")
        said = str(exc).split(": [")[0].splitlines()[0] if str(exc) else type(exc).__name__
        failed = InputError(
            f"DeepSpeed's shared-memory op ({builder.NAME}) did not build ({said}): see {log}; it needs a C++ "
            "compiler and ninja (apt install g++, or set CXX)"
        )
        # Rank 0 may take its turn after every other rank of this machine, each about as long as this one's.
        failed.rank0_grace_s = RANK0_GRACE_S + (time.time() - started) * launch.detect_or_plain().local_world_size
        raise failed from None
    finally:
        torch_log.removeHandler(to_file)
        torch_log.propagate = True
        to_file.close()
    made = Path(module.__file__)
    how = f"built in {time.time() - started:.0f} s" if made.stat().st_mtime >= started else "found built"
    return f"deepspeed: its shared-memory op {how}, cached for every run on this machine ({made.parent})"


MASTER_COPIES = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
"""ZeRO's optimizer's fp32 copies of its partition of the parameters (stage 1-2, stage 3), which it steps."""


class DeepSpeedBackend(DDPBackend):
    name = "deepspeed"
    options: DeepSpeedConfig  # type: ignore[assignment]

    @classmethod
    def check_run(cls, cfg: RunConfig, options: Any) -> str | None:
        try:  # imported here, where the run's device is known: DeepSpeed fixes its accelerator at import
            import_deepspeed(cfg.device)
        except Exception as exc:  # absent, or an install that cannot import (its message says why)
            raise InputError(f"DeepSpeed is not installed ({type(exc).__name__}: {exc}); {INSTALL_FIX}") from None
        refused = {
            "--amp fp16": cfg.amp == "fp16",  # its fp16 keeps fp16 parameters and a loss scaler of its own
            "--compile": cfg.compile == "on",
            "--accumulate above 1": cfg.accumulate > 1,  # its engine counts micro-batches in step() itself
            "--fp16-allreduce": cfg.fp16_allreduce,
        }
        said = [flag for flag, given in refused.items() if given]
        if said:
            raise InputError(
                f"backend deepspeed does not take {', '.join(said)} here (DeepSpeed does it its own way, which would "
                "not be the same step as the other backends'); leave it out for deepspeed"
            )
        return build_op(cfg.device)  # after the refusals: bad input is said before a build of 25 s

    def init(self) -> None:
        # ZeRO-3 calls torch's all_gather_into_tensor and reduce_scatter_tensor, which this torch deprecates with a
        # FutureWarning at every call: thousands of lines a compare, about DeepSpeed's code, nothing a user can act on.
        warnings.filterwarnings(
            "ignore",
            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
            category=FutureWarning,
        )
        self.ds = import_deepspeed(self.run.device)
        for handler in logging.getLogger("DeepSpeed").handlers:  # its warnings: stdout holds the run directory only
            if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
                handler.setStream(sys.stderr)
        # DeepSpeed: the engine reads LOCAL_RANK (torchrun's) or Open MPI's own; srun and MPICH set neither.
        os.environ["LOCAL_RANK"] = str(self.launch.local_rank)  # this launch's, not one an outer launcher left
        self.dist_backend = "nccl" if self.run.device == "cuda" else "gloo"
        join_process_group(self, self.dist_backend)  # the engine uses it (dist_init_required=False)
        self.engine: Any = None

    def config(self) -> dict[str, Any]:
        """The DeepSpeed config as applied (run.json knobs.config)."""
        zero: dict[str, Any] = {"stage": self.options.zero_stage}
        for name in ("reduce_bucket_size", "allgather_bucket_size"):
            if getattr(self.options, name) is not None:
                zero[name] = getattr(self.options, name)
        if self.options.overlap_comm:
            zero["overlap_comm"] = True
        config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": self.run.batch_size,
            "gradient_accumulation_steps": 1,
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,  # SGD: DeepSpeed tests its own optimizers only
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        # DeepSpeed clips at a total norm of 1.0 unless told (GRADIENT_CLIPPING_DEFAULT): unclipped, as the others
        # are, unless --clip-grad-norm says. 0 turns its clipping off.
        config["gradient_clipping"] = self.run.clip_grad_norm if self.run.clip_grad_norm is not None else 0.0
        return config

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        # DeepSpeed: the engine broadcasts rank 0's parameters and wraps the optimizer (ZeRO's, from stage 1).
        # Its start draws random numbers; the training's stream (dropout's masks) must be the others'.
        # Its comm prints "... built successfully" on every rank's stdout, which holds only the run directory:
        # check_run's line says it once. Whatever else it prints goes to stderr.
        printed = io.StringIO()
        try:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                with contextlib.redirect_stdout(printed):
                    self.engine, ds_optimizer, _, _ = self.ds.initialize(
                        model=model, optimizer=optimizer, config=self.config(), dist_init_required=False
                    )
        finally:
            rest = [line for line in printed.getvalue().splitlines() if not line.endswith(" built successfully")]
            if rest:
                print("\n".join(rest), file=sys.stderr, flush=True)
        return self.engine, ds_optimizer

    # --- the step: the engine's ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
        self.engine.backward(loss)  # DeepSpeed: reduces (or reduce-scatters) the gradients as they are ready

    def optimizer_step(self, model: nn.Module, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        self.engine.step()  # DeepSpeed: clips (gradient_clipping), steps and zeroes the gradients

    @contextlib.contextmanager
    def accumulation(self, model: nn.Module, last_micro_batch: bool) -> Iterator[None]:
        yield  # one micro-batch a step (check_run): every backward is the engine's last

    # --- copies and validation -------------------------------------------------------------------
    def _gathered(self) -> contextlib.AbstractContextManager[Any]:
        """Stage 3: every parameter whole on every rank, for as long as the context lasts (a collective)."""
        if self.options.zero_stage < 3:
            return contextlib.nullcontext()
        return self.ds.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None)

    @contextlib.contextmanager
    def evaluation(self, model: nn.Module) -> Iterator[None]:
        # Stage 3 gathers each layer's parameters in forward, a collective: gathered once here, ranks may run
        # different numbers of validation forwards.
        with self._gathered():
            yield

    def full_copy(self, model: nn.Module, build_model: Callable[[], nn.Module]) -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # training's random stream is not drawn from
            fresh = build_model().to(self.device)
        with self._gathered(), torch.no_grad():
            own = dict(self.engine.module.named_parameters())
            for name, param in fresh.named_parameters():
                param.copy_(own[name].detach())
            buffers = dict(self.engine.module.named_buffers())
            for name, buffer in fresh.named_buffers():
                buffer.copy_(buffers[name])
        return fresh

    # --- record ----------------------------------------------------------------------------------
    def held_state(self) -> dict[str, int] | None:
        """The training state this rank holds as ZeRO partitions it: parameters (stage 3), gradients (stage
        2-3) and optimizer state (stage 1-3) a 1/W share each, the rest whole. ZeRO's optimizer state includes
        its fp32 master copy of the partition's parameters, which it keeps even when training in fp32."""
        stage, world = self.options.zero_stage, self.world_size
        params = list(self.engine.module.parameters())
        full = sum(_numel(p) * p.element_size() for p in params)
        trainable = sum(_numel(p) * p.element_size() for p in params if p.requires_grad)
        state = [v for s in self.engine.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        for name in MASTER_COPIES:  # stage 1-2's, stage 3's: a flat partition per parameter group
            state += getattr(self.engine.optimizer, name, None) or []
        state_bytes = sum(v.numel() * v.element_size() for v in state)
        return {
            "param_bytes": full // world if stage >= 3 else full,
            "param_bytes_full": full,
            "grad_bytes": trainable // world if stage >= 2 else trainable,
            "grad_bytes_full": trainable,
            "optimizer_state_bytes": state_bytes,
            "optimizer_state_bytes_full": state_bytes * world if stage >= 1 else state_bytes,
        }

    def describe(self) -> dict[str, Any]:
        zero = self.engine.zero_optimization() if self.engine is not None else None
        # The projection's DDP schedule reads a bucket in MB: ZeRO's reduce bucket (elements of fp32 gradients);
        # stage 0 allreduces every gradient after backward, in DeepSpeed's own buckets of the same size.
        elements = self.engine.zero_reduce_bucket_size() if zero else 500_000_000
        bucket_mb = elements * 4 / 2**20
        return {
            "bucket_cap_mb": bucket_mb,
            "first_bucket_mb": bucket_mb,
            "accumulate": self.run.accumulate,
            "fp16_allreduce": self.run.fp16_allreduce,
            "dist_backend": self.dist_backend,
            "zero_stage": self.options.zero_stage,
            "reduce_bucket_size": self.engine.zero_reduce_bucket_size() if zero else None,
            "allgather_bucket_size": self.engine.zero_allgather_bucket_size() if zero else None,
            "overlap_comm": bool(self.engine.zero_overlap_comm()) if zero else False,
            # Stages 0-1 reduce after backward, stage 2 in backward's hooks, blocking it; overlap_comm (stages
            # 1-2) reduces in hooks on a stream of their own: a CUDA one, on CPU its streams do not run apart.
            "grads_overlap_backward": bool(
                zero and self.options.zero_stage <= 2 and self.engine.zero_overlap_comm() and self.device.type == "cuda"
            ),
            "schedule": "fsdp" if self.options.zero_stage >= 3 else "ddp",
            "allreduce_impl": f"torch-{self.dist_backend}" if self.options.zero_stage <= 1 else None,
            "config": self.config(),
            "deepspeed": self.ds.__version__,
        }


def _numel(param: torch.Tensor) -> int:
    """A parameter's whole size, also under stage 3, where the tensor left in the module is empty (ds_numel)."""
    return int(getattr(param, "ds_numel", param.numel()))
