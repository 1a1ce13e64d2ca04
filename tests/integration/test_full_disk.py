"""A full disk at any moment: a rank fails as any fault does, compare and report say it in one line and exit 1,
and no file is left half-written.

The disk is a tmpfs of a few hundred KiB where the test can mount one (root with CAP_SYS_ADMIN); elsewhere a
file-size limit (RLIMIT_FSIZE, EFBIG) on the command and its children stands in for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.analysis import check, load
from tests.helpers import BIN, REPO, launcher_env, torchrun

DISK_FULL = ("No space left on device", "File too large")


@dataclass
class Disk:
    path: Path
    mounted: bool
    file_limit: int
    """Bytes per file when no tmpfs could be mounted."""

    def run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env=launcher_env(),
            preexec_fn=None if self.mounted else self._limit,
        )

    def _limit(self) -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal's core dump
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_limit, self.file_limit))

    def free_space(self) -> None:
        if self.mounted:
            subprocess.run(["mount", "-o", "remount,size=8m", str(self.path)], check=True)
        else:
            self.file_limit = resource.RLIM_INFINITY


@contextlib.contextmanager
def tiny_disk(where: Path, kib: int, file_limit: int) -> Iterator[Disk]:
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)]
    mounted = os.geteuid() == 0 and subprocess.run(mount, capture_output=True).returncode == 0
    try:
        yield Disk(where, mounted, file_limit)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)


def assert_nothing_half_written(root: Path) -> None:
    """Every file under `root` is whole: no temporary file left, JSON and CSV parse, PNG and HTML end."""
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        assert not path.name.endswith(".tmp"), f"temporary file left: {path}"
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".csv":
            pd.read_csv(path)
        elif path.suffix == ".png":
            assert path.read_bytes()[-8:-4] == b"IEND", f"truncated figure: {path}"
        elif path.suffix == ".html":
            assert path.read_text().rstrip().endswith("</html>"), f"truncated page: {path}"


def one_error_line(stderr: str, launcher: bool = False) -> str:
    """distbench's one line; no traceback (but a launcher's own, which torchrun prints for a failed rank)."""
    ours = (f'File "{REPO / "benchmarks"}', f'File "{REPO / "backends"}')
    assert not any(o in stderr for o in ours) if launcher else "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("distbench: error:")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


@pytest.mark.timeout(150)
def test_a_rank_on_a_full_disk_fails_its_run_cleanly(tmp_path) -> None:
    """Two DDP ranks; the disk fills while rank 0 appends rows: the job ends (no hang), the run is recorded
    failed with the cause, and its rows are whole."""
    with tiny_disk(tmp_path / "disk", 80, 6000) as disk:
        cmd = [
            *torchrun(2),
            "run",
            "--backend",
            "ddp",
            "--workload",
            "mlp",
            "--epochs",
            "2",
            "--flush-every",
            "5",
            "--quiet",
            "--timeout",
            "30",
            "--out",
            str(disk.path),
            "--run-id",
            "r",
        ]
        proc = disk.run(cmd, timeout=120)
        assert proc.returncode != 0, proc.stderr[-3000:]
        line = one_error_line(proc.stderr, launcher=True)
        assert line.startswith("distbench: error: cannot write") and any(c in line for c in DISK_FULL), line
        meta = json.loads((disk.path / "r" / "run.json").read_text())
        assert meta["status"] == "failed" and any(c in meta["error"] for c in DISK_FULL), meta.get("error")
        assert check.check_run(disk.path / "r") == []
        assert_nothing_half_written(disk.path)


# A full disk at each level: a rank's run (above) in `make test`; compare's report, the same writer behind one
# more job, is `full_matrix`.
@pytest.mark.full_matrix
@pytest.mark.timeout(300)
def test_compare_on_a_full_disk_says_one_line_and_keeps_its_runs(tmp_path) -> None:
    """The runs fit, the report does not: one line naming the file and what was kept, exit 1, no half-written
    file; `distbench report` on the same disk says the same way; once there is space it writes the report."""
    with tiny_disk(tmp_path / "disk", 200, 12_000) as disk:
        root = disk.path / "c"
        cmd = [
            str(BIN / "distbench"),
            "compare",
            "--quiet",
            "--backends",
            "ddp",
            "--repeats",
            "2",
            "--workload",
            "mlp",
            "--steps-per-epoch",
            "4",
            "--warmup-steps",
            "1",
            "--epochs",
            "1",
            "--out",
            str(disk.path),
            "--run-id",
            "c",
        ]
        proc = disk.run(cmd, timeout=240)
        assert proc.returncode == 1, proc.stderr[-3000:]
        line = one_error_line(proc.stderr)
        assert any(f"{cause[0].lower()}{cause[1:]} writing {root}/" in line for cause in DISK_FULL), line
        assert f"kept: the 2 runs under {root} (2 completed, 2 pass `distbench check`)" in line, line
        assert line.endswith(f"free space and run `distbench report {root}`"), line
        runs = load.find_run_dirs(root)
        assert len(runs) == 2 and all(check.check_run(r) == [] for r in runs)
        assert_nothing_half_written(root)

        again = disk.run([str(BIN / "distbench"), "report", str(root)], timeout=60)
        assert again.returncode == 1, again.stderr[-3000:]
        assert "are unchanged" in one_error_line(again.stderr)
        assert_nothing_half_written(root)

        disk.free_space()
        done = disk.run([str(BIN / "distbench"), "report", str(root)], timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads((root / "report" / "decision.json").read_text())["setups"] is not None
        assert (root / "report" / "report.html").read_text().rstrip().endswith("</html>")
        assert_nothing_half_written(root)
