"""Horovod: horovod.torch with DistributedOptimizer. Imported lazily; nothing else imports horovod."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from backends import horovod_autotune
from backends.base import Backend, ReduceOp
from benchmarks import launch
from benchmarks.config import HorovodConfig
from benchmarks.errors import InputError

KNOB_VARIABLES = {"fusion_threshold_mb": "HOROVOD_FUSION_THRESHOLD", "cycle_time_ms": "HOROVOD_CYCLE_TIME"}
INSTALL_HINT = "Horovod is not installed with PyTorch support; run `make setup` or docker/install-horovod.sh"


def import_horovod() -> Any:
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise RuntimeError(f"{INSTALL_HINT} ({exc})") from exc
    return hvd


class HorovodBackend(Backend[HorovodConfig]):
    name = "horovod"
    launchers = (launch.HOROVODRUN, launch.MPIRUN, launch.SRUN_MPI, launch.PYTHON)

    @classmethod
    def check_available(cls) -> None:
        try:
            import_horovod()
        except RuntimeError as exc:
            raise InputError(str(exc)) from exc

    def init(self) -> None:
        # Horovod: knobs are read from the environment at hvd.init(). Never a value the user did not choose: an
        # exported variable became the option's value, or contradicted a given option and was refused
        # (benchmarks.environment.adopt_for_run, before any process group).
        # Horovod: under the autotuner a knob it is given is held constant, left out of its search; so only a
        # value moved from its default (given, or exported and adopted) is given then, or one exported as is.
        self.held = [
            k
            for k, var in KNOB_VARIABLES.items()
            if not self.options.autotune or os.environ.get(var) or getattr(self.options, k) != getattr(HorovodConfig, k)
        ]
        if "fusion_threshold_mb" in self.held:
            os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(self.options.fusion_threshold_mb * 1024 * 1024))
        if "cycle_time_ms" in self.held:
            os.environ["HOROVOD_CYCLE_TIME"] = str(self.options.cycle_time_ms)
        self.autotune_log: Path | None = None
        if self.options.autotune:
            os.environ["HOROVOD_AUTOTUNE"] = "1"
            # Horovod: the coordinator (rank 0) writes the log; the run directory is named only after init, so
            # it goes to a temporary file first (or where the user's HOROVOD_AUTOTUNE_LOG says) and is copied
            # into the run directory once trained (settled).
            if not os.environ.get("HOROVOD_AUTOTUNE_LOG"):
                handle, name = tempfile.mkstemp(prefix="distbench-autotune-", suffix=".csv")
                os.close(handle)
                os.environ["HOROVOD_AUTOTUNE_LOG"] = name
            self.autotune_log = Path(os.environ["HOROVOD_AUTOTUNE_LOG"])
        # Horovod: bound every wait by --timeout; a stalled rank ends the job instead of warning forever. A
        # value the user exported is kept (and recorded in run.json environment).
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, int(self.run.timeout))))
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, int(self.run.timeout / 2))))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(max(2, int(self.run.timeout))))
        if self.run.trace:
            os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # Horovod: allow hvd.start_timeline after init
        self.hvd_module = hvd = import_horovod()
        hvd.init()  # Horovod: join the job (gloo or MPI controller, whichever the launcher set up)
        if self.run.device == "cuda":
            torch.cuda.set_device(hvd.local_rank())  # Horovod: one GPU per local rank
            self.device = torch.device("cuda", hvd.local_rank())
        if hvd.size() != self.launch.world_size:
            raise RuntimeError(f"Horovod sees {hvd.size()} ranks but the launcher started {self.launch.world_size}")

    def shutdown(self) -> None:
        self.hvd_module.shutdown()
        log = getattr(self, "autotune_log", None)
        if log is not None and log.name.startswith("distbench-autotune-"):
            log.unlink(missing_ok=True)  # ours, in the temporary directory; the run has its copy

    def settled(self, run_dir: Path) -> dict[str, Any]:
        """Rank 0, after training: the autotuner's log copied into the run directory, and what it settled on."""
        if getattr(self, "autotune_log", None) is None:
            return {}
        copy = run_dir / horovod_autotune.LOG_NAME
        with contextlib.suppress(OSError):
            shutil.copyfile(self.autotune_log, copy)
        plan = horovod_autotune.plan(os.environ, horovod_autotune.gpu_build())
        return {"autotuned": horovod_autotune.read_log(copy, plan.scores)}

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        hvd = self.hvd_module
        # Horovod: start every rank from rank 0's weights (buffers included) and optimizer state.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # Horovod: broadcast_optimizer_state first fills an empty state by stepping with zero gradients,
        # which moves AdamW's weights (decay) and step count; a fresh optimizer is equal everywhere anyway.
        if optimizer.state_dict()["state"]:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        # Horovod: wrap the optimizer; gradients are averaged after `accumulate` backward passes.
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if self.run.fp16_allreduce else hvd.Compression.none,
            op=hvd.Adasum if self.options.hvd_op == "adasum" else hvd.Average,
            backward_passes_per_step=self.run.accumulate,
        )
        return model, wrapped

    def optimizer_step(self, model: nn.Module, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is None and self.run.clip_grad_norm is None:
            optimizer.step()  # Horovod: step() waits for the gradients' reductions itself
            optimizer.zero_grad()
            return
        # Horovod: gradients are read (unscaled, clipped) only once reduced: synchronize() waits for them, and the
        # step that follows must not wait again (skip_synchronize), Horovod's documented recipe.
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            super().optimizer_step(model, optimizer, scaler)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        hvd = self.hvd_module
        hvd_op = {"sum": hvd.Sum, "mean": hvd.Average, "max": hvd.Max}[op]
        return hvd.allreduce(tensor, op=hvd_op)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self.hvd_module.allgather_object(obj)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return self.hvd_module.broadcast_object(obj, root_rank=src)

    def barrier(self) -> None:
        self.hvd_module.barrier()

    @contextlib.contextmanager
    def trace(self, directory: Path | None) -> Iterator[dict[str, Any]]:
        """Horovod's own timeline (Chrome trace format) of every rank's collectives, written by rank 0."""
        hvd = self.hvd_module
        found: dict[str, Any] = {"tracer": "horovod timeline", "files": []}
        if directory is not None:
            directory.mkdir(exist_ok=True)
        path = directory / "horovod_timeline.json" if directory is not None else None
        # Horovod: every rank starts and stops the timeline; only the coordinator (rank 0) writes it.
        hvd.start_timeline(str(path) if path is not None else os.devnull)
        try:
            yield found
        finally:
            hvd.stop_timeline()
        if path is not None:
            found["files"].append(f"{directory.name}/{path.name}")

    def describe(self) -> dict[str, Any]:
        hvd = self.hvd_module
        return {
            **super().describe(),
            # Under the autotuner a knob not held is its to choose: knobs.autotuned says what it chose.
            **{k: getattr(self.options, k) if k in self.held else "autotuned" for k in KNOB_VARIABLES},
            "compression": "fp16" if self.run.fp16_allreduce else "none",
            "op": self.options.hvd_op,
            "controller": "gloo" if hvd.gloo_enabled() else "mpi",
            "broadcast_buffers": False,  # Horovod: buffers are broadcast once at start, never per step
            **({"autotune": self._autotune_plan()} if self.options.autotune else {}),
        }

    def _autotune_plan(self) -> dict[str, Any]:
        plan = horovod_autotune.plan(os.environ, bool(self.hvd_module.nccl_built() or self.hvd_module.ddl_built()))
        return {
            "held": self.held,
            "tuned": [k for k in KNOB_VARIABLES if k not in self.held] + list(plan.tunable),
            "settled_within_steps": plan.steps,
            "derivation": plan.derivation(),
        }
