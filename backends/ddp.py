"""Native PyTorch: torch.distributed + DistributedDataParallel."""

from __future__ import annotations

import contextlib
import datetime
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from backends.base import Backend, ReduceOp
from benchmarks import launch
from benchmarks.config import DDPConfig
from benchmarks.launch import rendezvous

DEFAULT_BUCKET_MB, DEFAULT_FIRST_BUCKET_MB = 25.0, dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20
"""DDP's own bucket sizes when it is given no bucket_cap_mb (torch.distributed's default first bucket is 1 MiB)."""
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "mean": dist.ReduceOp.SUM}


def _buffer_sync_kwarg(enabled: bool) -> dict[str, bool]:
    # torch 2.13 renames broadcast_buffers to forward_sync_buffers (init sync is kept either way).
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": enabled}


def join_process_group(backend: Backend[Any], dist_backend: str) -> None:
    """Join the job's torch.distributed group (whatever launched it) and, on CUDA, take this local rank's GPU."""
    info = backend.launch
    addr, port = rendezvous.endpoint(info)
    if backend.run.device == "cuda":
        torch.cuda.set_device(info.local_rank)
        backend.device = torch.device("cuda", info.local_rank)
    dist.init_process_group(
        dist_backend,
        init_method=f"tcp://{addr}:{port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=backend.run.timeout),
    )


class DDPBackend(Backend[DDPConfig]):
    name = "ddp"
    launchers = (launch.TORCHRUN, launch.MPIRUN, launch.HOROVODRUN_MPI, launch.SRUN, launch.PYTHON)

    def init(self) -> None:
        self.dist_backend = self.options.dist_backend or ("nccl" if self.run.device == "cuda" else "gloo")
        join_process_group(self, self.dist_backend)

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        # DDP broadcasts rank 0's parameters and buffers at construction; the optimizer is plain.
        ddp_model = DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            **self._bucket_kwarg(),
            gradient_as_bucket_view=self.options.gradient_as_bucket_view,
            static_graph=self.options.static_graph,
            **_buffer_sync_kwarg(self.options.broadcast_buffers),
            find_unused_parameters=self.options.find_unused_parameters,
        )
        if self.run.fp16_allreduce:
            ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp_model, optimizer

    def _bucket_kwarg(self) -> dict[str, float]:
        # Only when given: DDP then caps its first bucket likewise, where its default starts with 1 MiB.
        return {} if self.options.bucket_cap_mb is None else {"bucket_cap_mb": self.options.bucket_cap_mb}

    @contextlib.contextmanager
    def accumulation(self, model: nn.Module, last_micro_batch: bool) -> Iterator[None]:
        assert isinstance(model, DistributedDataParallel)
        with contextlib.nullcontext() if last_micro_batch else model.no_sync():
            yield

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        dist.all_reduce(tensor, op=_OPS[op])
        return tensor / self.world_size if op == "mean" else tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "dist_backend": self.dist_backend,
            "bucket_cap_mb": self.options.bucket_cap_mb or DEFAULT_BUCKET_MB,
            "first_bucket_mb": self.options.bucket_cap_mb or DEFAULT_FIRST_BUCKET_MB,
            "bucket_cap_given": self.options.bucket_cap_mb is not None,
            "gradient_as_bucket_view": self.options.gradient_as_bucket_view,
            "static_graph": self.options.static_graph,
            "broadcast_buffers": self.options.broadcast_buffers,
            "find_unused_parameters": self.options.find_unused_parameters,
            "comm_hook": "fp16_compress_hook" if self.run.fp16_allreduce else None,
        }
