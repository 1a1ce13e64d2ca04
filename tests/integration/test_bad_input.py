"""Bad input and failures under real launchers: rank 0 says it once, no rank prints a traceback.

What follows our one line is the launcher's own notice; the exit code is what the launcher passes on
(docs/commands.md, the launcher table under `distbench run`; docs/reliability.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import (
    BAD_INPUT_LAUNCHERS,
    BAD_INPUT_RUN,
    CLI,
    no_rank_traceback,
    one_in_make_test,
    our_lines,
    run_cmd,
    torchrun,
)

BAD = {
    "checked before torch": (["--lr", "0"], "--lr must be a positive number"),
    "checked with the data": (["--train-size", "50", "--batch-size", "64"], "lower --batch-size"),
    "refused by the parser": (["--epochs", "two"], "argument --epochs: invalid int value: 'two'; see distbench run"),
}
# `make test` gives each launcher one bad input, each kind under one launcher: a value argparse refuses (not
# its usage once a rank), the checks made before torch, and the data's. The other pairs are `full_matrix`, left
# to `make test-all`.
DEFAULT_BAD_OF_LAUNCHER = {
    "torchrun": "checked with the data",
    "horovodrun": "checked before torch",
    "mpirun": "refused by the parser",
}
BAD_UNDER_LAUNCHERS = [
    pytest.param(
        launcher,
        bad,
        id=f"{launcher}-{bad}",
        marks=() if DEFAULT_BAD_OF_LAUNCHER[launcher] == bad else pytest.mark.full_matrix,
    )
    for launcher in BAD_INPUT_LAUNCHERS
    for bad in BAD
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("launcher", "bad"), BAD_UNDER_LAUNCHERS)
def test_bad_input_under_a_launcher_is_said_once(tmp_path, launcher: str, bad: str, horovod_available) -> None:
    prefix, backend, code = BAD_INPUT_LAUNCHERS[launcher]
    args, message = BAD[bad]
    proc = run_cmd([*prefix(), "run", "--backend", backend, *BAD_INPUT_RUN, *args, "--out", str(tmp_path)], timeout=130)
    output = proc.stdout + proc.stderr
    lines = our_lines(output)
    assert len(lines) == 1 and message in lines[0], output
    assert proc.returncode == code, output
    assert re.search(r"exit ?code:?\s+2\b|status code 2\b", output, re.IGNORECASE), output  # the launcher saw 2
    no_rank_traceback(output)
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(150)
def test_a_run_failing_mid_way_says_its_error_once_with_the_run_directory(tmp_path) -> None:
    cmd = [
        *torchrun(2),
        "run",
        "--backend",
        "ddp",
        *BAD_INPUT_RUN,
        "--out",
        str(tmp_path),
        "--run-id",
        "r",
        "--inject-fault",
        "exception@3:1",
    ]
    proc = run_cmd(cmd, timeout=130)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    lines = our_lines(output)
    assert len(lines) == 1, output
    assert "run failed on rank 1: InjectedFault: injected exception at step 3 on rank 1" in lines[0]
    assert str(tmp_path / "r" / "run.json") in lines[0]
    no_rank_traceback(output)
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "failed"


@pytest.mark.timeout(120)
def test_ddp_without_a_launcher_says_it_runs_one_rank(tmp_path) -> None:
    notice = "no launcher detected: 1 rank; use torchrun/mpirun/horovodrun for more"
    proc = run_cmd([*CLI, "run", "--backend", "ddp", *BAD_INPUT_RUN, "--out", str(tmp_path)], timeout=100)
    assert proc.returncode == 0 and proc.stderr.splitlines().count(notice) == 1, proc.stderr
    assert json.loads((Path(proc.stdout.strip().splitlines()[-1]) / "run.json").read_text())["world_size"] == 1
    proc = run_cmd([*CLI, "run", "--backend", "single", *BAD_INPUT_RUN, "--out", str(tmp_path)], timeout=100)
    assert proc.returncode == 0 and notice not in proc.stderr


@pytest.mark.timeout(150)
# Bad input × launcher: each kind under one launcher in make test, this one torchrun (the unknown validation
# strategy of test_validation.py horovodrun, the data check of test_bad_input_under_a_launcher_is_said_once
# every launcher once).
@pytest.mark.parametrize("launcher", one_in_make_test(list(BAD_INPUT_LAUNCHERS), "torchrun"))
def test_an_existing_run_directory_is_refused_and_left_alone(tmp_path, launcher: str, horovod_available) -> None:
    """Refused before any rank joins a job: Horovod used to hang here, and notes landed in the old run."""
    prefix, backend, code = BAD_INPUT_LAUNCHERS[launcher]
    existing = tmp_path / "dup"
    existing.mkdir()
    (existing / "run.json").write_text('{"keep": true}')
    proc = run_cmd(
        [*prefix(), "run", "--backend", backend, *BAD_INPUT_RUN, "--out", str(tmp_path), "--run-id", "dup"], timeout=130
    )
    output = proc.stdout + proc.stderr
    lines = our_lines(output)
    assert len(lines) == 1 and "already exists; choose another --run-id or pass --overwrite" in lines[0], output
    assert proc.returncode == code, output
    no_rank_traceback(output)
    assert sorted(p.name for p in existing.iterdir()) == ["run.json"]
    assert (existing / "run.json").read_text() == '{"keep": true}'
