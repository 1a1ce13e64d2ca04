"""Whole files or none (benchmarks/files.py), and a full disk said in one line by the CLI."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import cli, files

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference" / "2026-12-01-cpu-2core"


def full_after(count: int):
    """A writer that writes `count` bytes, then fails as a full disk does."""

    def write(handle) -> None:
        handle.write("x" * count)
        handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return write


def test_a_write_replaces_the_file_whole(tmp_path) -> None:
    path = tmp_path / "a.txt"
    files.write_text(path, "old\n")
    files.write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_failed_write_keeps_the_old_file_names_the_target_and_leaves_no_temp_file(tmp_path) -> None:
    path = tmp_path / "report.html"
    files.write_text(path, "old\n")
    with pytest.raises(files.WriteFailed) as caught:
        files.write_atomic(path, full_after(10_000))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert files.is_no_space(caught.value)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_a_failed_first_write_leaves_no_file(tmp_path) -> None:
    with pytest.raises(files.WriteFailed):
        files.write_atomic(tmp_path / "decision.json", full_after(100))
    assert list(tmp_path.iterdir()) == []


def test_an_error_that_is_not_the_disks_passes_through_and_cleans_up(tmp_path) -> None:
    def broken(handle) -> None:
        handle.write("half")
        raise RuntimeError("a bug, not a disk")

    with pytest.raises(RuntimeError, match="a bug"):
        files.write_atomic(tmp_path / "x.csv", broken)
    assert list(tmp_path.iterdir()) == []
    assert not files.is_no_space(OSError(errno.ENOENT, "missing"))
    assert all(files.is_no_space(OSError(e, "")) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG))


def test_files_get_the_mode_open_would_give_them(tmp_path) -> None:
    umask = os.umask(0o022)
    try:
        path = files.write_text(tmp_path / "comparison.csv", "a\n")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644  # not the 0o600 of a mkstemp file


def test_csv_and_copy(tmp_path) -> None:
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    files.write_csv(frame, tmp_path / "t.csv", index=False)
    assert (tmp_path / "t.csv").read_text() == frame.to_csv(index=False)
    files.copy(tmp_path / "t.csv", tmp_path / "u.csv")
    assert (tmp_path / "u.csv").read_bytes() == (tmp_path / "t.csv").read_bytes()


def test_a_full_disk_in_compare_is_one_line_naming_the_file_and_what_was_kept(tmp_path, monkeypatch, capsys) -> None:
    root = tmp_path / "cmp"
    for run in ("ddp-torchrun-r0", "horovod-gloo-r0"):
        shutil.copytree(REFERENCE / run, root / run)
    full = files.WriteFailed(root / "report" / "report.html", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

    def command(args) -> int:
        raise full

    monkeypatch.setattr(cli, "_cmd_compare", command)
    assert cli.main(["compare", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err == (
        f"distbench: error: no space left on device writing {root}/report/report.html; kept: the 2 runs under {root} "
        f"(2 completed, 2 pass `distbench check`); free space and run `distbench report {root}`"
    )


def test_a_full_disk_in_report_is_exit_1_not_bad_input(tmp_path, monkeypatch, capsys) -> None:
    from benchmarks.analysis import report

    def write(*args, **kwargs) -> str:
        raise files.WriteFailed(tmp_path / "out" / "report.md", OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))

    monkeypatch.setattr(report, "write", write)
    assert cli.main(["report", str(REFERENCE), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"distbench: error: disk quota exceeded writing {tmp_path}/out/report.md; the runs under")
    assert "are unchanged" in err and "\n" not in err


def test_other_os_errors_are_not_called_a_full_disk(tmp_path, monkeypatch) -> None:
    def command(args) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path))

    monkeypatch.setattr(cli, "_cmd_compare", command)
    with pytest.raises(PermissionError):
        cli.main(["compare", "--out", str(tmp_path)])


def test_a_full_disk_in_tune_points_at_its_final_runs(tmp_path, monkeypatch, capsys) -> None:
    root = tmp_path / "tune"
    shutil.copytree(REFERENCE / "ddp-torchrun-r0", root / "sweep" / "ddp-p0-r0")
    shutil.copytree(REFERENCE / "ddp-torchrun-r1", root / "final" / "ddp-default-r0")
    full = files.WriteFailed(root / "tuned.csv", OSError(errno.EFBIG, os.strerror(errno.EFBIG)))

    def command(args) -> int:
        raise full

    monkeypatch.setattr(cli, "_cmd_tune", command)
    assert cli.main(["tune", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"distbench: error: file too large writing {root}/tuned.csv; kept: the 2 runs under {root}")
    assert err.endswith(f"free space and run `distbench report {root}/final`")
