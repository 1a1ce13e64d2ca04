"""The implementations of `distbench allreduce` behind one small interface (`Collective`), and the
patterns each rank fills its buffer with so every result can be checked exactly: torch.distributed (allreduce,
reduce-scatter, all-gather), Horovod and mpi4py (allreduce).

Imported by `benchmarks.run.collectives` (the sweep); never by the parser.
"""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import launch
from benchmarks.config import COLLECTIVES, AllreduceConfig
from benchmarks.errors import InputError
from benchmarks.launch import rendezvous

NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}
PERIOD = 3
"""Rank r puts 1 + (i + r) % 3 in element i: small integers, so every sum is exact in float16 up to 682
ranks, and an element reduced from the wrong place or the wrong ranks comes out wrong."""


def _pattern(rank: int, dtype: Any) -> np.ndarray:
    return np.array([1 + (j + rank) % PERIOD for j in range(PERIOD)], dtype=dtype)


def expected_sum(world_size: int, dtype: Any) -> np.ndarray:
    """The reduced value of element i is `expected_sum(...)[i % 3]`."""
    return sum((_pattern(r, np.float64) for r in range(world_size)), np.zeros(PERIOD)).astype(dtype)


def _tile(array: np.ndarray, base: np.ndarray) -> None:
    """array[i] = base[i % PERIOD] in place (no temporary the size of the buffer)."""
    whole = len(array) - len(array) % PERIOD
    array[:whole].reshape(-1, PERIOD)[:] = base
    array[whole:] = base[: len(array) - whole]


def _mismatch(array: np.ndarray, base: np.ndarray) -> int | None:
    """The first i where array[i] != base[i % PERIOD], or None."""
    whole = len(array) - len(array) % PERIOD
    bad = np.flatnonzero(array[:whole].reshape(-1, PERIOD) != base)
    if not len(bad):
        bad = np.flatnonzero(array[whole:] != base[: len(array) - whole]) + whole
    return int(bad[0]) if len(bad) else None


def fill_pattern(array: np.ndarray, rank: int) -> None:
    """Write this rank's summand pattern into a flat array in place (allreduce, reduce-scatter input)."""
    _tile(array, _pattern(rank, array.dtype))


def _shard_pattern(rank: int, dtype: Any) -> np.ndarray:
    return np.array([1 + PERIOD * rank + j for j in range(PERIOD)], dtype=dtype)


def fill_shard(array: np.ndarray, rank: int) -> None:
    """An all-gather's input: rank r's shard holds 1 + 3r + i % 3, so a shard from the wrong rank or put
    in the wrong place comes out wrong (at most 3 × ranks: exact in float16 where the sums are)."""
    _tile(array, _shard_pattern(rank, array.dtype))


def first_wrong(array: np.ndarray, world_size: int, offset: int = 0) -> tuple[int, float, float] | None:
    """(index, value, expected) of the first element that is not the exact sum, or None when all are.

    `offset`: the index of array[0] in the whole buffer (a reduce-scatter's shard); the index returned is
    in the whole buffer too."""
    expected = np.roll(expected_sum(world_size, array.dtype), -(offset % PERIOD))
    i = _mismatch(array, expected)
    return None if i is None else (offset + i, float(array[i]), float(expected[i % PERIOD]))


def first_wrong_gathered(array: np.ndarray, world_size: int) -> tuple[int, float, float] | None:
    """(index, value, expected) of the first element of an all-gather's output that is not rank k's
    shard in block k, or None when all are."""
    shard = len(array) // world_size
    for k in range(world_size):
        expected = _shard_pattern(k, array.dtype)
        i = _mismatch(array[k * shard : (k + 1) * shard], expected)
        if i is not None:
            return k * shard + i, float(array[k * shard + i]), float(expected[i % PERIOD])
    return None


def check(collective: str, output: np.ndarray, rank: int, world_size: int) -> tuple[int, float, float] | None:
    """The first wrong element of `rank`'s output of `collective` (filled as `Collective.buffers` says)."""
    if collective == "all_gather":
        return first_wrong_gathered(output, world_size)
    return first_wrong(output, world_size, rank * len(output) if collective == "reduce_scatter" else 0)


EXPECTED = {
    "allreduce": "the exact sum over {} ranks",
    "reduce_scatter": "this rank's shard of the exact sum over {} ranks",
    "all_gather": "rank k's shard in block k of {}",
}
"""What a checked output should hold, for the error line."""


class Collective:
    """One implementation: in-place SUM allreduce of a flat buffer, plus what the sweep needs around it."""

    name = ""
    controller = "none"
    """Horovod's controller (gloo or mpi); `none` for the others."""

    def __init__(self, info: launch.LaunchInfo, opts: AllreduceConfig) -> None:
        import torch

        self.info, self.opts = info, opts
        self.rank, self.world_size = info.rank, info.world_size
        self.device = torch.device("cuda", info.local_rank) if opts.device == "cuda" else torch.device("cpu")
        self.dtype = getattr(torch, opts.dtype)

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def buffer(self, elements: int) -> Any:
        import torch

        return torch.zeros(elements, dtype=self.dtype, device=self.device)

    def fill(self, buf: Any, rank: int, pattern: Callable[[np.ndarray, int], None] = fill_pattern) -> None:
        """`rank`'s check pattern (the timed iterations reduce the zeros a buffer starts with: sums stay 0)."""
        if buf.device.type == "cpu":
            return pattern(buf.numpy(), rank)
        host = np.empty(buf.numel(), NUMPY_DTYPES[self.opts.dtype])
        pattern(host, rank)
        buf.copy_(buf.new_tensor(host))

    def buffers(self, collective: str, elements: int) -> tuple[Any, Any]:
        """(input, output) of `collective` over a whole buffer of `elements`: the same buffer for allreduce;
        reduce-scatter's output is a separate shard (out of place, as FSDP2's); all-gather's input is this
        rank's block of its output (in place, as FSDP2's)."""
        if collective == "allreduce":
            buf = self.buffer(elements)
            return buf, buf
        shard = elements // self.world_size
        if collective == "reduce_scatter":
            return self.buffer(elements), self.buffer(shard)
        out = self.buffer(elements)
        return out[self.rank * shard : (self.rank + 1) * shard], out

    def call(self, collective: str, inp: Any, out: Any, size_bytes: int) -> Callable[[], object]:
        """`collective` bound into a call of no arguments (allreduce: `allreduce`'s)."""
        if collective != "allreduce":
            raise InputError(f"--collective {collective} is measured with --impl torch only")
        return self.allreduce(out, size_bytes)

    def host(self, buf: Any) -> np.ndarray:
        return buf.numpy() if buf.device.type == "cpu" else buf.cpu().numpy()

    def perturb(self, buf: Any) -> None:
        buf[0] += 1

    def allreduce(self, buf: Any, size_bytes: int) -> Callable[[], object]:
        """The in-place SUM allreduce of `buf`, bound into a call of no arguments: at a few microseconds a
        call, a method's lookups and dispatch in the timed loop would be measured as the library's."""
        raise NotImplementedError

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        raise NotImplementedError

    def allgather(self, obj: Any) -> list[Any]:
        raise NotImplementedError

    def knobs(self) -> dict[str, Any]:
        return {}


class TorchCollective(Collective):
    def start(self) -> None:
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.name = f"torch-{self.backend}"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        addr, port = rendezvous.endpoint(self.info)
        timeout = datetime.timedelta(seconds=self.opts.timeout)
        dist.init_process_group(
            self.backend,
            init_method=f"tcp://{addr}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )

    def stop(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()

    def allreduce(self, buf: Any, size_bytes: int) -> Callable[[], object]:
        return functools.partial(self.dist.all_reduce, buf, op=self.dist.ReduceOp.SUM)

    def _function(self, collective: str) -> Callable[..., object]:
        # torch 2.13 renamed reduce_scatter_tensor / all_gather_into_tensor to *_single, which FSDP2 calls;
        # an older torch has only the former names.
        new, old = {
            "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
            "all_gather": ("all_gather_single", "all_gather_into_tensor"),
        }.get(collective, ("all_reduce",) * 2)
        return getattr(self.dist, new, None) or getattr(self.dist, old)

    def call(self, collective: str, inp: Any, out: Any, size_bytes: int) -> Callable[[], object]:
        if collective == "reduce_scatter":
            return functools.partial(self._function(collective), out, inp, op=self.dist.ReduceOp.SUM)
        if collective == "all_gather":
            return functools.partial(self._function(collective), out, inp)
        return super().call(collective, inp, out, size_bytes)

    def barrier(self) -> None:
        self.dist.barrier()

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        return out

    def knobs(self) -> dict[str, Any]:
        name = self._function(self.opts.collective).__name__
        call = TORCH_CALLS[self.opts.collective].format(name)
        return {"process_group": self.backend, "call": f"torch.distributed.{call}"}


TORCH_CALLS = {
    "allreduce": "{}(tensor, op=SUM)",
    "reduce_scatter": "{}(shard, tensor, op=SUM)",
    "all_gather": "{}(tensor, this rank's block of tensor)",
}
assert set(TORCH_CALLS) == set(COLLECTIVES)

HOROVOD_KNOBS = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY")


class HorovodCollective(Collective):
    def start(self) -> None:
        from backends.horovod import import_horovod

        # Horovod: bound every wait by --timeout, as the training backend does.
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, int(self.opts.timeout)))
        try:
            self.hvd = hvd = import_horovod()
        except RuntimeError as exc:
            raise InputError(str(exc)) from exc
        hvd.init()
        if self.device.type == "cuda":
            import torch

            torch.cuda.set_device(self.device)
        if hvd.size() != self.world_size:
            raise RuntimeError(f"Horovod sees {hvd.size()} ranks but the launcher started {self.world_size}")
        self.controller = "gloo" if hvd.gloo_enabled() else "mpi"
        self.name = f"horovod-{self.controller}"

    def stop(self) -> None:
        self.hvd.shutdown()

    def allreduce(self, buf: Any, size_bytes: int) -> Callable[[], object]:
        # A fixed name per size, as a training loop's parameter names are: an unnamed call gets a fresh
        # name each time and would miss Horovod's response cache on every iteration.
        return functools.partial(self.hvd.allreduce_, buf, op=self.hvd.Sum, name=f"distbench.allreduce.{size_bytes}")

    def barrier(self) -> None:
        self.hvd.barrier()

    def allgather(self, obj: Any) -> list[Any]:
        return self.hvd.allgather_object(obj)

    def knobs(self) -> dict[str, Any]:
        set_by_user = {k: os.environ[k] for k in HOROVOD_KNOBS if k in os.environ}
        call = "hvd.allreduce_(tensor, op=hvd.Sum, name=<per size>)"
        return {"controller": self.controller, "call": call, "env": set_by_user or "Horovod's defaults"}


class MPI4pyCollective(Collective):
    name = "mpi4py"

    def start(self) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        if self.comm.size != self.world_size:
            raise RuntimeError(f"MPI sees {self.comm.size} ranks but the launcher started {self.world_size}")
        self.op, self.datatype = MPI.SUM, None
        if self.opts.dtype == "float16":
            # MPI has no half type: a 2-byte datatype and a numpy sum as a user op, what Horovod does in C.
            def half_sum(inbuf: Any, outbuf: Any, datatype: Any) -> None:
                out = np.frombuffer(outbuf, dtype=np.float16)
                np.add(out, np.frombuffer(inbuf, dtype=np.float16), out=out)

            self.op = MPI.Op.Create(half_sum, commute=True)
            self.datatype = MPI.BYTE.Create_contiguous(2).Commit()

    def buffer(self, elements: int) -> Any:
        return np.zeros(elements, dtype=NUMPY_DTYPES[self.opts.dtype])

    def fill(self, buf: Any, rank: int, pattern: Callable[[np.ndarray, int], None] = fill_pattern) -> None:
        pattern(buf, rank)

    def host(self, buf: Any) -> np.ndarray:
        return buf

    def allreduce(self, buf: Any, size_bytes: int) -> Callable[[], object]:
        if self.datatype is None:  # MPI's own SUM, Allreduce's default op
            return functools.partial(self.comm.Allreduce, self.MPI.IN_PLACE, buf)
        return functools.partial(self.comm.Allreduce, self.MPI.IN_PLACE, [buf, self.datatype], op=self.op)

    def synchronize(self) -> None: ...

    def barrier(self) -> None:
        self.comm.Barrier()

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def knobs(self) -> dict[str, Any]:
        op = "a numpy float16 sum as an MPI user op" if self.datatype is not None else "MPI.SUM"
        library = self.MPI.Get_library_version().splitlines()[0].strip()
        return {"call": f"comm.Allreduce(MPI.IN_PLACE, numpy array, op={op})", "mpi_library": library}


IMPLEMENTATIONS: dict[str, type[Collective]] = {
    "torch": TorchCollective,
    "horovod": HorovodCollective,
    "mpi4py": MPI4pyCollective,
}
