"""Whole files or none: every file distbench writes outside a rank's CSV stream goes through here.

A write goes to a temporary file beside the target, is flushed and fsync'ed, then renamed over it, so a
reader (or a later `distbench report`) sees the old file or the new one, never half of one, however the
write ends: a full disk, a quota, a read-only file system, a file-size limit, a signal. A write that fails
removes its temporary file and raises `WriteFailed`, which names the target.

A leaf: it imports nothing of distbench, so the rank side, the analysis, the orchestration and the CLI
all write the same way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
"""The errors that mean "the disk will not take it" (EFBIG: a file-size limit, RLIMIT_FSIZE), as opposed to a
wrong path: freeing space (or choosing another disk) and rerunning fixes them."""


class WriteFailed(OSError):
    """A file could not be written; `filename` is the target (never the temporary file), `errno` the cause's."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror or str(exc), str(path))


def is_no_space(exc: BaseException) -> bool:
    """True for a write refused by the disk itself (full, over quota, read-only, over a file-size limit)."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


def write_atomic(path: Path | str, write: Callable[[IO[Any]], Any], binary: bool = False) -> Path:
    """Call `write` on a temporary file beside `path`, then fsync it and rename it over `path`.

    The temporary file is made with mode 0o666 less the umask, as `open` would make `path` itself.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb" if binary else "w", newline=None if binary else "") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, WriteFailed):
            raise WriteFailed(path, exc) from exc
        raise
    return path


def write_text(path: Path | str, text: str) -> Path:
    """`path.write_text(text)`, whole or not at all."""
    return write_atomic(path, lambda handle: handle.write(text))


def write_csv(frame: Any, path: Path | str, **to_csv: Any) -> Path:
    """`frame.to_csv(path, **to_csv)` for a pandas DataFrame, whole or not at all."""
    return write_atomic(path, lambda handle: frame.to_csv(handle, **to_csv))


def copy(src: Path | str, dst: Path | str) -> Path:
    """`shutil.copyfile(src, dst)`, whole or not at all."""

    def write(handle: IO[Any]) -> None:
        with open(src, "rb") as source:
            shutil.copyfileobj(source, handle)

    return write_atomic(dst, write, binary=True)


VIRTUAL = frozenset({"proc", "sysfs", "devtmpfs", "cgroup", "cgroup2", "debugfs", "securityfs", "tracefs", "configfs"})
"""File systems of the kernel's own, which take no directory of ours whatever the permissions say."""


def unwritable_reason(path: Path | str, exc: OSError) -> str:
    """Why `path` could not be made a directory, in words that name the cause: the nearest existing directory above
    it is a kernel file system (/proc, /sys), not writable, or a file; else the error's own words."""
    here = Path(os.path.abspath(path))
    while not here.exists() and here != here.parent:
        here = here.parent
    kind = _fs_type(here)
    if kind in VIRTUAL:
        return f"{here} is the kernel's {kind} file system, which holds no results"
    if here.exists() and not here.is_dir():
        return f"{here} is a file, not a directory"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) or not os.access(here, os.W_OK):
        return f"{here} is not writable ({exc.strerror})"
    return exc.strerror or str(exc)


def _fs_type(path: Path) -> str | None:
    """The file system type of `path` from /proc/self/mounts (the longest mount point above it), None if unknown."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return None
    target = str(path.resolve())
    above = [(point, kind) for point, kind in mounts if target == point or target.startswith(point.rstrip("/") + "/")]
    return max(above, key=lambda m: len(m[0]))[1] if above else None
