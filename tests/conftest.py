"""pytest's hooks and fixtures for the whole suite; the plain helpers tests import are in tests/helpers.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def horovod_available() -> None:
    try:
        import horovod.torch  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"Horovod is part of the set-up (make setup); it is missing: {exc}")
