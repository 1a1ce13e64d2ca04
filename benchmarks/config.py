"""Run configuration: one dataclass per concern, every field documented, turned into CLI options.

The `help` in each field's metadata is both its documentation and its `--option` help text, so the
CLI, `run.json` and this file cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from benchmarks import catalog
from benchmarks.errors import InputError


def _opt(default: Any, help: str, shown: str | None = None, **extra: Any) -> Any:
    """A documented field; `shown` is what a default of None means, for --help and docs/commands.md's tables."""
    return field(default=default, metadata={"help": help, "shown": shown, **extra})


VAL_STRATEGIES = ("exact", "sampler", "replicated", "rank0")
"""`--val-strategy`'s values; `benchmarks.run.validation` says what each evaluates."""

AMP_MODES = ("off", "bf16", "fp16")
"""`--amp`'s values (backends.step applies them)."""
COMPILE_MODES = ("off", "on")
"""`--compile`'s values."""
STEP_LISTS = ("amp", "compile")
"""Step options that compare takes as a list, each combination its own runs and decision."""
PLAIN_STEP = "fp32 eager"
"""The step every run trained before the step options (and a run given none of them)."""


def step_of(options: dict[str, Any]) -> str:
    """The step a run trained, in words, from its options (run.json `config`): 'fp32 eager', 'bf16 compiled', with
    ', clip 1' and ', checkpointed' where given."""
    amp = options.get("amp") or "off"
    words = f"{'fp32' if amp == 'off' else amp} {'compiled' if options.get('compile') == 'on' else 'eager'}"
    if options.get("clip_grad_norm"):
        words += f", clip {options['clip_grad_norm']:g}"
    if options.get("activation_checkpointing"):
        words += ", checkpointed"
    return words


WORKLOAD_DEFAULT = "the workload's"
"""`shown` of an option whose None is filled in per workload (benchmarks.catalog.defaults_for)."""


@dataclass
class RunConfig:
    """What to train and how; identical for every backend."""

    workload: str = _opt(
        "mlp",
        "workload: linear, mlp, cnn, transformer, with size arguments (transformer:dim=256,layers=8); a preset "
        "(gpt2-small, cnn-25m); hf:MODEL (hf:gpt2, hf:bert-base-uncased, hf:GPT2Config:n_layer=2); "
        "or package.module:factory",
    )
    epochs: int = _opt(2, "number of epochs")
    steps_per_epoch: int | None = _opt(None, "cap on optimizer steps per epoch", "one pass")
    batch_size: int | None = _opt(
        None, "per-rank micro-batch size; global batch = batch × world size × accumulate", WORKLOAD_DEFAULT
    )
    train_size: int | None = _opt(None, "training samples", WORKLOAD_DEFAULT)
    val_size: int | None = _opt(None, "validation samples", WORKLOAD_DEFAULT)
    lr: float | None = _opt(
        None, "learning rate of the optimizer, the same for every backend, never scaled", WORKLOAD_DEFAULT
    )
    optimizer: str = _opt(
        "sgd",
        "sgd (momentum 0.9) or adamw (PyTorch's defaults otherwise); a workload's own optimizer factory wins",
        choices=("sgd", "adamw"),
    )
    seed: int = _opt(0, "seed for data, initial weights and shuffling")
    workers: int = _opt(0, "DataLoader worker processes per rank (num_workers) for a Dataset or with --dataloader")
    prefetch_factor: int = _opt(2, "batches each DataLoader worker loads ahead (with --workers > 0)")
    dataloader: bool = _opt(
        False, "feed in-memory tensor workloads through a DataLoader too (a Dataset always goes through one)"
    )
    warmup_steps: int = _opt(5, "first steps flagged warm-up and left out of summary.csv")
    device: str = _opt("cpu", "cpu or cuda (one GPU per local rank)", choices=("cpu", "cuda"))
    threads: int | None = _opt(
        None,
        "torch intra-op threads per rank, set under every launcher (OMP_NUM_THREADS or MKL_NUM_THREADS exported: "
        "their value, docs/fairness.md)",
        "cores ÷ local ranks",
    )
    bind: str | None = _opt(
        None,
        "CPU placement, applied by each rank under any launcher: none (every rank free on every core the job may "
        "use) or cores (each rank pinned to its own equal share of them, by local rank); run.json placement "
        "records each rank's cores",
        "as launched; compare and tune: none",
        choices=("none", "cores"),
    )
    out: str = _opt("results/runs", "directory that receives <run-id>/")
    run_id: str | None = _opt(None, "name of the run directory", "time-backend-workload-wN-xxxx")
    compute_baseline_steps: int = _opt(
        10,
        "after training, time N steps of the same per-rank batches on a copy of the model with no gradient "
        "communication (summary.csv compute_s, exposed_comm_s); 0 turns it off",
    )
    compute_baseline_spread: bool = _opt(
        False,
        "spread the compute baseline over the epochs, a share after each epoch's validation, so that it and the "
        "timed steps sample the same stretches of a machine whose speed drifts; its copy of the model then counts "
        "in the peak memory",
    )
    trace: bool = _opt(
        False, "after training, trace --trace-steps more steps: Horovod timeline, torch.profiler for the others"
    )
    trace_steps: int = _opt(5, "steps traced with --trace (after every recorded number, so none is perturbed)")
    val_strategy: str = _opt(
        "exact",
        "how validation is split over the ranks: exact (every sample once, sums reduced), sampler "
        "(DistributedSampler's padded shards, each rank's mean averaged), replicated (every rank evaluates the "
        "whole set), rank0 (rank 0 alone, the others wait); compare takes a list, e.g. exact,sampler "
        "(docs/evaluation.md)",
    )
    eval_only: bool = _opt(
        False, "no training: time --eval-repeats validations of the model as built (or after --eval-train-steps)"
    )
    eval_train_steps: int = _opt(
        0, "with --eval-only: untimed, unrecorded training steps first, so BatchNorm statistics are realistic"
    )
    eval_repeats: int = _opt(5, "with --eval-only: timed validation passes over the validation set")
    flush_every: int = _opt(100, "gather per-rank rows to rank 0 every N steps (off the timed path)")
    accumulate: int = _opt(
        1,
        "micro-batches per optimizer step: DDP no_sync, Horovod backward_passes_per_step, FSDP2 "
        "set_requires_gradient_sync(False) on all but the last",
    )
    fp16_allreduce: bool = _opt(
        False,
        "fp16 gradient compression: DDP fp16_compress_hook, Horovod Compression.fp16, FSDP2 MixedPrecisionPolicy "
        "reduce_dtype float16",
    )
    amp: str = _opt(
        "off",
        "mixed precision: autocast to bf16 or fp16 on the rank's device around forward and loss, the same for every "
        "backend; parameters, gradients and optimizer state stay fp32; fp16 scales the loss with a GradScaler whose "
        "skipped steps run.json step records; compare takes a list, e.g. off,bf16",
        listed=AMP_MODES,
    )
    compile: str = _opt(
        "off",
        "torch.compile (inductor) as each framework documents it: DDP's module whole, FSDP2 each unit's forward, "
        "Horovod and single the model; the warm-up lasts until no step compiles, and run.json step records the "
        "compile time; --compile alone is on; compare takes a list, off,on",
        listed=COMPILE_MODES,
        const="on",
    )
    clip_grad_norm: float | None = _opt(
        None,
        "clip the gradients to this total norm, each framework's way: after DDP's backward, Horovod's synchronize() "
        "then step() under skip_synchronize(), FSDP2's sharded norm reduced over the ranks",
        "off",
    )
    activation_checkpointing: bool = _opt(
        False,
        "recompute each block's activations in backward (torch.utils.checkpoint, non-reentrant): the "
        "transformer's layers, the cnn's residual blocks, a hf: model's layers",
    )
    peak_tflops: float | None = _opt(
        None,
        "the peak TFLOP/s per rank that summary.csv mfu is against, e.g. a GPU's datasheet figure for --amp's dtype",
        "this machine's matmul peak at the rank's threads and dtype, measured after training",
    )
    timeout: float = _opt(300.0, "seconds a rank may wait in start-up or a collective before failing")
    quiet: bool = _opt(False, "no progress bar (the bar is on rank 0 only)")
    overwrite: bool = _opt(False, "replace an existing run directory of the same --run-id")
    inject_fault: str | None = _opt(
        None, "testing: fail as MODE@STEP[:RANK], MODE one of exception, exit0, exit1, abort, sigkill, sigterm, hang"
    )


@dataclass
class DDPConfig:
    """Knobs of torch.nn.parallel.DistributedDataParallel (defaults are PyTorch's)."""

    dist_backend: str | None = _opt(None, "torch.distributed backend", "gloo on CPU, nccl on CUDA")
    bucket_cap_mb: float | None = _opt(
        None,
        "DDP gradient bucket size in MB; given, torch makes the first bucket that size too",
        "torch's: 25, the first bucket 1 MiB",
        above=0,
    )
    gradient_as_bucket_view: bool = _opt(False, "let gradients alias the DDP buckets")
    static_graph: bool = _opt(False, "tell DDP the graph is the same every step")
    broadcast_buffers: bool = _opt(
        True,
        "broadcast rank 0's buffers (BatchNorm statistics) before every forward, as DDP does by default; Horovod and "
        "FSDP2 never do, and what a model with BatchNorm computes then differs",
        "on; compare and tune: off for every variant when one of them cannot (horovod, fsdp)",
    )
    find_unused_parameters: bool = _opt(False, "search the graph for parameters that got no gradient")


@dataclass
class HorovodConfig:
    """Knobs of horovod.torch (defaults are Horovod 0.28's)."""

    fusion_threshold_mb: float = _opt(
        128.0,
        "Horovod tensor-fusion buffer in MB (HOROVOD_FUSION_THRESHOLD, whose exported value is taken when this is "
        "not given); 0 turns fusion off",
        at_least=0,
    )
    cycle_time_ms: float = _opt(
        1.0, "Horovod background cycle time in ms (HOROVOD_CYCLE_TIME, whose exported value is taken likewise)", above=0
    )
    hvd_op: str = _opt("average", "Horovod reduction op: average or adasum", choices=("average", "adasum"))
    autotune: bool = _opt(
        False,
        "Horovod's autotuner (HOROVOD_AUTOTUNE=1, whose exported value is taken likewise) searches fusion threshold, "
        "cycle time, hierarchical allreduce/allgather and response cache during the warm-up, which must hold its "
        "whole search (docs/fairness.md); its log is the run's autotune.csv and run.json knobs.autotuned what it "
        "settled on; --fusion-threshold-mb or --cycle-time-ms away from its default is held constant; tune: a "
        "third setting beside default and best",
    )


FSDP_UNITS = ("auto", "blocks", "leaves", "root")
"""`--fsdp-units`' policies; backends.fsdp.units_of says which modules each makes FSDP units."""


@dataclass
class FSDPConfig:
    """Knobs of FSDP2, torch.distributed.fsdp.fully_shard (defaults are FSDP2's where it has one)."""

    fsdp_units: str = _opt(
        "auto",
        "which modules become FSDP units, each gathered and reduce-scattered as one: blocks (every child with "
        "parameters of an nn.ModuleList or nn.Sequential: layers, stages), leaves (every module without children "
        "holding at least --fsdp-min-params parameters), root (the whole model as one unit), auto (blocks where "
        "the model has any, else leaves); the root is always the last unit; a module sharing a parameter with "
        "another is left to the root; run.json knobs lists the units",
        choices=FSDP_UNITS,
    )
    fsdp_min_params: int = _opt(
        100_000,
        "with --fsdp-units leaves or auto: the fewest parameters a leaf module needs to be its own unit",
        above=0,
    )
    reshard_after_forward: bool = _opt(
        True,
        "free each unit's gathered parameters after forward and gather them again in backward (FSDP2's default; "
        "the root unit keeps its own, as FSDP2 does); off: keep every unit's until backward, one all-gather less "
        "per unit for more memory",
    )

    def check(self) -> None:
        """Refuse a knob that would have no effect under the chosen policy."""
        if self.fsdp_min_params != FSDPConfig.fsdp_min_params and self.fsdp_units in ("blocks", "root"):
            raise InputError(
                f"--fsdp-min-params applies only with --fsdp-units leaves or auto, not {self.fsdp_units}; "
                "leave it out or choose leaves"
            )


ALLREDUCE_IMPLS = ("torch", "horovod", "mpi4py")
COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")
"""`distbench allreduce --collective` choices: DDP's and Horovod's allreduce, then the two FSDP2 uses."""
DTYPES = {"float32": 4, "float16": 2}
"""`distbench allreduce --dtype` choices and their bytes per element."""
DEFAULT_SIZES = "4-256M"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'4', '1K', '64M', '1GiB', '256MB' → bytes (binary units: K = 1024)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not match:
        raise InputError(f"--sizes: '{text}' is not a size; write bytes with an optional K, M or G, e.g. 4, 1K, 64M")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_sizes(text: str) -> list[int]:
    """'1K,1M,64M' → those sizes; 'A-B' → every power-of-two multiple of A up to B. Sorted, no duplicates."""
    sizes: set[int] = set()
    for item in (part for part in text.split(",") if part.strip()):
        low, sep, high = item.partition("-")
        first = parse_size(low)
        last = parse_size(high) if sep else first
        if first < 1 or last < first:
            raise InputError(f"--sizes: '{item.strip()}' is not a positive size or a range low-high, e.g. 4-256M")
        while first <= last:
            sizes.add(first)
            first *= 2
    if not sizes:
        raise InputError("--sizes is empty; e.g. --sizes 1K,1M,64M or --sizes 4-256M")
    return sorted(sizes)


def format_size(size_bytes: int) -> str:
    """4 → '4 B', 1024 → '1 KiB', 3 MiB → '3 MiB' (the largest binary unit that divides it)."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size_bytes % unit == 0:
            return f"{size_bytes // unit} {name}"
    return f"{size_bytes} B"


ZERO_STAGES = (0, 1, 2, 3)


@dataclass
class DeepSpeedConfig:
    """Knobs of DeepSpeed's engine and ZeRO (defaults are DeepSpeed's)."""

    zero_stage: int = _opt(
        0,
        "DeepSpeed's ZeRO stage: 0 (data parallel, the gradients allreduced), 1 (the optimizer state partitioned), "
        "2 (and the gradients, reduce-scattered), 3 (and the parameters, gathered per layer)",
    )
    reduce_bucket_size: int | None = _opt(
        None,
        "ZeRO's reduce bucket, in elements (zero_optimization.reduce_bucket_size)",
        "DeepSpeed's: 500000000",
        above=0,
    )
    allgather_bucket_size: int | None = _opt(
        None,
        "ZeRO stage 1-2's all-gather bucket, in elements (zero_optimization.allgather_bucket_size)",
        "DeepSpeed's: 500000000",
        above=0,
    )
    overlap_comm: bool = _opt(
        False,
        "overlap ZeRO's gradient reduction with backward (zero_optimization.overlap_comm)",
        "DeepSpeed's: off, on at stage 3",
    )

    def check(self) -> None:
        """Refuse a stage DeepSpeed lacks, and a knob the stage leaves unused."""
        if self.zero_stage not in ZERO_STAGES:
            raise InputError(f"--zero-stage must be 0, 1, 2 or 3 (DeepSpeed's ZeRO stages), got {self.zero_stage}")
        inert = {
            "--reduce-bucket-size": self.reduce_bucket_size is not None and self.zero_stage == 0,
            "--overlap-comm": self.overlap_comm and self.zero_stage == 0,
            "--allgather-bucket-size": self.allgather_bucket_size is not None and self.zero_stage in (0, 3),
        }
        if said := [flag for flag, unused in inert.items() if unused]:
            raise InputError(
                f"{', '.join(said)} cannot affect --zero-stage {self.zero_stage} (ZeRO's buckets and overlap apply "
                "from stage 1, its all-gather bucket at stages 1-2); give a stage that uses them, or leave them out"
            )


@dataclass
class AllreduceConfig:
    """`distbench allreduce`: one implementation's sweep under the launcher that started it (run.json `config`)."""

    impl: str | None = _opt(
        None,
        "what to measure under this launcher: torch.distributed (gloo on CPU, nccl on CUDA), Horovod's "
        "hvd.allreduce_ (the controller its launcher gives it) or mpi4py's Allreduce",
        "required without --compare",
        choices=ALLREDUCE_IMPLS,
    )
    collective: str = _opt(
        "allreduce",
        "the collective timed: allreduce (in place), reduce_scatter (out of place) or all_gather (in place), "
        "SUM where it reduces; --sizes is the whole buffer (reduce_scatter's input, all_gather's output), as "
        "nccl-tests counts it; reduce_scatter and all_gather for --impl torch only",
        choices=COLLECTIVES,
    )
    sizes: list[int] = field(
        default_factory=lambda: parse_sizes(DEFAULT_SIZES),
        metadata={
            "help": "message sizes in bytes: a list like 1K,1M,64M (K, M, G are binary) or a power-of-two "
            "range low-high",
            "shown": f"{DEFAULT_SIZES}, i.e. 4 B to 256 MiB",
            "text": DEFAULT_SIZES,
            "parse": parse_sizes,
        },
    )
    dtype: str = _opt("float32", "element type", choices=tuple(DTYPES))
    iters: int | None = _opt(
        None, "timed iterations per size", "enough for ~0.5 s, from the warm-up's median call; 5 to 100000"
    )
    warmup: int | None = _opt(None, "untimed iterations before each size", "64 MiB's worth, 1 to 10")
    device: str = _opt(
        "cpu", "where the buffers live; cuda: one GPU per local rank, torch uses nccl", choices=("cpu", "cuda")
    )
    threads: int | None = _opt(None, "torch intra-op threads per rank", "cores ÷ local ranks")
    out: str = _opt("results/allreduce", "directory that receives <run-id>/")
    run_id: str | None = _opt(None, "name of the run (or --compare) directory", "time-allreduce-impl-wN-xxxx")
    overwrite: bool = _opt(False, "replace an existing run directory of that --run-id")
    timeout: float = _opt(300.0, "seconds a rank may make no progress before the run fails")
    quiet: bool = _opt(False, "no progress bar (the bar is on rank 0 only)")
    inject_wrong_result: bool = _opt(
        False, "testing: one rank's reduced buffer is changed before the check, which must catch it", hidden=True
    )


@dataclass
class NoOptions:
    """A backend without knobs of its own (`single`)."""


def no_timed_steps(cfg: RunConfig, steps_per_epoch: int) -> InputError:
    """Too few steps for any to be timed after warm-up: a summary of nothing (nan) is bad input instead."""
    return InputError(
        f"--epochs {cfg.epochs} × {steps_per_epoch} steps per epoch leaves no timed step after --warmup-steps "
        f"{cfg.warmup_steps}; raise --steps-per-epoch or --epochs, or lower --warmup-steps"
    )


SECTIONS: tuple[type, ...] = (RunConfig, DDPConfig, HorovodConfig, FSDPConfig)
T = TypeVar("T")


def workload_defaults_text(name: str) -> str:
    """What `None` means for an option each workload sets, value by value: "mlp, cnn 0.05; transformer 0.3"."""
    by_value: dict[Any, list[str]] = {}
    for workload in catalog.REGISTRY:
        by_value.setdefault(catalog.defaults_for(workload).get(name, "its own"), []).append(workload)
    by_value.setdefault(catalog.GENERIC_DEFAULTS.get(name, "its own"), []).append("module:factory")
    return f"{WORKLOAD_DEFAULT}: " + "; ".join(f"{', '.join(names)} {value}" for value, names in by_value.items())


def default_text(f: dataclasses.Field[Any]) -> str:
    """The default a user gets, in words: shown in --help and in docs/commands.md's option table."""
    if f.metadata.get("shown") == WORKLOAD_DEFAULT:
        return workload_defaults_text(f.name)
    if f.metadata.get("shown"):
        return f.metadata["shown"]
    if f.default is None:
        return "none"
    if isinstance(f.default, bool):
        return "on" if f.default else "off"
    return str(f.default)


def flag(name: str) -> str:
    """The `--kebab-case` option of a config field name."""
    return "--" + name.replace("_", "-")


def flag_of(f: dataclasses.Field[Any]) -> str:
    return flag(f.name)


def negated_flag_of(f: dataclasses.Field[Any]) -> str:
    """`--no-x`, which turns off a bool option that defaults to on."""
    return "--no-" + f.name.replace("_", "-")


def check_values(section_obj: Any) -> None:
    """Refuse a backend option outside its range or choices (metadata `above`, `at_least`, `choices`), so a
    value given on the command line and one from a tune grid are held to the same rule."""
    for f in dataclasses.fields(section_obj):
        value, meta = getattr(section_obj, f.name), f.metadata
        if value is None:  # not given: the framework's own default
            continue
        if "choices" in meta and value not in meta["choices"]:
            raise InputError(f"{flag_of(f)} must be one of {', '.join(meta['choices'])}, got {value!r}")
        if "above" in meta and not value > meta["above"]:
            raise InputError(f"{flag_of(f)} must be greater than {meta['above']}, got {value}")
        if "at_least" in meta and not value >= meta["at_least"]:
            raise InputError(f"{flag_of(f)} must be at least {meta['at_least']}, got {value}")
    if hasattr(section_obj, "check"):  # a rule between a section's own fields
        section_obj.check()


GIVEN = "_options_given"
"""The namespace attribute that lists the options given on the command line (`given_explicitly`)."""


class _StoreGiven(argparse.Action):
    """argparse's plain store, which also notes that the option was given: an option that an exported
    variable also sets is adopted from it only when not given (benchmarks.environment.adopt)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.dest})


def given_explicitly(args: argparse.Namespace) -> frozenset[str]:
    """The field names of the (non-flag) options given on the command line, whatever their value."""
    return frozenset(getattr(args, GIVEN, ()))


def add_arguments(parser: argparse.ArgumentParser, section: type) -> None:
    """Add one `--kebab-case` option per field of a config dataclass."""
    group = parser.add_argument_group(section.__name__, section.__doc__)
    for f in dataclasses.fields(section):
        # A field parsed from text (metadata `parse`) gets its text default; from_namespace parses it, so a
        # bad value is an InputError said once by rank 0 rather than argparse's usage error on every rank.
        default = f.metadata.get("text", f.default)
        # %(default)s, not the field's default, so a sub-command's set_defaults shows in its --help.
        plain = not f.metadata.get("shown") and default is not None and not isinstance(default, bool)
        shown = "%(default)s" if plain else default_text(f).replace("%", "%%")
        help_text = f.metadata["help"].replace("%", "%%") + f" (default: {shown})"
        if f.metadata.get("hidden"):
            help_text = argparse.SUPPRESS
        if f.type in ("bool", bool):
            action = argparse.BooleanOptionalAction if f.default else "store_true"
            # Set help after construction: BooleanOptionalAction appends its own "(default: True)" on 3.10/3.11.
            group.add_argument(flag_of(f), action=action, default=f.default).help = help_text
            continue
        kind = {"int": int, "int | None": int, "float": float, "float | None": float}.get(str(f.type), str)
        # `const`: the flag alone means that value (--compile), while compare still takes a list after it.
        optional = {"nargs": "?", "const": f.metadata["const"]} if "const" in f.metadata else {}
        group.add_argument(
            flag_of(f),
            type=kind,
            default=default,
            help=help_text,
            choices=f.metadata.get("choices"),
            action=_StoreGiven,
            **optional,
        )


def from_namespace(section: type[T], args: argparse.Namespace) -> T:
    """The section's object from parsed options; raises InputError for a text option its `parse` refuses."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(section)}
    for f in dataclasses.fields(section):
        if "parse" in f.metadata and isinstance(values[f.name], str):
            values[f.name] = f.metadata["parse"](values[f.name])
    return section(**values)


def to_argv(section_obj: Any) -> list[str]:
    """The CLI options that reproduce a config object (used by `compare` to pass options through)."""
    argv: list[str] = []
    for f in dataclasses.fields(section_obj):
        value = getattr(section_obj, f.name)
        if isinstance(value, bool):
            if value != f.default:
                argv.append(flag_of(f) if value else negated_flag_of(f))
        elif value is not None and value != f.default:
            argv += [flag_of(f), str(value)]
    return argv


def all_options(args: argparse.Namespace) -> dict[str, Any]:
    """Every run option's value, backend sections included, flat by field name (run.json `config`)."""
    return {f.name: getattr(args, f.name) for section in SECTIONS for f in dataclasses.fields(section)}


def inert_options(args: argparse.Namespace, own: type) -> list[str]:
    """Flags of another backend's section set away from their default: they cannot affect this backend."""
    return [
        negated_flag_of(f) if f.default is True else flag_of(f)
        for section in SECTIONS
        if section is not RunConfig and section is not own
        for f in dataclasses.fields(section)
        if getattr(args, f.name) != f.default
    ]


def _option_rows(section: type) -> list[str]:
    rows = []
    for f in dataclasses.fields(section):
        if not f.metadata.get("hidden"):
            flags = f"{flag_of(f)}` / `{negated_flag_of(f)}" if f.default is True else flag_of(f)
            rows.append(f"| `{flags}` | {default_text(f)} | {f.metadata['help']} |")
    return rows


def option_table(names: Sequence[str]) -> str:
    """The manual's `distbench run` option table, generated from the dataclasses (a test keeps them equal);
    `names`: the backends declared (backends.NAMES), whose sections SECTIONS holds once they are declared."""
    listed = ", ".join(f"`{n}`" for n in names[:-1]) + f" or `{names[-1]}`"
    backend = f"| `--backend` | — | {listed} |"
    rows = ["| option | default | meaning |", "|---|---|---|", backend]
    for section in SECTIONS:
        if section is not RunConfig:
            doc = " ".join((section.__doc__ or "").split())
            rows.append(f"| **{section.__name__}** | | {doc} Other backends ignore these (with a warning). |")
        rows += _option_rows(section)
    return "\n".join(rows) + "\n"


def allreduce_option_table() -> str:
    """The manual's table of `distbench allreduce`'s sweep options (a test keeps them equal)."""
    return "\n".join(["| option | default | meaning |", "|---|---|---|", *_option_rows(AllreduceConfig)]) + "\n"
