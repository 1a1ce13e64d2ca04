"""pytest's hooks and fixtures for the whole suite; the plain helpers tests import are in tests/helpers.py."""

from __future__ import annotations

import pytest

# How many tests marked `full_matrix` a run's `-m` left out (pytest's own summary counts only "deselected").
_FULL_MATRIX_LEFT = pytest.StashKey[int]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("full_matrix") and "full_matrix" in (item.config.option.markexpr or ""):
            item.config.stash[_FULL_MATRIX_LEFT] = item.config.stash.get(_FULL_MATRIX_LEFT, 0) + 1


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Nothing is left out silently: `make test` says how many tests it left to `make test-all`."""
    if left := config.stash.get(_FULL_MATRIX_LEFT, 0):
        terminalreporter.write_line(f"{left} tests marked full_matrix were left to `make test-all`")


@pytest.fixture(scope="session")
def horovod_available() -> None:
    try:
        import horovod.torch  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"Horovod is part of the set-up (make setup); it is missing: {exc}")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A real one-node Slurm (tests/slurm_cluster.py) for the session; nothing of it is left running after."""
    from tests.slurm_cluster import SlurmCluster, missing

    if why := missing():
        pytest.skip(f"no test Slurm: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.leftovers(), f"left running after the test Slurm stopped: {cluster.leftovers()}"
