"""`make gpu-check`'s steps dry-run on CPU: the same commands, launchers, result reading and summary as on a
GPU, with small workloads, `--device cpu`, and the wheel installed into a folder rather than the Python
(the editable install of this checkout stays as it is). What cannot pass without CUDA (doctor's device
line, the CUDA peak memory) is expected to fail; everything else must pass."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_GPU = {"torch": "cpu", "cuda": None, "gpus": 1, "names": ["(dry run)"], "capability": [9, 0]}


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docker" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The rehearsal of a GPU machine's `make gpu-check` (about 17 processes) runs in `make test-all`; the unit tests
# of tests/unit/test_gpu_check.py check its steps' logic in `make test-fast`.
@pytest.mark.full_matrix
@pytest.mark.timeout(600)
def test_every_gpu_check_step_runs_and_is_read_on_cpu(tmp_path, monkeypatch, horovod_available) -> None:
    gpu_check, gpu_bundle = load("gpu_check"), load("gpu_bundle")
    bundle, site = tmp_path / "bundle", tmp_path / "site"
    gpu_bundle.build(bundle)

    def install(c) -> bool:
        wheel = next(c.bundle.glob("distbench-*.whl"))
        rc, text = c.run(
            "install",
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
            120,
        )
        c.env["PYTHONPATH"] = str(site)
        c.add("install", "pass" if rc == 0 else "fail", gpu_check.last_line(text))
        return rc == 0

    monkeypatch.setattr(gpu_check, "probe_cuda", lambda python: dict(FAKE_GPU))
    monkeypatch.setattr(gpu_check, "install", install)
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_check, "CNN", ("cnn", 12, 32 * 17, 8))
    monkeypatch.setattr(gpu_check, "GPT2", ("transformer", 8, 16 * 13, 8))
    out = tmp_path / "out"
    assert gpu_check.main(["--bundle", str(bundle), "--out", str(out)]) == 1  # CUDA's own checks fail

    summary = json.loads((out / "summary.json").read_text())
    status = {r["name"]: r["status"] for r in summary["results"]}
    expected_failures = {"doctor", "memory-cnn", "memory-transformer"}
    assert {n for n, s in status.items() if s == "fail"} == expected_failures, status
    for name in (
        "install",
        "single-cnn-1",
        "single-cnn-2",
        "single-transformer-1",
        "ddp-cnn",
        "ddp-transformer",
        "fsdp-cnn",
        "fsdp-transformer",
        "fsdp-vs-ddp-cnn",
        "allreduce",
        "single-cnn-step",
        "ddp-cnn-step",
        "fsdp-cnn-step",
        "check",
    ):
        assert status[name] == "pass", (name, status)
    ratio = next(r for r in summary["results"] if r["name"] == "ratio-cnn")
    assert ratio["status"] in ("pass", "warn") and ratio["numbers"]["ratio"] > 0
    # On CPU this Horovod has no NCCL (a warning), but its 1-rank run under horovodrun --gloo completes.
    assert status["horovod-build"] == "warn" and status["horovod-cnn"] == status["horovod-cnn-step"] == "pass"
    text = (out / "summary.md").read_text()
    assert text.startswith("# distbench gpu-check: FAILED") and "| ratio-cnn |" in text
    assert "NCCL refuses two ranks on one device" in text
    assert {p.name for p in (out / "runs").iterdir()} >= {"single-cnn-1", "ddp-transformer", "horovod-cnn"}
