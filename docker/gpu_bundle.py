"""`make gpu-bundle`: what a GPU machine without a package registry needs for `make gpu-check`.

Run here (with network or a warm cache); the folder then travels with the tree to the GPU machine:

    gpu-bundle/
      distbench-<ver>-py3-none-any.whl   this tree, built from a clean copy (a stale build/ cannot leak in)
      horovod-0.28.1.tar.gz              the sdist docker/install-horovod.sh builds from (HOROVOD_SDIST)
      horovod-0.28.1-cmake.patch         the CMake edits that recipe applies, for reading
      wheels/                            Horovod's build and runtime needs a CUDA image may lack
      bundle.json                        every file's size and SHA-256

The sdist and the wheels are cached under $DISTBENCH_CACHE (default ~/.cache/distbench), where the recipe
keeps its sdist too, so a second bundle needs no network.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOROVOD_VERSION = "0.28.1"
CACHE = Path(os.environ.get("DISTBENCH_CACHE", Path.home() / ".cache" / "distbench"))
SDIST = f"horovod-{HOROVOD_VERSION}.tar.gz"
PATCH = f"horovod-{HOROVOD_VERSION}-cmake.patch"
PACKAGES = ("backends", "benchmarks")
WHEELS = ("setuptools", "wheel", "cloudpickle", "psutil", "packaging")
"""Pure-Python or abi3 wheels, so one file suits any CPython >= 3.10. pyyaml, which horovodrun imports too,
is a dependency of transformers, which the GPU image has."""
EDITS = {
    "CMakeLists.txt": ("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    "horovod/torch/CMakeLists.txt": ("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    "horovod/common/ops/cuda/CMakeLists.txt": ("set(CMAKE_CUDA_STANDARD 11)", "set(CMAKE_CUDA_STANDARD 17)"),
}
"""The edits docker/install-horovod.sh makes with sed (the CUDA one on a CUDA build only); a test holds the
two to the same strings."""
LIMIT_BYTES = 60 << 20
"""The device tool carries at most 64 MiB of ignored paths with the tree."""


def run(argv: list[str], hint: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        why = said[-1] if said else f"exit {done.returncode}"
        raise SystemExit(f"distbench: error: {' '.join(argv[2:4])} failed ({why}); {hint}")


def pip_download(names: list[str], dest: Path, *extra: str) -> None:
    hint = f"with no network, put {' '.join(names)} into {dest} by hand"
    run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(dest), *extra, *names], hint)


def sdist() -> Path:
    """The Horovod sdist, from the cache the recipe shares, else downloaded into it."""
    path = CACHE / "sdist" / SDIST
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        pip_download([f"horovod=={HOROVOD_VERSION}"], path.parent, "--no-binary", ":all:")
    return path


def wheels(dest: Path) -> None:
    cache = CACHE / "gpu-wheels"
    missing = [n for n in WHEELS if not list(cache.glob(f"{n}-*.whl"))]
    if missing:
        cache.mkdir(parents=True, exist_ok=True)
        # The GPU machine's Python is not this one: ask for files any CPython 3.10+ on x86-64 Linux can use.
        target = ("--only-binary", ":all:", "--platform", "manylinux2014_x86_64", "--python-version", "3.10")
        pip_download(missing, cache, *target, "--implementation", "cp")
    dest.mkdir()
    for name in WHEELS:
        shutil.copy2(sorted(cache.glob(f"{name}-*.whl"))[-1], dest)


def cmake_patch(archive: Path) -> str:
    """A unified diff of EDITS against the sdist's own files."""
    top = f"horovod-{HOROVOD_VERSION}"
    out = []
    with tarfile.open(archive) as tar:
        for name, (old, new) in EDITS.items():
            member = tar.extractfile(f"{top}/{name}")
            assert member is not None, name
            before = member.read().decode()
            if old not in before:
                why = f"{SDIST} has no '{old}' in {name}"
                raise SystemExit(f"distbench: error: {why}; delete it from {archive.parent} to download it again")
            after = before.replace(old, new)
            out += difflib.unified_diff(
                before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
            )
    return "".join(out)


def project_wheel(dest: Path) -> Path:
    """This tree as a wheel, built from a copy holding only what the distribution needs."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, src / name)
        for package in PACKAGES:
            shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-w",
                str(dest),
                str(src),
            ],
            "make setup gives .venv the setuptools it builds with",
        )
    return next(dest.glob("distbench-*.whl"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(dest: Path) -> dict:
    """Write the bundle into `dest` (replaced whole) and return its manifest."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = sdist()
    shutil.copy2(archive, tmp / SDIST)
    (tmp / PATCH).write_text(cmake_patch(archive))
    project_wheel(tmp)
    wheels(tmp / "wheels")
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "horovod_version": HOROVOD_VERSION,
        "files": {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files},
    }
    total = sum(f["bytes"] for f in manifest["files"].values())
    if total > LIMIT_BYTES:
        raise SystemExit(f"distbench: error: the bundle is {total / 2**20:.1f} MiB, over {LIMIT_BYTES >> 20} MiB")
    manifest["total_bytes"] = total
    (tmp / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", default=str(ROOT / "gpu-bundle"), help="folder to write (replaced)")
    args = parser.parse_args(argv)
    manifest = build(Path(args.dest))
    print(f"{args.dest}: {len(manifest['files'])} files, {manifest['total_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
