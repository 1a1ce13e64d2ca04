"""Backends by name, each declared once: a `Declared` says everything the rest of distbench needs of a backend
(its variants and the launchers they run under, its options section, tune's grid for it, the allreduce that
explains its communication, the projection's schedule for it) and where its `Backend` class is. Variant names,
`--backends`, bare names, tune, why, project, the option tables and `doctor` are derived from the declarations.

Importing this package imports no framework (not even torch), so the command line can list and check backend
names before any heavy import; `get` imports the class asked for. A backend of one's own is declared from its
own module with `register`, the module named in DISTBENCH_BACKENDS (comma-separated; every distbench process,
ranks included, imports those modules when it imports this package). docs/development.md, "Adding a backend".
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from benchmarks import config, launch
from benchmarks.launch.variants import Variant

if TYPE_CHECKING:
    from backends.base import Backend

PLUGINS_ENV = "DISTBENCH_BACKENDS"


@dataclass(frozen=True)
class Declared:
    name: str
    """`--backend NAME`, run.json `backend`."""
    cls: str
    """`module:Class` of its Backend, imported only by `get`."""
    variants: tuple[Variant, ...]
    """How compare launches it: the first is what the bare name means; for `--launcher L`, the first under L."""
    options: type = config.NoOptions
    """Its options section: a dataclass whose fields are `run`'s flags (config.DDPConfig's kind)."""
    tune_grid: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    """tune's default grid: its own options' fields, each with the values to sweep."""
    allreduce: str | None = None
    """The `distbench allreduce` implementation that carries its gradient reduction, over run.json `knobs`
    (`torch-{dist_backend}`): the report's "why" says what that allreduce costs alone; None where its gradients
    are not allreduced (FSDP2 reduce-scatters)."""
    schedule: str | None = None
    """The projection's schedule for it (benchmarks.analysis.schedule: `ddp`, `horovod`, `fsdp`), over run.json
    `knobs` as `allreduce` is (a backend whose schedule depends on its options records it); None: not projected."""
    threads: str = ""
    """What shares the cores with its compute, for the report's "why" ('' for nothing of its own)."""
    one_process: bool = False
    """Always one process, whatever --nproc or launcher the others get."""
    collectives: str | None = None
    """The `distbench allreduce` implementation whose fitted costs the projection gives its collectives
    (all-gather, reduce-scatter), over `knobs`; None: `allreduce`'s."""

    def allreduce_of(self, knobs: Mapping[str, Any]) -> str | None:
        """`allreduce` filled from a run's knobs (gloo where the run recorded no process-group backend)."""
        return _filled(self.allreduce, knobs)

    def schedule_of(self, knobs: Mapping[str, Any]) -> str | None:
        return _filled(self.schedule, knobs)

    def collectives_of(self, knobs: Mapping[str, Any]) -> str | None:
        return _filled(self.collectives, knobs) or self.allreduce_of(knobs)


def _filled(template: str | None, knobs: Mapping[str, Any]) -> str | None:
    """`template` with a run's knobs in it; None where it is None or names a knob the run did not record."""
    if template is None:
        return None
    values = {"dist_backend": "gloo", **{k: v for k, v in knobs.items() if v}}
    try:
        return template.format(**values)
    except KeyError:
        return None


def _variant(backend: str, launcher: str, controller: str = "", name: str = "") -> Variant:
    return Variant(name or f"{backend}@{launcher}", backend, launcher, controller)


DECLARED: dict[str, Declared] = {}


def _derive() -> None:
    """The names every other module reads, from the declarations (again after each `register`)."""
    global NAMES, ONE_PROCESS, KNOWN, BY_NAME
    NAMES = tuple(DECLARED)
    ONE_PROCESS = frozenset(d.name for d in DECLARED.values() if d.one_process)
    KNOWN = tuple(v for d in DECLARED.values() for v in d.variants)
    BY_NAME = {v.name: v for v in KNOWN}


NAMES: tuple[str, ...] = ()
ONE_PROCESS: frozenset[str] = frozenset()
"""Backends that always run as one process, whatever --nproc or launcher the others get."""
KNOWN: tuple[Variant, ...] = ()
"""Every variant compare can launch, `BACKEND@LAUNCHER` (horovod's named by its controller)."""
BY_NAME: dict[str, Variant] = {}


def register(declared: Declared) -> None:
    """Declare a backend (a name declared again is replaced: a module imported twice declares the same)."""
    DECLARED[declared.name] = declared
    if declared.options is not config.NoOptions and declared.options not in config.SECTIONS:
        config.SECTIONS = (*config.SECTIONS, declared.options)
    _derive()


register(
    Declared(
        "ddp",
        "backends.ddp:DDPBackend",
        tuple(_variant("ddp", lau) for lau in (launch.TORCHRUN, launch.MPIRUN, launch.SRUN)),
        config.DDPConfig,
        {"bucket_cap_mb": [1.0, 5.0, 25.0, 100.0], "gradient_as_bucket_view": [False, True]},
        "torch-{dist_backend}",
        "ddp",
        "gloo's and DDP's reducer threads",
    )
)
register(
    Declared(
        "horovod",
        "backends.horovod:HorovodBackend",
        (
            _variant("horovod", launch.HOROVODRUN, "gloo", "horovod@gloo"),
            _variant("horovod", launch.HOROVODRUN, "mpi", "horovod@mpi"),
            _variant("horovod", launch.MPIRUN, "mpi"),
            _variant("horovod", launch.SRUN, "mpi"),
        ),
        config.HorovodConfig,
        {"fusion_threshold_mb": [0.0, 1.0, 32.0, 128.0], "cycle_time_ms": [0.5, 1.0, 5.0]},
        "horovod-{controller}",
        "horovod",
        "Horovod's background thread",
    )
)
register(
    Declared(
        "fsdp",
        "backends.fsdp:FSDPBackend",
        tuple(_variant("fsdp", lau) for lau in (launch.TORCHRUN, launch.MPIRUN, launch.SRUN)),
        config.FSDPConfig,
        {},
        None,
        "fsdp",
        "FSDP2's own work per step (its hooks, copies and DTensor optimizer) and gloo's threads",
        collectives="torch-{dist_backend}",
    )
)
register(
    Declared(
        "deepspeed",
        "backends.deepspeed:DeepSpeedBackend",
        tuple(_variant("deepspeed", lau) for lau in (launch.TORCHRUN, launch.MPIRUN, launch.SRUN)),
        config.DeepSpeedConfig,
        {"zero_stage": [0, 1, 2, 3]},  # the stage decides its collectives; its buckets apply from stage 1
        "{allreduce_impl}",  # stage 0-1 allreduce the gradients; 2-3 reduce-scatter them (run.json knobs)
        "{schedule}",  # stage 0-2: gradients bucketed as DDP's; 3: per-layer gathers as FSDP2's (run.json knobs)
        "DeepSpeed's engine work per step (its hooks and bucket copies) and gloo's threads",
        collectives="torch-{dist_backend}",
    )
)
register(
    Declared("single", "backends.single:SingleBackend", (Variant("single", "single", launch.PYTHON),), one_process=True)
)


def declared(name: str) -> Declared:
    if name not in DECLARED:
        raise ValueError(f"unknown backend '{name}'; known: {', '.join(NAMES)}")
    return DECLARED[name]


def get(name: str) -> type[Backend]:
    """The Backend class declared under `name` (imports torch and its framework's module)."""
    module, _, cls = declared(name).cls.partition(":")
    return getattr(importlib.import_module(module), cls)


def label(backend: str, launcher: str, controller: str = "") -> str:
    """The variant a run belongs to, from what its run.json recorded; `backend@launcher` for a launch
    compare does not make (ddp under horovodrun --mpi, horovod under plain python)."""
    for v in KNOWN:
        if (v.backend, v.launcher) == (backend, launcher) and (v.controller or "") == (controller or ""):
            return v.name
    return backend if backend in ONE_PROCESS else f"{backend}@{launcher or '?'}"


def options_of(name: str) -> type:
    return declared(name).options


def _load_plugins() -> None:
    """Import the modules DISTBENCH_BACKENDS names (each calls `register`), from the working directory as
    `--workload module:factory` finds its module; one that fails ends the process with one line, exit 2."""
    names = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    if names and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a user's module may fail in any way: say which, and what to fix
            print(
                f"distbench: error: {PLUGINS_ENV} names {name}, which cannot be imported ({type(exc).__name__}: "
                f"{exc}); fix the module or the variable",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2) from exc


_load_plugins()

__all__ = ["BY_NAME", "KNOWN", "NAMES", "ONE_PROCESS", "Backend", "Declared", "declared", "get", "label", "register"]


def __getattr__(name: str) -> Any:
    # `from backends import Backend` keeps working without making every import of the package pay for torch.
    if name == "Backend":
        return importlib.import_module("backends.base").Backend
    raise AttributeError(f"module 'backends' has no attribute {name!r}")
