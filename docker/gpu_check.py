"""`make gpu-check`: distbench's GPU path on a lent GPU machine, in about 8 minutes, with no network.

Run from the repository root with gpu-bundle/ present (`make gpu-bundle` on a machine with a registry).
It installs the bundled wheel into this Python (no dependencies, no index), then runs each check with its
own timeout inside one budget: doctor; `single`, 1-rank DDP and 1-rank FSDP2 (NCCL, torchrun) runs of
cnn and gpt2-small on CUDA, FSDP2's speed and CUDA peak beside DDP's; the step users run (bf16 autocast,
compiled, clipped) under single, DDP and FSDP2 with its MFU; the harness against a hand-written
loop of the same model and batches (docker/gpu_raw_loop.py); `distbench allreduce --impl torch --device
cuda`; the CUDA peak memory; `distbench check` over everything; last, time-boxed and not fatal, Horovod
built with NCCL from the bundled sdist and a 1-rank Horovod run, plain and with the users' step. Results,
logs and summary.md go under one folder.

Exit 0 when every required check passed, 1 when one failed, 2 without a CUDA device or a usable bundle.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 480.0
PACKAGES = ("backends", "benchmarks")
RATIO_TARGET = 0.99
PROBE = """import json, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": n,
                  "names": [torch.cuda.get_device_name(i) for i in range(n)],
                  "capability": list(torch.cuda.get_device_capability(0)) if n else None}))"""
DEVICE = "cuda"
"""Every step's device (a test dry-runs the steps on cpu)."""
RUN_ARGS = ["--epochs", "1", "--warmup-steps", "5", "--quiet"]
# (workload, timed steps of a ratio run, train size for them, steps of a DDP run)
CNN, GPT2 = ("cnn", 400, 32 * 405, 20), ("gpt2-small", 50, 512, 20)
STEP = ("--amp", "bf16", "--compile", "--clip-grad-norm", "1.0")
"""The step users run (docs/commands.md): its rows are not fatal, since a first compile may outlast its slot."""


def fail_fast(message: str) -> int:
    print(f"distbench: error: {message}", file=sys.stderr)
    return 2


def probe_cuda(python: str) -> dict | str:
    """What torch in `python` sees, in a child process (this one keeps no CUDA context), or why it cannot."""
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "importing torch took over 2 minutes"
    if done.returncode != 0:
        return "torch is not importable"
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    return facts if facts["gpus"] else f"torch {facts['torch']} sees no CUDA device"


def stale_files(wheel: Path) -> list[str]:
    """Package files where the bundled wheel and this tree differ: a wheel of an older tree tests old code."""
    with zipfile.ZipFile(wheel) as archive:
        inside = {n: archive.read(n) for n in archive.namelist() if n.split("/")[0] in PACKAGES}
    tree = {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    differ = [n for n, data in inside.items() if not (ROOT / n).is_file() or (ROOT / n).read_bytes() != data]
    return sorted(differ + [n for n in tree if n not in inside])


@dataclass
class Result:
    name: str
    status: str
    """pass, fail, or warn (a non-required step that failed, or a ratio below target)."""
    detail: str
    required: bool
    numbers: dict[str, Any]


@dataclass
class Check:
    """The steps' shared state: where results go, the environment, the time left."""

    out: Path
    bundle: Path
    env: dict[str, str]
    deadline: float
    results: list[Result] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run one step in the output folder (so the installed package is what runs); rc -1: out of time."""
        limit = min(timeout, self.left())
        log = self.out / "logs" / f"{name}.log"
        if limit < 5:
            log.write_text("not run: the budget was spent\n")
            return -1, "not run: the budget was spent"
        # Its own session: a timeout must stop the whole tree (torchrun's workers, make's compilers), or a
        # worker left behind would hold the GPU for the steps after it.
        child = subprocess.Popen(
            argv,
            cwd=self.out,
            env=env or self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            text, _ = child.communicate(timeout=limit)
            rc = child.returncode
        except BaseException as exc:  # SIGTERM to this process arrives as SystemExit: stop the step too
            if not isinstance(exc, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                raise
            text = ""
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, sig)
                try:  # retrying keeps what was read so far
                    text = child.communicate(timeout=10)[0] or ""
                    break
                except subprocess.TimeoutExpired:
                    pass
            rc, text = -1, f"{text}\ntimed out after {limit:.0f} s\n"
        log.write_text(f"$ {' '.join(argv)}\n{text}")
        return rc, text

    def add(self, name: str, status: str, detail: str, required: bool = True, **numbers: Any) -> None:
        self.results.append(Result(name, status, detail, required, numbers))
        print(f"[gpu-check] {status:>4}  {name}: {detail}", flush=True)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def install(c: Check) -> bool:
    """The bundled wheel into this Python; PEP 668 (a distribution's Python) is passed once, and said."""
    wheel = next(c.bundle.glob("distbench-*.whl"))
    argv = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)]
    rc, text = c.run("install", argv, 120)
    if rc != 0 and "externally-managed-environment" in text:
        c.env["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
        c.notes.append("this Python is externally managed (PEP 668): pip ran with PIP_BREAK_SYSTEM_PACKAGES=1")
        rc, text = c.run("install", argv, 120)
    where_rc, where = c.run("import", [sys.executable, "-c", "import benchmarks; print(benchmarks.__file__)"], 60)
    module = Path(last_line(where)).resolve()
    installed = rc == 0 and where_rc == 0 and not module.is_relative_to(ROOT / "benchmarks")
    c.add("install", "pass" if installed else "fail", last_line(where) if installed else last_line(text))
    return installed


def read_run(run_dir: Path) -> tuple[str, dict]:
    """'' and summary.csv's row when the run completed with finite numbers; otherwise what is wrong."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
        with open(run_dir / "summary.csv", newline="") as handle:
            row = next(csv.DictReader(handle))
    except (OSError, ValueError, StopIteration) as exc:
        return f"no result ({type(exc).__name__})", {}
    if meta.get("status") != "completed":
        return f"status {meta.get('status')}: {meta.get('error', '')}"[:200], row
    for column in ("samples_per_s", "final_train_loss", "final_val_loss"):
        value = number(row.get(column))
        if not math.isfinite(value) or (column == "samples_per_s" and value <= 0):
            return f"{column} is {row.get(column)!r}", row
    return "", row


def phase_share(run_dir: Path) -> float:
    """Median over timed steps of (data + forward + backward + optimizer) / step_s: CUDA events tile the
    step, so about 1; far below means the events missed work, above means they timed more than the step."""
    with open(run_dir / "timing.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["warmup"] in ("False", "false", "0")]
    shares = sorted(
        sum(float(r[c]) for c in ("data_s", "forward_s", "backward_s", "optimizer_s")) / float(r["step_s"])
        for r in rows
    )
    return shares[len(shares) // 2] if shares else math.nan


def distbench_run(
    c: Check,
    name: str,
    backend: str,
    workload: tuple,
    steps: int,
    timeout: float,
    *,
    train_size: int | None = None,
    launcher: tuple[str, ...] = (),
    required: bool = True,
    extra: tuple[str, ...] = (),
) -> dict:
    """One `distbench run` on CUDA, bare or under a launcher (`python -m <launcher> ...`), with `extra` options;
    summary.csv's row."""
    argv = [
        sys.executable,
        *launcher,
        "-m",
        "benchmarks.cli",
        "run",
        "--backend",
        backend,
        "--workload",
        workload[0],
        "--device",
        DEVICE,
        *RUN_ARGS,
        "--steps-per-epoch",
        str(steps + 5),
        "--out",
        str(c.out / "runs"),
        "--run-id",
        name,
        *extra,
    ]
    if train_size:
        argv += ["--train-size", str(train_size)]
    rc, text = c.run(name, argv, timeout)
    problem, row = read_run(c.out / "runs" / name) if rc == 0 else (last_line(text) or f"exit {rc}", {})
    if problem:
        c.add(name, "fail" if required else "warn", problem, required)
        return {}
    share = phase_share(c.out / "runs" / name)
    ok = 0.8 <= share <= 1.02
    detail = f"{float(row['samples_per_s']):.1f} samples/s, step p50 {float(row['step_p50_s']) * 1e3:.2f} ms, "
    detail += f"phases/step {share:.3f}" + ("" if ok else " (the CUDA-event phases do not tile the step)")
    if extra and row.get("mfu"):
        detail += f", MFU {float(row['mfu']):.1%} of {float(row['peak_tflops']):.0f} TFLOP/s"
    c.add(
        name,
        "pass" if ok else ("fail" if required else "warn"),
        detail,
        required,
        samples_per_s=float(row["samples_per_s"]),
        phase_share=share,
    )
    return row


def raw_loop(c: Check, name: str, workload: tuple, timeout: float) -> dict:
    wname, steps, train_size, _ = workload
    argv = [
        sys.executable,
        str(ROOT / "docker" / "gpu_raw_loop.py"),
        "--workload",
        wname,
        "--steps",
        str(steps),
        "--warmup",
        "5",
        "--train-size",
        str(train_size),
        "--device",
        DEVICE,
    ]
    rc, text = c.run(name, argv, timeout)
    lines = [line for line in text.splitlines() if line.startswith("{")]  # warnings may come after it
    try:
        return json.loads(lines[-1]) if rc == 0 and lines else {}
    except ValueError:
        return {}


def ratio(c: Check, workload: tuple, repeats: int, timeout: float) -> dict:
    """Harness (single) and raw loop, alternated; best of each against best of the other."""
    wname = workload[0]
    harness, raw, runs = [], [], []
    for i in range(repeats):
        name = f"single-{wname}-{i + 1}"
        row = distbench_run(c, name, "single", workload, workload[1], timeout, train_size=workload[2])
        got = raw_loop(c, f"raw-{wname}-{i + 1}", workload, timeout)
        harness += [float(row["samples_per_s"])] if row else []
        raw += [got] if got else []
        runs.append(row)
    if not harness or not raw:
        c.add(f"ratio-{wname}", "fail", "no harness or no raw-loop throughput (see logs/)")
        return {}
    best = max(raw, key=lambda r: r["samples_per_s"])
    value = max(harness) / best["samples_per_s"]
    synced = max(r["samples_per_s_sync_each_step"] for r in raw)
    detail = (
        f"harness/raw {value:.3f} (target >= {RATIO_TARGET}); harness {max(harness):.1f}, raw "
        f"{best['samples_per_s']:.1f}, raw with a sync per step {synced:.1f} samples/s"
    )
    c.add(
        f"ratio-{wname}",
        "pass" if value >= RATIO_TARGET else "warn",
        detail,
        False,
        ratio=value,
        harness=max(harness),
        raw=best["samples_per_s"],
        raw_sync_each_step=synced,
    )
    return {"raw": best, "harness": next((r for r in runs if r), {})}


def number(value: Any) -> float:
    """A CSV cell or JSON value as a float; nan for an empty or missing one."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def memory(c: Check, wname: str, pair: dict) -> None:
    """Peak CUDA memory: summary.csv's column (issue 17) where the run wrote one, else the raw loop's."""
    raw, row = pair.get("raw", {}), pair.get("harness", {})
    ours, theirs = number(row.get("cuda_max_allocated_mb_max")), number(raw.get("cuda_max_allocated_mb"))
    peak, where = (ours, "summary.csv") if math.isfinite(ours) else (theirs, "the raw loop (no summary.csv column)")
    floor = 2 * number(raw.get("parameter_mb"))  # weights and gradients at least
    ok = math.isfinite(peak) and peak >= floor
    detail = f"{peak:.0f} MiB from {where}; raw loop {theirs:.0f} MiB; weights + gradients {floor:.0f} MiB"
    c.add(f"memory-{wname}", "pass" if ok else "fail", detail, peak_mb=peak, raw_peak_mb=theirs)


def sharded_beside_ddp(c: Check, wname: str, pair: dict[str, dict]) -> None:
    """FSDP2's throughput and CUDA peak beside DDP's (reported, not required: at one rank FSDP2 shards over
    one device, so what this shows is its extra work, not the memory sharding saves at W ranks)."""
    ddp, fsdp = pair.get("ddp", {}), pair.get("fsdp", {})
    if not ddp or not fsdp:
        return  # the failed run has its own row
    speed = number(fsdp.get("samples_per_s")) / number(ddp.get("samples_per_s"))
    peaks = [number(row.get("cuda_max_allocated_mb_max")) for row in (fsdp, ddp)]
    detail = f"fsdp {speed:.2f}x DDP's samples/s; CUDA peak {peaks[0]:.0f} vs {peaks[1]:.0f} MiB (fsdp vs ddp)"
    c.add(f"fsdp-vs-ddp-{wname}", "pass", detail, False, speed_ratio=speed, fsdp_peak_mb=peaks[0], ddp_peak_mb=peaks[1])


def allreduce(c: Check, gpus: int) -> None:
    ranks = min(2, gpus)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "-m",
        "benchmarks.cli",
        "allreduce",
        "--impl",
        "torch",
        "--device",
        DEVICE,
        "--quiet",
        "--out",
        str(c.out / "allreduce"),
        "--run-id",
        f"torch-nccl-w{ranks}",
    ]
    rc, text = c.run("allreduce", argv, 150)
    path = c.out / "allreduce" / f"torch-nccl-w{ranks}" / "allreduce.csv"
    rows = list(csv.DictReader(path.open(newline=""))) if rc == 0 and path.is_file() else []
    # algbw, not busbw: at one rank busbw is 0 by definition (2(n-1)/n).
    good = rows and all(r["correct"] == "True" and float(r["algbw_gbps"]) > 0 for r in rows)
    if not good:
        c.add("allreduce", "fail", last_line(text) or f"exit {rc}, {len(rows)} sizes")
        return
    top = max(rows, key=lambda r: int(r["size_bytes"]))
    detail = f"{ranks} rank(s), {len(rows)} sizes exact; at {top['size_bytes']} B algbw "
    detail += f"{float(top['algbw_gbps']):.1f} GB/s, busbw {float(top['busbw_gbps']):.1f} GB/s"
    c.add("allreduce", "pass", detail, algbw_gbps=float(top["algbw_gbps"]), busbw_gbps=float(top["busbw_gbps"]))


def horovod(c: Check, facts: dict) -> None:
    """Not fatal: Horovod 0.28.1 with NCCL from the bundled sdist, then a 1-rank run under horovodrun --gloo."""
    cache = Path(tempfile.mkdtemp(prefix="distbench-gpu-check-"))
    env = {**c.env, "HOROVOD_SDIST": str(c.bundle / "horovod-0.28.1.tar.gz"), "DISTBENCH_CACHE": str(cache)}
    env.setdefault("HOROVOD_BUILD_CUDA_CC_LIST", "".join(map(str, facts["capability"])))
    if shutil.which("mpicxx", path=env["PATH"]) is None:
        env["HOROVOD_WITHOUT_MPI"] = "1"
        c.notes.append("no mpicxx here: Horovod was built with Gloo alone (HOROVOD_WITHOUT_MPI=1)")
    recipe = ["bash", str(ROOT / "docker" / "install-horovod.sh"), sys.executable]
    try:
        rc, text = c.run("horovod-build", recipe, max(0.0, min(300.0, c.left() - 60)), env)
        for log in (cache / "logs").glob("*.log"):
            shutil.copy2(log, c.out / "logs" / "horovod-build-full.log")
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # the built wheel: installed, and not a result
    if rc != 0:
        c.add("horovod-build", "warn", last_line(text) or "timed out", False)
        return
    rc, text = c.run("doctor-horovod", [sys.executable, "-m", "benchmarks.cli", "doctor"], 60)
    built = next((line.strip() for line in text.splitlines() if "horovod with:" in line), last_line(text))
    c.add("horovod-build", "pass" if rc == 0 and "NCCL yes" in built else "warn", built, False)
    launcher = ("-m", "horovod.runner.launch", "-np", "1", "-H", "localhost:1", "--gloo", sys.executable)
    distbench_run(c, "horovod-cnn", "horovod", CNN, CNN[3], 90, launcher=launcher, required=False)
    distbench_run(c, "horovod-cnn-step", "horovod", CNN, CNN[3], 150, launcher=launcher, required=False, extra=STEP)


def users_step(c: Check) -> None:
    """Not fatal: the step users run on a GPU (bf16 autocast, compiled, clipped) under single, DDP and FSDP2,
    with its MFU against the datasheet-free measured bf16 matmul peak; the compile time is in run.json."""
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1")
    for backend, launcher in (("single", ()), ("ddp", torchrun), ("fsdp", torchrun)):
        distbench_run(
            c, f"{backend}-cnn-step", backend, CNN, CNN[3], 150, launcher=launcher, required=False, extra=STEP
        )


def steps(c: Check, facts: dict) -> None:
    if not install(c):
        return
    rc, text = c.run("doctor", [sys.executable, "-m", "benchmarks.cli", "doctor"], 60)
    (c.out / "doctor.txt").write_text(text)
    # Before the Horovod step, doctor's one complaint may be that Horovod is missing.
    sees = "no CUDA devices" not in text and (rc == 0 or (rc == 1 and "horovod.torch cannot be imported" in text))
    cuda = next((line.strip() for line in text.splitlines() if line.strip().startswith("cuda:")), "no cuda line")
    c.add("doctor", "pass" if sees else "fail", cuda)
    for workload, repeats, timeout in ((CNN, 2, 60), (GPT2, 1, 120)):
        pair = ratio(c, workload, repeats, timeout)
        memory(c, workload[0], pair)
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1")
    for workload, timeout in ((CNN, 90), (GPT2, 120)):
        pair = {
            b: distbench_run(c, f"{b}-{workload[0]}", b, workload, workload[3], timeout, launcher=torchrun)
            for b in ("ddp", "fsdp")
        }
        sharded_beside_ddp(c, workload[0], pair)
    allreduce(c, facts["gpus"])
    users_step(c)
    dirs = [d for d in ("runs", "allreduce") if (c.out / d).is_dir()]
    rc, text = c.run("check", [sys.executable, "-m", "benchmarks.cli", "check", *dirs], 90)
    c.add("check", "pass" if rc == 0 else "fail", last_line(text) or "every run directory passes the contract")
    horovod(c, facts)


def write_summary(c: Check, facts: dict, spent_s: float, budget_s: float, code: int) -> None:
    """summary.md (one page: a row per check, the numbers, the notes) and summary.json beside it."""
    names = ", ".join(facts["names"])
    lines = [
        f"# distbench gpu-check: {'passed' if code == 0 else 'FAILED'}",
        "",
        f"{facts['gpus']} × {names}; torch {facts['torch']} (CUDA {facts['cuda']}); Python "
        f"{sys.version.split()[0]}; {spent_s:.0f} s of a {budget_s:.0f} s budget; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.",
        "",
        "| check | result | required | what was seen |",
        "|---|---|---|---|",
        *(
            f"| {r.name} | {r.status} | {'yes' if r.required else 'no'} | {r.detail.replace('|', '/')} |"
            for r in c.results
        ),
        "",
        f"Harness/raw ratio target: >= {RATIO_TARGET} (a ratio below it is reported, not failed). Run directories",
        "are under `runs/` and `allreduce/`, every step's output under `logs/`.",
        "",
        *(f"- {note}" for note in c.notes),
    ]
    (c.out / "summary.md").write_text("\n".join(lines) + "\n")
    record = {
        "passed": code == 0,
        "facts": facts,
        "spent_s": spent_s,
        "budget_s": budget_s,
        "notes": c.notes,
        "results": [r.__dict__ for r in c.results],
    }
    (c.out / "summary.json").write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=str(ROOT / "gpu-bundle"), help="what make gpu-bundle wrote")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    parser.add_argument("--out", default=str(ROOT / "results" / "runs" / "gpu-check" / stamp), help="output folder")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for every step together")
    args = parser.parse_args(argv)
    facts = probe_cuda(sys.executable)
    if isinstance(facts, str):
        return fail_fast(
            f"gpu-check needs a CUDA GPU and {sys.executable} has none ({facts}); run it on a GPU "
            "machine with gpu-bundle/ from make gpu-bundle (docs/gpu.md)"
        )
    bundle = Path(args.bundle).resolve()
    if not list(bundle.glob("distbench-*.whl")) or not (bundle / "horovod-0.28.1.tar.gz").is_file():
        return fail_fast(f"no gpu bundle in {bundle}; run make gpu-bundle on a machine with a package registry")
    stale = stale_files(next(bundle.glob("distbench-*.whl")))
    if stale:
        return fail_fast(
            f"{bundle.name}/ holds another tree ({len(stale)} files differ, e.g. {stale[0]}); run make gpu-bundle again"
        )
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(bundle / "wheels"), "PYTHONUNBUFFERED": "1"}
    if shutil.which("nvcc") is None and Path("/usr/local/cuda/bin/nvcc").exists():
        env["PATH"] = f"/usr/local/cuda/bin:{env.get('PATH', '')}"
    c = Check(out, bundle, env, time.monotonic() + args.budget)
    if facts["gpus"] == 1:
        c.notes.append("one GPU: every NCCL job has one rank (NCCL refuses two ranks on one device)")
    else:
        c.notes.append(f"{facts['gpus']} GPUs: one rank per GPU; allreduce ran on 2")
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        steps(c, facts)
    except (SystemExit, KeyboardInterrupt):
        c.add("interrupted", "fail", "stopped by a signal; the checks above are all that ran")
    code = 1 if any(r.required and r.status != "pass" for r in c.results) or not c.results else 0
    write_summary(c, facts, time.monotonic() - started, args.budget, code)
    print(f"[gpu-check] {'passed' if code == 0 else 'FAILED'}; summary: {out / 'summary.md'}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
