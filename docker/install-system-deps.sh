#!/usr/bin/env bash
# Make sure Open MPI (mpirun + headers), cmake and a C++ compiler exist: install Debian's packages
# when running as root, otherwise stop with the exact command to run.
set -euo pipefail
missing=()
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v mpicxx >/dev/null 2>&1 || missing+=(libopenmpi-dev)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
[[ ${#missing[@]} -eq 0 ]] && exit 0
cmd="apt-get update && apt-get install -y ${missing[*]}"
if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[install-system-deps] ERROR: missing ${missing[*]}; run as root: $cmd" >&2
  exit 1
fi
echo "[install-system-deps] installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" >/dev/null
