"""What this machine has: versions for run.json, and `distbench doctor`."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys

import torch

HOROVOD_FIX = "run `make setup` (or docker/install-horovod.sh .venv/bin/python)"


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def mpi_library_version() -> str | None:
    """First line of `mpirun --version` (without initialising MPI in this process)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _nccl_version() -> str | None:
    if not torch.distributed.is_nccl_available():
        return None
    version = torch.cuda.nccl.version()  # (2, 21, 5) in current torch, an int in old ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


IMPORTED = {"transformers": "transformers", "scikit-learn": "sklearn"}
"""Libraries recorded when a run has imported them (an hf: workload builds its model with transformers)."""


def versions() -> dict[str, str | None]:
    """Every library version that shapes a run's numbers: run.json `versions`."""
    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "horovod": _dist_version("horovod"),
        "mpi4py": _dist_version("mpi4py"),
        "mpi": mpi_library_version(),
        "numpy": _dist_version("numpy"),
    }
    found.update({dist: _dist_version(dist) for dist, module in IMPORTED.items() if module in sys.modules})
    if torch.cuda.is_available():  # the CUDA the kernels run on, and NCCL, DDP's GPU collectives
        found.update(cuda=torch.version.cuda, cudnn=str(torch.backends.cudnn.version()), nccl=_nccl_version())
    return found


def horovod_build() -> dict[str, bool] | str:
    """Horovod's own build checks, or the reason it cannot be used."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        return f"horovod.torch cannot be imported ({exc})"
    return {
        "PyTorch": True,
        "Gloo": hvd.gloo_built(),
        "MPI": hvd.mpi_built(),
        "NCCL": hvd.nccl_built() > 0,
        "CUDA": hvd.cuda_built(),
    }


def doctor() -> int:
    """Print what distbench will run with; non-zero with a fix hint when Horovod is unusable."""
    facts = versions()
    for name, value in facts.items():
        print(f"{name:>12}: {value or 'not found'}")
    print(f"{'executable':>12}: {sys.executable}")
    print(f"{'cpus':>12}: {os.cpu_count()}")
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print(f"{'cuda':>12}: {', '.join(cuda) if cuda else 'no CUDA devices'}")
    build = horovod_build()
    if isinstance(build, str):
        print(f"error: {build}; fix: {HOROVOD_FIX}", file=sys.stderr)
        return 1
    built = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in build.items())
    print(f"{'horovod with':>12}: {built}")
    if not (build["Gloo"] or build["MPI"]):
        print(f"error: Horovod was built without Gloo and MPI; fix: {HOROVOD_FIX}", file=sys.stderr)
        return 1
    if facts["mpi"] is None:
        print("warning: mpirun not found; fix: apt-get install -y openmpi-bin libopenmpi-dev", file=sys.stderr)
    return 0
