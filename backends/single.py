"""No distribution at all (world size 1): the baseline for scaling and for correctness."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from backends.base import Backend, ReduceOp
from benchmarks import launch


class SingleBackend(Backend):
    name = "single"
    launchers = (launch.PYTHON, launch.TORCHRUN, launch.MPIRUN, launch.SRUN)

    def init(self) -> None:
        if self.launch.world_size != 1:
            raise launch.WrongLauncherError(
                f"backend 'single' runs one process, but {self.launch.launcher} started "
                f"{self.launch.world_size}; use --backend ddp or horovod, or launch one process"
            )
        self.device = torch.device(self.run.device)

    def shutdown(self) -> None:
        pass

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        return model, optimizer

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        return tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self) -> None:
        pass
