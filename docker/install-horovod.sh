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
#        DISTBENCH_REBUILD_HOROVOD=1 ignores the cached wheel.
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
"$(dirname "$0")/install-system-deps.sh"

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
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "horovod==$HOROVOD_VERSION" -d "$WORK" \
      || die "could not download the horovod==$HOROVOD_VERSION sdist from PyPI"
    tar -xzf "$WORK"/horovod-"$HOROVOD_VERSION".tar.gz -C "$WORK"
    SRC="$WORK/horovod-$HOROVOD_VERSION"
    for f in "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"; do
      grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" || die "$f has no 'set(CMAKE_CXX_STANDARD 14)' to patch"
      sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$f"
    done
    # Build requirements that --no-build-isolation expects in the environment already.
    "$PYTHON" -m pip install --quiet setuptools wheel cloudpickle psutil pyyaml packaging
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
    export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    if [[ "$FLAVOUR" != cpu ]]; then
      export HOROVOD_GPU_OPERATIONS=NCCL
      NCCL_HOME="$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
      if [[ -n "$NCCL_HOME" && -z "${HOROVOD_NCCL_HOME:-}" ]]; then export HOROVOD_NCCL_HOME="$NCCL_HOME"; fi
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
CHECK="$("$BIN_DIR/horovodrun" --check-build 2>&1)" || die "horovodrun --check-build failed: $CHECK"
for need in PyTorch MPI Gloo; do
  grep -q "\[X\] $need" <<<"$CHECK" || die "Horovod was built without $need:\n$CHECK"
done
say "ok: horovodrun --check-build lists PyTorch, MPI and Gloo"
