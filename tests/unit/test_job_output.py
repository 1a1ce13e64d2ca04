"""What a job's stderr becomes on compare's: whole lines, Open MPI's setpgid race left out (said once)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.suite import jobs


def test_open_mpis_setpgid_warning_is_left_out_and_explained_once(monkeypatch) -> None:
    monkeypatch.setattr(jobs, "_noise_said", jobs.threading.Event())
    race = b"[h0:01234] plm:rsh: Warning: setpgid(5678,5678) failed in parent with errno=Permission denied(13)\n"
    kept, held = jobs._without_noise(b"[1,0]<stderr>:step 1\n" + race + b"[1,0]<stderr>:step 2\n" + race + b"[1,0")
    assert kept.decode().splitlines() == ["[1,0]<stderr>:step 1", jobs.NOISE_WORDS, "[1,0]<stderr>:step 2"]
    assert held == b"[1,0"  # a line's start waits for its end
    assert jobs._without_noise(race) == (b"", b"")  # said once per process


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_a_ranks_lines_stay_whole_under_open_mpis_tag_output() -> None:
    """print() to stderr made two writes, and --tag-output (horovodrun --mpi) tagged both: `step/s[1,0]<stderr>:`."""
    script = "import sys; from benchmarks import cli; cli.whole_lines()\n"
    script += "for i in range(20): print(f'line {i}', file=sys.stderr, flush=True)"
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    done = subprocess.run(
        ["mpirun", "-np", "1", "--tag-output", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, **root},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"[1,0]<stderr>:line {i}" for i in range(20)]


def test_a_bar_redrawn_with_carriage_returns_passes_as_it_is_drawn() -> None:
    kept, held = jobs._without_noise(b"bar 1/3\rbar 2/3\rbar 3")
    assert kept == b"bar 1/3\rbar 2/3\r" and held == b"bar 3"
