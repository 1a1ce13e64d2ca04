"""Native PyTorch, sharded: FSDP2 (`torch.distributed.fsdp.fully_shard`), which shards parameters, gradients
and optimizer state over the ranks (ZeRO-3): each unit's parameters are all-gathered before its forward (and
again before its backward when resharded after forward), its gradients reduce-scattered after backward.

The process group, its rendezvous under every launcher and the harness's collectives are DDP's.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from backends import step
from backends.ddp import DDPBackend, join_process_group
from benchmarks.config import FSDPConfig
from benchmarks.errors import InputError

EAGER = "_distbench_eager_forward"
"""A compiled unit's own forward, which validation runs (FSDPBackend.compile, evaluation)."""


def _own_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _self_contained(model: nn.Module) -> Callable[[str], bool]:
    """Whether a module's parameters belong to it alone: FSDP2 puts a parameter in exactly one unit, so one
    shared with a module outside (GPT-2's tied embedding and head) must stay with a unit holding both."""
    owners: dict[int, set[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param in module._parameters.values():
            if param is not None:
                owners.setdefault(id(param), set()).add(name)

    def inside(name: str, owner: str) -> bool:
        return owner == name or owner.startswith(name + ".")

    def check(name: str) -> bool:
        module = model.get_submodule(name)
        return all(all(inside(name, o) for o in owners[id(p)]) for p in module.parameters())

    return check


def units_of(model: nn.Module, policy: str, min_params: int) -> list[str]:
    """The names of the modules that become units under `policy` (docs: FSDPConfig.fsdp_units), bottom-up
    (a unit after every unit inside it), the root left out: it is always the last unit. Blocks are the
    children of the outermost nn.ModuleList/nn.Sequential containers."""
    alone = _self_contained(model)
    modules = list(model.named_modules())
    if policy in ("blocks", "auto"):
        # The outermost blocks only: a transformer layer is one unit, not also its MLP's Sequential inside.
        chosen = [name for name in step.outer_blocks(model) if alone(name)]
        if chosen or policy == "blocks":
            order = {name: i for i, (name, _) in enumerate(modules)}
            return sorted(chosen, key=lambda n: -order[n])
    if policy in ("leaves", "auto"):
        leaves = [name for name, m in modules if name and not list(m.children()) and _own_parameters(m) >= min_params]
        return [name for name in reversed(leaves) if alone(name)]
    return []


def check_units(model: nn.Module, options: FSDPConfig) -> list[str]:
    """The units, or InputError when an explicit policy names none (auto and root never do)."""
    units = units_of(model, options.fsdp_units, options.fsdp_min_params)
    if not units and options.fsdp_units == "blocks":
        raise InputError(
            "--fsdp-units blocks names no module of this model (no child of an nn.ModuleList or nn.Sequential "
            "holds parameters of its own alone); choose leaves, root or auto"
        )
    if not units and options.fsdp_units == "leaves":
        raise InputError(
            f"--fsdp-units leaves names no module of this model (no leaf module holds --fsdp-min-params "
            f"{options.fsdp_min_params} parameters or more alone); lower --fsdp-min-params or choose root or auto"
        )
    return units


def shard_units(
    model: nn.Module, units: list[str], mesh: DeviceMesh, reshard: bool, policy: MixedPrecisionPolicy
) -> nn.Module:
    """`model` made FSDP2 units over `mesh`: each of `units` (bottom-up, as `units_of` names them), then the root."""
    for name in units:
        fully_shard(model.get_submodule(name), mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    # The root: FSDP2's default (None) keeps its parameters gathered after forward, since backward starts there.
    fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard else False, mp_policy=policy)
    return model


class FSDPBackend(DDPBackend):
    name = "fsdp"
    launchers = DDPBackend.launchers
    options: FSDPConfig  # type: ignore[assignment]

    @classmethod
    def check_model(cls, build_model: Callable[[], nn.Module], options: Any) -> None:
        check_units(step.structure(build_model), options)

    def init(self) -> None:
        # FSDP2 warns, at every forward, when a unit returns a view (a Linear over a 3-D input does): an in-place
        # op on that output would skip its pre-backward gather. The trainer only reads the output (loss, detach),
        # never changes it in place, and the loss agreement shows the gradients agree: nothing for a user to act on
        # (docs/commands.md, FSDP2), and said by every rank of every run it would bury the compare's own lines.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
        self.dist_backend = "nccl" if self.run.device == "cuda" else "gloo"
        join_process_group(self, self.dist_backend)
        self.mesh = init_device_mesh(self.device.type, (self.launch.world_size,))
        self.units: list[str] = []
        self.alone: DeviceMesh | None = None
        """This rank alone, the compute baseline's mesh (made when first needed)."""

    def mixed_precision(self) -> MixedPrecisionPolicy:
        # FSDP2: --fp16-allreduce reduce-scatters the gradients in fp16 (DDP's fp16_compress_hook, Horovod's
        # Compression.fp16); parameters and compute keep their dtype, so the step's arithmetic is unchanged.
        return MixedPrecisionPolicy(reduce_dtype=torch.float16 if self.run.fp16_allreduce else None)

    def shard(self, model: nn.Module) -> nn.Module:
        # Every rank starts from rank 0's weights and buffers, as DDP's construction makes it: FSDP2 shards
        # whatever each rank holds and synchronises nothing.
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        self.units = check_units(model, self.options)
        return shard_units(model, self.units, self.mesh, self.options.reshard_after_forward, self.mixed_precision())

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        # Sharded in `shard`; the optimizer was built on the shards (DTensors) and steps only this rank's.
        return model, optimizer

    @contextlib.contextmanager
    def accumulation(self, model: nn.Module, last_micro_batch: bool) -> Iterator[None]:
        assert isinstance(model, FSDPModule)
        # FSDP2: gradients of the inner micro-batches accumulate unsharded; the last one reduce-scatters them.
        model.set_requires_gradient_sync(last_micro_batch)
        yield

    def compile(self, model: nn.Module) -> nn.Module:
        # FSDP2: compiled per unit, its forward alone; the hooks that gather and reduce-scatter stay eager around
        # it, and the root's own layers (embedding, head) stay eager too, but for a root that is the only unit.
        names = self.units or [""]
        for name in names:
            unit = model.get_submodule(name)
            setattr(unit, EAGER, unit.forward)  # validation runs eager, as every other backend's does
            unit.forward = step.compile_fn(unit.forward, graphs=8 * len(names))
        return model

    def grad_scaler(self, model: nn.Module) -> torch.amp.GradScaler | None:
        # FSDP2: each rank sees only its gradient shards; the sharded scaler agrees on found-inf over the ranks of
        # the model's mesh (this rank alone for the compute baseline's copy).
        if self.run.amp != "fp16":
            return None
        mesh = next(p for p in model.parameters() if isinstance(p, DTensor)).device_mesh
        return ShardedGradScaler(self.device.type, process_group=mesh.get_group())

    def clip(self, model: nn.Module, max_norm: float) -> None:
        # FSDP2: the gradients are DTensor shards; the total norm of the whole model reduces each rank's part over
        # the mesh (full_tensor) before every shard is scaled by it.
        params = [p for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)

    @contextlib.contextmanager
    def evaluation(self, model: nn.Module) -> Iterator[None]:
        # FSDP2's forward all-gathers each unit: a collective every rank must join, but a validation's ranks
        # may make different numbers of passes (rank0: the others none). So every unit is gathered once, here,
        # and kept gathered through the passes (no reshard after forward), then resharded: no pass communicates.
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        compiled = {unit: unit.forward for unit in units if hasattr(unit, EAGER)}
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        for unit in compiled:  # --compile: validation is eager under every backend (no compile in its timing)
            unit.forward = getattr(unit, EAGER)
        try:
            yield
        finally:
            for unit, forward in compiled.items():
                unit.forward = forward
            for unit in units:
                keep = unit is model or not self.options.reshard_after_forward  # as `shard` set them
                unit.set_reshard_after_forward(not keep, recurse=False)
                unit.reshard()

    def full_copy(self, model: nn.Module, build_model: Callable[[], nn.Module]) -> nn.Module:
        # The full weights gathered once (off the clock) into a fresh, unsharded model of the same workload.
        state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
        with torch.random.fork_rng(devices=[]):  # building draws from the RNG; training's stream is left as it was
            plain = build_model().to(self.device)
        plain.load_state_dict(state)
        return plain

    baseline_is_plain = False

    def baseline_copy(self, model: nn.Module, build_model: Callable[[], nn.Module]) -> nn.Module:
        # FSDP2's own per-step work (its hooks, copies into and out of the gathered buffers, the optimizer on
        # DTensors) is compute as much as the model's (results/reference/2026-12-06-fsdp2-overhead): the baseline
        # keeps it by sharding the copy over a group of this rank alone, whose collectives cross no network.
        if self.alone is None:  # local synchronisation: no rank waits on another to make a group of itself
            group = dist.new_group([self.rank], use_local_synchronization=True)
            self.alone = DeviceMesh.from_group(group, self.device.type)
        plain = step.apply(self.full_copy(model, build_model), self.run)
        return shard_units(plain, self.units, self.alone, self.options.reshard_after_forward, self.mixed_precision())

    def describe(self) -> dict[str, Any]:
        return {
            "accumulate": self.run.accumulate,
            "fp16_allreduce": self.run.fp16_allreduce,
            "dist_backend": self.dist_backend,
            "fsdp_units": self.options.fsdp_units,
            "fsdp_min_params": self.options.fsdp_min_params,
            "reshard_after_forward": self.options.reshard_after_forward,
            "units": [*self.units, ""],  # module names, bottom-up; "" is the root
            "mixed_precision": {"param_dtype": None, "reduce_dtype": "float16" if self.run.fp16_allreduce else None},
            "broadcast_buffers": False,  # FSDP2: buffers are rank 0's at start and never synchronised by it
        }
