"""A backend declared from a test's own module (issue 52): DDP under another name, with an option section and a
tune grid of its own. Named in DISTBENCH_BACKENDS, every distbench process (ranks included) imports it, and it
registers itself; nothing else in distbench names it."""

from __future__ import annotations

from dataclasses import dataclass

import backends
from backends.ddp import DDPBackend
from benchmarks import config, launch
from benchmarks.launch.variants import Variant


@dataclass
class ToyConfig:
    """Knobs of the test's toy backend (DDP underneath)."""

    toy_bucket_mb: float = config._opt(25.0, "the toy's DDP bucket size in MB", above=0)


class ToyBackend(DDPBackend):
    name = "toy"

    def __init__(self, run: config.RunConfig, options: ToyConfig, launched: launch.LaunchInfo) -> None:
        super().__init__(run, config.DDPConfig(bucket_cap_mb=options.toy_bucket_mb), launched)  # type: ignore[arg-type]

    @classmethod
    def check_run(cls, cfg: config.RunConfig, options: ToyConfig) -> str | None:
        return f"toy: checked once for the machine, buckets of {options.toy_bucket_mb} MB"  # as DeepSpeed's op line


backends.register(
    backends.Declared(
        "toy",
        f"{__name__}:ToyBackend",
        (Variant("toy@torchrun", "toy", launch.TORCHRUN),),
        ToyConfig,
        {"toy_bucket_mb": [1.0, 25.0]},
        "torch-{dist_backend}",
        "ddp",
        "the toy's reducer threads",
    )
)
