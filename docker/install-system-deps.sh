#!/usr/bin/env bash
# Make sure Open MPI (mpirun + headers), cmake and a C++ compiler exist, and Slurm and munge for the tests'
# one-node Slurm (tests/slurm_cluster.py): install Debian's packages when running as root. Without root, a
# missing required package stops with the exact command to run; missing Slurm only says that its tests skip.
# Nothing is started here (the tests start and stop their own daemons).
set -euo pipefail
missing=()
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v mpicxx >/dev/null 2>&1 || missing+=(libopenmpi-dev)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
optional=()
command -v slurmd >/dev/null 2>&1 || optional+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || optional+=(munge)
[[ ${#missing[@]} -eq 0 && ${#optional[@]} -eq 0 ]] && exit 0
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "[install-system-deps] ERROR: missing ${missing[*]}; run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "[install-system-deps] note: ${optional[*]} not installed, so the tests under a real Slurm skip (as root: apt-get install -y ${optional[*]})" >&2
  exit 0
fi
echo "[install-system-deps] installing ${missing[*]} ${optional[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" "${optional[@]}" >/dev/null
