#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 against the PyTorch already in $PYTHON's environment.
#
# Horovod 0.28.1 is the last release and hard-codes C++14; PyTorch >= 2.1 headers need C++17.
# The fix is a one-word edit in *both* the root CMakeLists.txt and horovod/torch/CMakeLists.txt
# (editing only the second fails at link time with a duplicate gloo::rendezvous::Store::kDefaultTimeout).
# The built wheel is cached, keyed by Horovod, torch and Python versions and CPU/CUDA, so a second
# run takes seconds.
#
# Usage: docker/install-horovod.sh [PYTHON]        (default: .venv/bin/python, else python3)
# Env:   DISTBENCH_CACHE (default ~/.cache/distbench), HOROVOD_VERSION (default 0.28.1),
#        DISTBENCH_REBUILD_HOROVOD=1 ignores the cached wheel,
#        HOROVOD_SDIST=path/horovod-<ver>.tar.gz builds from that file instead of downloading (a machine
#        without a package registry: make gpu-bundle), HOROVOD_WITHOUT_MPI=1 builds with Gloo alone (no
#        Open MPI needed), HOROVOD_BUILD_CUDA_CC_LIST=90 builds CUDA kernels for that GPU only.
set -euo pipefail

HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
PYTHON="${1:-${PYTHON:-}}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
BIN_DIR="$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")"
CACHE_ROOT="${DISTBENCH_CACHE:-$HOME/.cache/distbench}"

say() { printf '[install-horovod] %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

"$PYTHON" -c 'import torch' 2>/dev/null \
  || die "torch is not importable by $PYTHON; install it first (make setup, or: $PYTHON -m pip install torch==2.13.0)"

# --- system prerequisites: Open MPI, cmake, a C++ compiler ----------------------------------------
if [[ "${HOROVOD_WITHOUT_MPI:-}" == 1 ]]; then
  for tool in cmake g++; do command -v "$tool" >/dev/null 2>&1 || die "$tool is missing; install it first"; done
else
  "$(dirname "$0")/install-system-deps.sh"
fi

# --- cache key ---------------------------------------------------------------------------------------
read -r TORCH_VERSION PY_TAG TORCH_CUDA < <("$PYTHON" - <<'PY'
import sys, torch
print(torch.__version__.split("+")[0], f"py{sys.version_info.major}{sys.version_info.minor}",
      torch.version.cuda or "none")
PY
)
if [[ "$TORCH_CUDA" != "none" ]] && command -v nvcc >/dev/null 2>&1; then
  FLAVOUR="cu${TORCH_CUDA//./}"
else
  FLAVOUR="cpu"
fi
KEY="horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}-${PY_TAG}-${FLAVOUR}"
if [[ "${HOROVOD_WITHOUT_MPI:-}" == 1 ]]; then KEY="$KEY-nompi"; fi
SDIST_CACHE="$CACHE_ROOT/sdist/horovod-$HOROVOD_VERSION.tar.gz"
WHEEL_DIR="$CACHE_ROOT/wheels/$KEY"

installed_ok() {
  "$PYTHON" - "$HOROVOD_VERSION" <<'PY' 2>/dev/null
import sys
import horovod
import horovod.torch as hvd  # noqa: F401  (fails when the torch extension is missing or stale)
sys.exit(0 if horovod.__version__ == sys.argv[1] else 1)
PY
}

if installed_ok && [[ -z "${DISTBENCH_REBUILD_HOROVOD:-}" ]]; then
  say "Horovod $HOROVOD_VERSION with PyTorch support is already installed ($KEY)"
else
  # --- build the wheel unless cached ---------------------------------------------------------------
  if [[ -n "${DISTBENCH_REBUILD_HOROVOD:-}" ]]; then rm -rf "$WHEEL_DIR"; fi
  if ! compgen -G "$WHEEL_DIR/horovod-*.whl" >/dev/null; then
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    LOG="$CACHE_ROOT/logs/$KEY.log"
    mkdir -p "$CACHE_ROOT/logs"
    say "building $KEY (about 8 minutes on 2 cores); full log: $LOG"
    SDIST="${HOROVOD_SDIST:-$SDIST_CACHE}"
    if [[ ! -f "$SDIST" ]]; then
      [[ -z "${HOROVOD_SDIST:-}" ]] || die "HOROVOD_SDIST=$HOROVOD_SDIST is not a file; run make gpu-bundle"
      mkdir -p "$(dirname "$SDIST")"  # kept: make gpu-bundle takes it from here
      "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "horovod==$HOROVOD_VERSION" -d "$(dirname "$SDIST")" \
        || die "could not download the horovod==$HOROVOD_VERSION sdist from PyPI"
    fi
    tar -xzf "$SDIST" -C "$WORK"
    SRC="$WORK/horovod-$HOROVOD_VERSION"
    for f in "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"; do
      grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || die "$f has no 'set(CMAKE_CXX_STANDARD 14)' to patch"
      sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    done
    # Build requirements that --no-build-isolation expects in the environment already.
    "$PYTHON" -m pip install --quiet setuptools wheel cloudpickle psutil pyyaml packaging
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1
    if [[ "${HOROVOD_WITHOUT_MPI:-}" != 1 ]]; then export HOROVOD_WITH_MPI=1; fi
    export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    if [[ "$FLAVOUR" != cpu ]]; then
      export HOROVOD_GPU_OPERATIONS=NCCL
      # nvcc 13 no longer takes the C++11 the CUDA kernels ask for; 17 is what the rest now builds with.
      sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$SRC/horovod/common/ops/cuda/CMakeLists.txt"
      # torch's CUDA wheels bring NCCL as a package (nvidia-nccl-cuXY): nccl.h and libnccl.so.2 only, while
      # Horovod's FindNCCL looks for libnccl.so or the static library. Link the shared one, by its soname.
      NCCL_DIR="$("$PYTHON" - <<'PY' 2>/dev/null || true
import pathlib, sys
found = (lib.parent.parent for base in sys.path if base for lib in pathlib.Path(base).glob("nvidia/*/lib/libnccl.so*"))
print(next((str(d) for d in found if (d / "include" / "nccl.h").exists()), ""))
PY
)"
      if [[ -n "$NCCL_DIR" && -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_LIB:-}" ]]; then
        mkdir -p "$WORK/nccl-lib"
        ln -s "$(ls "$NCCL_DIR"/lib/libnccl.so* | head -n 1)" "$WORK/nccl-lib/libnccl.so"
        export HOROVOD_NCCL_INCLUDE="$NCCL_DIR/include" HOROVOD_NCCL_LIB="$WORK/nccl-lib" HOROVOD_NCCL_LINK=SHARED
        say "NCCL from torch's wheel: $NCCL_DIR"
      fi
    fi
    export MAKEFLAGS="-j$(nproc)"
    if ! "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$WORK/dist" "$SRC" >"$LOG" 2>&1; then
      say "the Horovod build failed; last compiler errors:"
      grep -E '(error|Error|ERROR)[: ]' "$LOG" | grep -v -E 'Werror|-Wno-error' | tail -n 15 >&2 || tail -n 15 "$LOG" >&2
      die "see $LOG for the whole output"
    fi
    mkdir -p "$WHEEL_DIR"
    cp "$WORK"/dist/horovod-*.whl "$WHEEL_DIR"/
    say "cached $(basename "$WORK"/dist/horovod-*.whl) in $WHEEL_DIR"
  else
    say "using the cached wheel in $WHEEL_DIR"
  fi
  "$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
  "$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging
fi

# --- verify ------------------------------------------------------------------------------------------
# pip may put the script outside the interpreter's directory (a system Python): the module is the same.
HOROVODRUN=("$BIN_DIR/horovodrun")
[[ -x "$BIN_DIR/horovodrun" ]] || HOROVODRUN=("$PYTHON" -m horovod.runner.launch)
CHECK="$("${HOROVODRUN[@]}" --check-build 2>&1)" || die "horovodrun --check-build failed: $CHECK"
NEEDS=(PyTorch)
if [[ "${HOROVOD_WITHOUT_MPI:-}" != 1 ]]; then NEEDS+=(MPI); fi
NEEDS+=(Gloo)
if [[ "$FLAVOUR" != cpu ]]; then NEEDS+=(NCCL); fi
for need in "${NEEDS[@]}"; do
  grep -q "\[X\] $need" <<<"$CHECK" || die "Horovod was built without $need:\n$CHECK"
done
LISTED="$(IFS=,; echo "${NEEDS[*]:0:${#NEEDS[@]}-1}")"
say "ok: horovodrun --check-build lists ${LISTED//,/, } and ${NEEDS[-1]}"
