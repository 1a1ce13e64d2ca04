"""What this machine and this process's environment bring to a run: versions and the environment
variables that can change a measurement (run.json), the rule for a variable an option also sets, and
`distbench doctor`.

Torch is imported only where a version is read, so the parser of every `distbench` process (and compare,
before it starts any job) can apply the rule cheaply.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.errors import InputError

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
    import torch

    if not torch.distributed.is_nccl_available():
        return None
    version = torch.cuda.nccl.version()  # (2, 21, 5) in current torch, an int in old ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


IMPORTED = {"transformers": "transformers", "scikit-learn": "sklearn"}
"""Libraries recorded when a run has imported them (an hf: workload builds its model with transformers)."""


def distbench_version() -> str:
    """This checkout's version (the installed distribution's), with its git commit where it is a checkout."""
    version = _dist_version("distbench") or "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{version} ({commit})" if commit else version


def versions() -> dict[str, str | None]:
    """Every library version that shapes a run's numbers: run.json `versions`."""
    import torch

    found: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "horovod": _dist_version("horovod"),
        "deepspeed": _dist_version("deepspeed"),
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
    import torch

    facts = versions()
    for name, value in facts.items():
        print(f"{name:>12}: {value or 'not found'}")
    print(f"{'executable':>12}: {sys.executable}")
    print(f"{'cpus':>12}: {os.cpu_count()}")
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print(f"{'cuda':>12}: {', '.join(cuda) if cuda else 'no CUDA devices'}")
    if facts["deepspeed"]:  # what backend deepspeed imports it with (DS_ACCELERATOR, else the run's device)
        given = os.environ.get("DS_ACCELERATOR")
        why = f"DS_ACCELERATOR={given}" if given else "DS_ACCELERATOR unset: the run's device"
        print(f"{'deepspeed on':>12}: {given or ('cuda' if cuda else 'cpu')} ({why})")
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


# --- environment variables that can change a measurement (run.json `environment`) -------------------------
RECORDED_PREFIXES = (
    "HOROVOD_",
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "GLOO_",
    "OMPI_MCA_",
    "UCX_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "CUDA_",
    "MPI4PY_",
)
"""A variable is recorded when its name starts with one of these (TORCH_ covers TORCH_NCCL_), or is named in
RECORDED_NAMES. Of Open MPI's own only its parameters, OMPI_MCA_*, are: OMPI_COMM_WORLD_* and the rest say
where a rank sits, which run.json records already."""
RECORDED_NAMES = ("LD_PRELOAD",)
"""A preloaded allocator (jemalloc, tcmalloc) changes step times."""
LAUNCHER_WIRING = (
    "OMPI_MCA_orte_",
    "OMPI_MCA_ess",
    "OMPI_MCA_pmix",
    "OMPI_MCA_initial_wdir",
    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_",
)
"""Left out although their prefix matches: what the launcher sets for each job or rank to wire it up (its
rank, size, host, rendezvous address and port, session directories, job ids), which says nothing about
how fast it runs; a name starting with one of these strings is dropped."""
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
REDACTED = "<redacted>"
"""The value recorded for a variable whose name contains a SECRET_WORDS word: that it was set is kept."""


def recorded_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that can change a measurement, by the rules above, sorted by name."""
    found = {}
    for name in sorted(env):
        if not (name.startswith(RECORDED_PREFIXES) or name in RECORDED_NAMES) or name.startswith(LAUNCHER_WIRING):
            continue
        secret = any(word in name.upper() for word in SECRET_WORDS)
        found[name] = REDACTED if secret else env[name]
    return found


def by_rank(per_rank: list[dict[str, str]]) -> dict[str, Any]:
    """run.json `environment`: rank 0's variables, and for each rank whose set differs, what differs
    (a variable rank 0 has and that rank lacks is null)."""
    first = per_rank[0]
    differing = {}
    for rank, mine in enumerate(per_rank[1:], start=1):
        diff = {n: mine.get(n) for n in sorted({*first, *mine}) if mine.get(n) != first.get(n)}
        if diff:
            differing[str(rank)] = diff
    return {"variables": first, "ranks_differing": differing}


# --- the rule for a variable that an option also sets ----------------------------------------------------------
MIB = 1 << 20


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class EnvOption:
    """An option whose value distbench also writes into an environment variable (or that overrides one)."""

    field: str
    """The options dataclass field (benchmarks.config), on whichever section has it."""
    names: tuple[str, ...]
    read: Callable[[str], float]
    """The variable's text as the option's value (HOROVOD_FUSION_THRESHOLD's bytes as MB)."""

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


ENV_OPTIONS = (
    # torch.set_num_threads(--threads) sets OpenMP's and MKL's thread counts both.
    EnvOption("threads", ("OMP_NUM_THREADS", "MKL_NUM_THREADS"), _positive_int),
    EnvOption("fusion_threshold_mb", ("HOROVOD_FUSION_THRESHOLD",), lambda text: int(text) / MIB),
    EnvOption("cycle_time_ms", ("HOROVOD_CYCLE_TIME",), float),
    # Horovod turns its autotuner on for any integer above 0 (operations.cc's strtol).
    EnvOption("autotune", ("HOROVOD_AUTOTUNE",), lambda text: int(text) > 0),
)
"""The rule (docs/fairness.md): where the environment sets one of these variables and the option was not
given, the variable's value becomes the option's and rank 0 (or compare's start-up line) says so; where the
option was given too and the two differ, the run is refused. distbench never overwrites such a variable
with a value the user did not choose."""
TORCHRUN_OMP = "1"
"""OMP_NUM_THREADS torchrun exports by itself when it starts several ranks and the variable is unset: not the
user's choice, so not adopted (distbench's own default, cores ÷ local ranks, applies as under every launcher)."""

T = TypeVar("T")


def _text(value: float) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def adopt(
    section: T, explicit: Collection[str], env: Mapping[str, str], ignore: Collection[str] = ()
) -> tuple[T, dict[str, dict[str, Any]]]:
    """`section` (a config dataclass) with the rule applied to each of its fields in ENV_OPTIONS, and what was
    adopted ({field: {'from': 'VAR=text', 'value': value}}: run.json `environment.adopted`). A field counts
    as given when it is in `explicit` (the options on the command line) or differs from its default. Raises
    InputError (one line) on a contradiction."""
    defaults = {f.name: f.default for f in dataclasses.fields(section)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    adopted: dict[str, dict[str, Any]] = {}
    for opt in ENV_OPTIONS:
        if opt.field not in defaults:
            continue
        found = {n: env[n].strip() for n in opt.names if env.get(n, "").strip() and n not in ignore}
        values = {}
        for name, text in found.items():
            try:
                values[name] = opt.read(text)
            except ValueError:
                raise InputError(
                    f"{name}={text!r} in the environment is not a valid {opt.flag} value; unset it or give a number"
                ) from None
        if not values:
            continue
        current = getattr(section, opt.field)
        said = " and ".join(f"{n}={found[n]}" for n in values)
        if opt.field in explicit or current != defaults[opt.field]:
            wrong = [n for n, v in values.items() if not math.isclose(v, current)]
            if wrong:
                raise InputError(
                    f"{said} in the environment and {opt.flag} {_text(current)} disagree; give the value one way: "
                    f"{opt.flag} alone (unset {' and '.join(wrong)}) or the environment alone"
                )
            continue
        if len({round(v, 9) for v in values.values()}) > 1:
            raise InputError(f"{said} in the environment disagree; set them alike, or unset them and give {opt.flag}")
        changes[opt.field] = next(iter(values.values()))
        adopted[opt.field] = {"from": said, "value": changes[opt.field]}
    return (dataclasses.replace(section, **changes) if changes else section), adopted  # type: ignore[type-var]


def adoption_notes(adopted: dict[str, dict[str, Any]], who: str = "distbench") -> list[str]:
    """The lines that say what the environment set: 'distbench: OMP_NUM_THREADS=4 from the environment sets
    --threads 4'."""
    flags = {o.field: o.flag for o in ENV_OPTIONS}
    return [
        f"{who}: {a['from']} from the environment sets {flags[field]} {_text(a['value'])} (docs/fairness.md)"
        for field, a in adopted.items()
    ]


TRACE_TIMELINE = "HOROVOD_TIMELINE"


def adopt_for_run(
    cfg: T, options: Any, explicit: Collection[str], env: Mapping[str, str], launcher: str, local_world_size: int
) -> tuple[T, Any, dict[str, dict[str, Any]]]:
    """The rule for `distbench run`, on every rank before any process group: run options and the backend's own.
    torchrun's own OMP_NUM_THREADS=1 is not the user's (TORCHRUN_OMP); with --trace, Horovod's timeline
    variable is distbench's to set."""
    ignore = (
        ["OMP_NUM_THREADS"]
        if launcher == "torchrun" and local_world_size > 1 and env.get("OMP_NUM_THREADS", "").strip() == TORCHRUN_OMP
        else []
    )
    cfg, adopted = adopt(cfg, explicit, env, ignore)
    options, more = adopt(options, explicit, env)
    if getattr(cfg, "trace", False) and hasattr(options, "fusion_threshold_mb") and env.get(TRACE_TIMELINE):
        raise InputError(
            f"--trace starts Horovod's timeline itself ({TRACE_TIMELINE}=DYNAMIC), but the environment sets "
            f"{TRACE_TIMELINE}={env[TRACE_TIMELINE]}; unset {TRACE_TIMELINE} or leave out --trace"
        )
    return cfg, options, {**adopted, **more}


IN_CONTAINER = "DISTBENCH_IN_CONTAINER"
"""Set to 1 by distbench's image (docker/Dockerfile): results written outside a mount die with the container."""
OUT_SAID = "DISTBENCH_OUT_SAID"
"""Set once the warning below was said, so the processes this one starts (compare's jobs, a launcher's ranks)
do not say it again."""
RUN_CHECK_SAID = "DISTBENCH_RUN_CHECK_SAID"
"""Set in the environment of compare's and tune's jobs, which said what each backend did for the machine
(check_run: DeepSpeed's op built or found) at start-up: their rank 0 do not say it again; a plain `run` does."""


_RANKS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "HOROVOD_RANK")
"""Each launcher's rank variable."""


def _mount_point(path: str, mountinfo: str) -> str:
    """The mount point under which `path` lies (the longest one that contains it), from /proc's mountinfo."""
    points = [line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4]
    inside = [p for p in points if path == p or path.startswith(p.rstrip("/") + "/")]
    return max(inside, key=len, default="/")


def out_outside_mounts(out: str, env: Mapping[str, str] = os.environ, mountinfo: str | None = None) -> str | None:
    """In distbench's image, the warning for an --out that lies in the container's own file system, else None."""
    if env.get(IN_CONTAINER) != "1" or env.get(OUT_SAID) == "1":
        return None
    if any(env.get(rank, "0") != "0" for rank in _RANKS):  # rank 0 says it for the job
        return None
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo") as file:
                mountinfo = file.read()
        except OSError:
            return None
    if _mount_point(os.path.abspath(out), mountinfo) != "/":
        return None
    return (
        f"--out {out} is inside the container, not on a mounted directory: the results are deleted with the "
        'container (mount one: docker run -v "$PWD/results:/out" … --out /out)'
    )
