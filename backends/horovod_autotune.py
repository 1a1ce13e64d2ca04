"""Horovod's autotuner (HOROVOD_AUTOTUNE): how many steps it needs, and what its log says it settled on.

No torch, no horovod at module level: `distbench tune` plans with it before any job starts.

How many steps, from Horovod 0.28.1's horovod/common/parameter_manager.cc and operations.cc (docs/fairness.md):
- a *sample* ends when one tensor has been reduced HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE (10) more times; a *score*
  is the median of SAMPLES = 5 samples, and the reduction that ends the fifth starts no sample (the counts are
  reset), so a score takes 5 × steps-per-sample + 1 reductions of a gradient, i.e. optimizer steps;
- the first HOROVOD_AUTOTUNE_WARMUP_SAMPLES (3) scores are discarded;
- the parameters are tuned as an odometer: the Bayesian search over fusion threshold and cycle time takes
  HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (20) + 1 scores per round, and each true/false parameter still
  tunable (hierarchical allreduce, hierarchical allgather, torus allreduce, response cache) doubles the rounds.
  An exported HOROVOD_HIERARCHICAL_ALLREDUCE/_ALLGATHER, HOROVOD_TORUS_ALLREDUCE or HOROVOD_CACHE_CAPACITY fixes
  its parameter; a build without NCCL (or DDL) fixes hierarchical and torus allreduce to off.
So the autotuner has settled after (warm-up + (max samples + 1) × 2^tunable) × (5 × steps per sample + 1) steps
at most (a tensor reduced more often than once a step, e.g. distbench's own, ends samples sooner, never later):
with Horovod's defaults 87 × 51 = 4437 steps on a CPU build, 339 × 51 = 17289 with NCCL.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.errors import InputError

SAMPLES_PER_SCORE = 5
"""ParameterManager::SAMPLES: a score is the median of this many samples."""
DEFAULTS = {
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": 3,
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": 10,
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": 20,
}
"""parameter_manager.cc's DEFAULT_WARMUPS, DEFAULT_STEPS_PER_SAMPLE, DEFAULT_BAYES_OPT_MAX_SAMPLES."""
FIXING = {
    "hierarchical_allreduce": "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "hierarchical_allgather": "HOROVOD_HIERARCHICAL_ALLGATHER",
    "torus_allreduce": "HOROVOD_TORUS_ALLREDUCE",
    "cache_enabled": "HOROVOD_CACHE_CAPACITY",
}
"""Each true/false parameter the autotuner tries both ways, and the variable that fixes it (operations.cc)."""
GPU_ONLY = ("hierarchical_allreduce", "torus_allreduce")
"""Fixed to off by a build without NCCL or DDL allreduce."""
LOG_NAME = "autotune.csv"
LOG_COLUMNS = (
    "hierarchical_allreduce",
    "hierarchical_allgather",
    "torus_allreduce",
    "cache_enabled",
    "cycle_time_ms",
    "tensor_fusion_threshold",
    "score",
)
"""The header ParameterManager::Initialize writes; tensor_fusion_threshold is in MB, score in bytes per µs."""


@dataclass(frozen=True)
class Plan:
    """What the autotuner will do under an environment and a build."""

    warmups: int
    steps_per_sample: int
    max_samples: int
    tunable: tuple[str, ...]

    @property
    def scores(self) -> int:
        """Scored (logged) samples until it settles: the Bayesian rounds times both ways of each true/false."""
        return (self.max_samples + 1) * 2 ** len(self.tunable)

    @property
    def steps_per_score(self) -> int:
        return SAMPLES_PER_SCORE * self.steps_per_sample + 1

    @property
    def steps(self) -> int:
        """Optimizer steps, at most, until the autotuner has settled."""
        return (self.warmups + self.scores) * self.steps_per_score

    def derivation(self) -> str:
        both = f" × 2^{len(self.tunable)} ({', '.join(self.tunable)})" if self.tunable else ""
        return (
            f"({self.warmups} warm-up + ({self.max_samples} + 1){both} scored samples) × "
            f"({SAMPLES_PER_SCORE} × {self.steps_per_sample} + 1) steps each"
        )


def _int(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "").strip()
    if not text:
        return DEFAULTS[name]
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{name}={text!r} in the environment is not an integer; unset it or give one") from None


def plan(env: Mapping[str, str], gpu_build: bool) -> Plan:
    """The autotuner's plan: Horovod's defaults unless the environment sets them (as Horovod reads them)."""
    tunable = tuple(p for p, var in FIXING.items() if not env.get(var, "").strip() and (gpu_build or p not in GPU_ONLY))
    warmups, per_sample, max_samples = (_int(env, name) for name in DEFAULTS)
    return Plan(max(warmups, 0), max(per_sample, 1), max(max_samples, 0), tunable)


def gpu_build() -> bool:
    """Whether this Horovod reduces on GPUs with NCCL or DDL (then hierarchical and torus allreduce are tuned)."""
    try:
        import horovod.torch as hvd
    except ImportError:
        return False
    return bool(hvd.nccl_built() or hvd.ddl_built())


def check_steps(warmup_steps: int, total_steps: int, env: Mapping[str, str], gpu: bool) -> None:
    """Refuse an --autotune run whose warm-up cannot hold the autotuner's search: its timed steps would time
    the search, not the parameters it settles on."""
    p = plan(env, gpu)
    if warmup_steps < p.steps or total_steps <= p.steps:
        raise InputError(
            f"--autotune needs its search untimed: Horovod's autotuner settles after at most {p.steps} steps, "
            f"{p.derivation()}; give --warmup-steps {p.steps} or more and more steps than that (now "
            f"--warmup-steps {warmup_steps} of {total_steps}), or export HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE / "
            "_WARMUP_SAMPLES / _BAYES_OPT_MAX_SAMPLES lower (docs/fairness.md)"
        )


def _value(text: str) -> bool | float:
    text = text.strip()
    return text == "1" if text in ("0", "1") else float(text)


def read_log(path: Path, expected_scores: int | None = None) -> dict[str, Any]:
    """What the autotuner settled on, from its log (rank 0's HOROVOD_AUTOTUNE_LOG): the last row when it
    finished (its best, which LogBestParameters appends after the scored rows), else the best-scoring row so
    far. run.json knobs.autotuned: the parameters, `scored` (rows), `finished` and where `final` came from."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        return {"log": path.name, "error": f"no autotune log: {exc.strerror or exc}"}
    rows = []
    for record in csv.reader(lines[1:]):
        if len(record) == len(LOG_COLUMNS):
            try:
                rows.append(dict(zip(LOG_COLUMNS, map(_value, record), strict=True)))
            except ValueError:
                continue
    if not rows:
        return {"log": path.name, "scored": 0, "finished": False, "error": "the autotuner logged no sample"}
    finished = expected_scores is not None and len(rows) > expected_scores
    final = rows[-1] if finished else max(rows, key=lambda r: r["score"])
    settled = {
        "fusion_threshold_mb": final["tensor_fusion_threshold"],
        "cycle_time_ms": final["cycle_time_ms"],
        **{k: final[k] for k in FIXING},
        "score_bytes_per_us": final["score"],
    }
    scored = len(rows) - (1 if finished else 0)
    source = "its best (last row)" if finished else "best-scoring row so far: the autotuner had not finished"
    return {**settled, "scored": scored, "finished": finished, "from": source, "log": path.name}


def summary(autotuned: dict[str, Any]) -> str:
    """One line for the report: 'fusion 32 MB, cycle 5 ms, hierarchical allgather off, cache on (finished)'."""
    if "fusion_threshold_mb" not in autotuned:
        return str(autotuned.get("error", "—"))
    on = {True: "on", False: "off"}
    parts = [f"fusion {autotuned['fusion_threshold_mb']:g} MB", f"cycle {autotuned['cycle_time_ms']:g} ms"]
    parts += [f"{k.replace('_', ' ').replace(' enabled', '')} {on[bool(autotuned[k])]}" for k in FIXING]
    return ", ".join(parts) + (" (finished)" if autotuned.get("finished") else " (not finished: best so far)")
