"""The launches distbench knows by name: a backend under one launcher, `BACKEND@LAUNCHER`.

Declared here, beside launcher detection, because both the orchestration (which starts them) and the
analysis (which names a finished run by the variant that launched it, from its run.json) read them.
Horovod's controller (Gloo or MPI) is part of the name: `horovod@gloo` and `horovod@mpi` are different rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks import launch


@dataclass(frozen=True)
class Variant:
    name: str
    backend: str
    launcher: str
    controller: str = ""
    """Horovod's controller, as run.json `knobs.controller` records it; '' for the other backends."""
    given: str = field(default="", compare=False)
    """How --backends named it: a bare `ddp` keeps the run directories' old names (ddp-r0)."""

    @property
    def slug(self) -> str:
        """The variant in a run directory's name, as it was given: ddp, ddp-mpirun, horovod-gloo."""
        return (self.given or self.name).replace("@", "-")

    def launch_words(self) -> str:
        """How the variant starts, for the start-up line: `horovodrun --mpi`."""
        return f"{self.launcher} --{self.controller}" if self.launcher == launch.HOROVODRUN else self.launcher


KNOWN = (
    Variant("ddp@torchrun", "ddp", launch.TORCHRUN),
    Variant("ddp@mpirun", "ddp", launch.MPIRUN),
    Variant("fsdp@torchrun", "fsdp", launch.TORCHRUN),
    Variant("fsdp@mpirun", "fsdp", launch.MPIRUN),
    Variant("horovod@gloo", "horovod", launch.HOROVODRUN, "gloo"),
    Variant("horovod@mpi", "horovod", launch.HOROVODRUN, "mpi"),
    Variant("horovod@mpirun", "horovod", launch.MPIRUN, "mpi"),
    Variant("ddp@srun", "ddp", launch.SRUN),
    Variant("fsdp@srun", "fsdp", launch.SRUN),
    Variant("horovod@srun", "horovod", launch.SRUN, "mpi"),
    Variant("single", "single", launch.PYTHON),
)
BY_NAME = {v.name: v for v in KNOWN}


def label(backend: str, launcher: str, controller: str = "") -> str:
    """The variant a run belongs to, from what its run.json recorded; `backend@launcher` for a launch
    compare does not make (ddp under horovodrun --mpi, horovod under plain python)."""
    for v in KNOWN:
        if (v.backend, v.launcher) == (backend, launcher) and (v.controller or "") == (controller or ""):
            return v.name
    return backend if backend == "single" else f"{backend}@{launcher or '?'}"
