#!/usr/bin/env bash
# Make sure Open MPI (mpirun + headers), cmake and a C++ compiler exist, and Slurm and munge for the tests'
# one-node Slurm (tests/slurm_cluster.py): install Debian's packages when running as root. Without root, a
# missing required package stops with the exact command to run; missing Slurm only says that its tests skip.
# Nothing is started here (the tests start and stop their own daemons).
#   install-system-deps.sh docker   instead: Debian's docker.io and debootstrap, for make test-docker
set -euo pipefail
if [[ "${1:-}" == docker ]]; then
  need=()
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  [[ ${#need[@]} -eq 0 ]] && exit 0
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "[install-system-deps] note: ${need[*]} not installed, so the image tests skip (as root: apt-get install -y ${need[*]})" >&2
    exit 0
  fi
  echo "[install-system-deps] installing ${need[*]}" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  exit 0
fi
missing=()
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v mpicxx >/dev/null 2>&1 || missing+=(libopenmpi-dev)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
optional=()  # DISTBENCH_SYSTEM_DEPS=required leaves them out (an image build: no tests run there)
if [[ "${DISTBENCH_SYSTEM_DEPS:-}" != required ]]; then
  command -v slurmd >/dev/null 2>&1 || optional+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || optional+=(munge)
  command -v chromium-headless-shell >/dev/null 2>&1 || optional+=(chromium-headless-shell)  # the report's screenshot test
fi
[[ ${#missing[@]} -eq 0 && ${#optional[@]} -eq 0 ]] && exit 0
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "[install-system-deps] ERROR: missing ${missing[*]}; run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "[install-system-deps] note: ${optional[*]} not installed, so the tests that need them (a real Slurm, the report's screenshot) skip (as root: apt-get install -y ${optional[*]})" >&2
  exit 0
fi
echo "[install-system-deps] installing ${missing[*]} ${optional[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" "${optional[@]}" >/dev/null
