"""Backends by name. Each module imports its framework lazily, so a missing Horovod only matters
to the `horovod` backend."""

from __future__ import annotations

import importlib

from backends.base import Backend

_MODULES = {"ddp": "backends.ddp:DDPBackend", "horovod": "backends.horovod:HorovodBackend",
            "single": "backends.single:SingleBackend"}  # fmt: skip
NAMES = tuple(_MODULES)


def get(name: str) -> type[Backend]:
    """The Backend class registered under `name`."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend '{name}'; known: {', '.join(NAMES)}")
    module, _, cls = _MODULES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["Backend", "NAMES", "get"]
