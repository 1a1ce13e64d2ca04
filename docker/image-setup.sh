#!/bin/sh
# The images' system set-up, one recipe for both stages of docker/Dockerfile, on any Debian or Ubuntu base:
#   image-setup.sh runtime   Open MPI's runtime, ssh, CA certificates, python3 where the base has none, the venv
#   image-setup.sh build     the above, plus what builds Horovod and mpi4py (compilers, MPI headers, cmake)
set -eu
export DEBIAN_FRONTEND=noninteractive
packages="openmpi-bin openssh-client ca-certificates"
command -v python3 >/dev/null 2>&1 || packages="$packages python3 python3-venv"
if [ "${1:-}" = build ]; then
  packages="$packages libopenmpi-dev cmake g++ make git"
  python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    2>/dev/null || packages="$packages python3-dev"
fi
apt-get update -qq
# python3 -m venv needs Debian's python3-venv (ensurepip) unless the base's python brings its own.
python3 -c 'import ensurepip' 2>/dev/null || packages="$packages python3-venv"
apt-get install -y -qq --no-install-recommends $packages
rm -rf /var/lib/apt/lists/*
[ -x /opt/venv/bin/python ] || python3 -m venv /opt/venv
