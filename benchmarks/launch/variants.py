"""A launch of a backend, `BACKEND@LAUNCHER`: the unit compare runs. Which variants exist each backend declares
(backends.Declared.variants; backends.KNOWN lists them all). Horovod's controller (Gloo or MPI) is part of the
name: `horovod@gloo` and `horovod@mpi` are different rows.
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
