#!/usr/bin/env bash
# A Debian bookworm base image from Debian's packages alone (debootstrap), for a machine that reaches no
# image registry: docker/make-base.sh [NAME]  (default distbench-base:bookworm). About a minute.
set -euo pipefail
NAME="${1:-distbench-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
say() { printf '[make-base] %s\n' "$*" >&2; }
if ! command -v debootstrap >/dev/null 2>&1; then
  [[ "$(id -u)" -eq 0 ]] || { say "ERROR: debootstrap is missing; as root: apt-get install -y debootstrap"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
root="$(mktemp -d "${TMPDIR:-/tmp}/distbench-base.XXXXXX")"
trap 'rm -rf "$root"' EXIT
say "debootstrap --variant=minbase bookworm into $root (from $MIRROR)"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import - "$NAME" >/dev/null
say "made $NAME ($(docker image inspect -f '{{.Size}}' "$NAME" | awk '{printf "%.0f MB", $1 / 1e6}'))"
