#!/usr/bin/env bash
# make image / make image-cuda: build distbench's image from this checkout, starting nothing the user did not
# ask for. Without an engine or a daemon it says so in one line (with the command that starts one); where the
# base cannot be pulled (no registry), it says so and makes one from Debian's packages (docker/make-base.sh).
#   docker/build-image.sh TAG [docker build arguments...]
# Env: BASE (default python:3.11-slim-bookworm), CA_BUNDLE (default the system's bundle, when there is one),
#      TORCH_SPEC (default torch==2.13.0), TORCH_INDEX (default PyTorch's CPU index).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="$1"; shift
BASE="${BASE:-python:3.11-slim-bookworm}"
say() { printf '[image] %s\n' "$*" >&2; }
command -v docker >/dev/null 2>&1 || { say "ERROR: no docker client; as root: apt-get install -y docker.io"; exit 1; }
if ! docker info >/dev/null 2>&1; then
  say "ERROR: no Docker daemon answers; start one (as root, no bridge of its own): dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false &"
  exit 1
fi
# The classic builder: Debian's docker.io has no buildx, and nothing here needs BuildKit.
export DOCKER_BUILDKIT=0
if ! docker image inspect "$BASE" >/dev/null 2>&1 && ! docker pull -q "$BASE" >/dev/null 2>&1; then
  if [[ "$BASE" != python:3.11-slim-bookworm ]]; then  # a base of the user's own (the CUDA one) has no stand-in
    say "ERROR: the base $BASE cannot be pulled and is not here; docker pull it where a registry is reachable, then docker save / docker load"
    exit 1
  fi
  say "the base $BASE cannot be pulled (no registry reachable?): making distbench-base:bookworm from Debian's packages"
  docker image inspect distbench-base:bookworm >/dev/null 2>&1 || docker/make-base.sh distbench-base:bookworm
  BASE=distbench-base:bookworm
fi
CA_BUNDLE="${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
rm -f docker/ca/ca.pem docker/wheels/*.whl
trap 'rm -f docker/ca/ca.pem docker/wheels/*.whl' EXIT
if [[ -n "$CA_BUNDLE" && -f "$CA_BUNDLE" ]]; then cp "$CA_BUNDLE" docker/ca/ca.pem; fi
# Where PyTorch's index does not answer (a registry mirror only, as on an offline cluster), the wheel this
# machine's pip would install is handed to the build instead, from pip's own sources (its cache, find-links).
if [[ -n "$TORCH_INDEX" ]] && ! curl -sfI --max-time 15 "$TORCH_INDEX/" >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d docker/wheels "$TORCH_SPEC" >/dev/null 2>&1 \
    || { say "ERROR: $TORCH_INDEX does not answer and this machine's pip has no wheel of $TORCH_SPEC; set TORCH_INDEX to a reachable index"; exit 1; }
  say "$TORCH_INDEX does not answer: using $(basename docker/wheels/torch-*.whl) from this machine's pip"
  TORCH_INDEX=
fi
start=$SECONDS
docker build --network host -f docker/Dockerfile --build-arg BASE="$BASE" \
  --build-arg TORCH_SPEC="$TORCH_SPEC" --build-arg TORCH_INDEX="$TORCH_INDEX" "$@" -t "$TAG" .
say "built $TAG in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1 / 1e6}'))"
