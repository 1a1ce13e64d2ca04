"""Backends by name. Importing this package imports no framework (not even torch), so the command
line can list and check backend names before any heavy import; `get` imports the one asked for."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.base import Backend

_MODULES = {
    "ddp": "backends.ddp:DDPBackend",
    "horovod": "backends.horovod:HorovodBackend",
    "fsdp": "backends.fsdp:FSDPBackend",
    "single": "backends.single:SingleBackend",
}
NAMES = tuple(_MODULES)
ONE_PROCESS = frozenset({"single"})
"""Backends that always run as one process, whatever --nproc or launcher the others get."""


def get(name: str) -> type[Backend]:
    """The Backend class registered under `name` (imports torch and, for horovod, nothing more yet)."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend '{name}'; known: {', '.join(NAMES)}")
    module, _, cls = _MODULES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def __getattr__(name: str) -> Any:
    # `from backends import Backend` keeps working without making every import of the package pay for torch.
    if name == "Backend":
        return importlib.import_module("backends.base").Backend
    raise AttributeError(f"module 'backends' has no attribute {name!r}")


__all__ = ["Backend", "NAMES", "get"]
