"""`tune --autotune`: Horovod's autotuner as a third final setting beside a variant's default and grid best.

Imported by the parser of every `distbench` process: no torch at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from backends import horovod_autotune
from benchmarks.errors import InputError
from benchmarks.suite.variants import Job, Variant

AUTOTUNE = "autotune"
"""The final stage's third setting of a Horovod variant under --autotune (runs <slug>-autotune-rN)."""


def plan_for(args: argparse.Namespace, chosen: list[Variant]) -> horovod_autotune.Plan | None:
    """--autotune's plan (Horovod's autotuner under the user's environment), None without it. Refused without a
    Horovod variant, and with HOROVOD_AUTOTUNE exported: every Horovod run of the sweep and default would adopt
    it (docs/fairness.md), so none of them would be at its knobs."""
    exported = os.environ.get("HOROVOD_AUTOTUNE", "").strip()
    if exported not in ("", "0"):
        raise InputError(
            f"HOROVOD_AUTOTUNE={exported} in the environment would autotune every Horovod run of tune's sweep and "
            "default; unset it and give --autotune, which adds the autotuned run beside them"
        )
    if not getattr(args, "autotune", False):
        return None
    if not any(v.backend == "horovod" for v in chosen):
        raise InputError("--autotune is Horovod's autotuner: add a Horovod variant to --backends, or leave it out")
    return horovod_autotune.plan(os.environ, horovod_autotune.gpu_build())


def job_for(job: Job, plan: horovod_autotune.Plan) -> Job:
    """A Horovod variant's autotuned final run: the default's timed steps, after a warm-up that holds the
    autotuner's whole search (more epochs where the default's are too few)."""
    cfg = job.cfg
    if cfg.train_size is None:
        raise InputError("tune --autotune lengthens the autotuned run by whole epochs: give --train-size")
    per_epoch = cfg.train_size // job.ranks // cfg.batch_size // cfg.accumulate  # as workloads.checks.check_steps
    per_epoch = min(per_epoch, cfg.steps_per_epoch or per_epoch)
    timed = cfg.epochs * per_epoch - cfg.warmup_steps
    epochs = -(-(plan.steps + timed) // max(per_epoch, 1))
    longer = dataclasses.replace(cfg, epochs=epochs, warmup_steps=epochs * per_epoch - timed)
    return dataclasses.replace(
        job, cfg=longer, knobs=[*job.knobs, "--autotune"], run_prefix=f"{job.variant.slug}-autotune"
    )


def settled_of(run_dir: Path) -> dict[str, Any]:
    """run.json knobs.autotuned of one autotuned run ({} when unreadable: a failed run)."""
    try:
        return json.loads((run_dir / "run.json").read_text()).get("knobs", {}).get("autotuned") or {}
    except (OSError, ValueError):
        return {}
