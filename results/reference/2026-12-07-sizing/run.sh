#!/usr/bin/env bash
# Issue 50's before/after (docs/benchmarks.md, "Time to a decision on any workload"): the default compare and a
# GRU language model of one's own (tests/integration/small_workloads.py:gru) over ddp, horovod@gloo and fsdp,
# each with compare's defaults, before (BEFORE, a checkout of the commit before the sizing) and after (AFTER).
# Usage: BEFORE=/path/to/old/checkout AFTER=/path/to/new/checkout OUT=/tmp/m50 bash run.sh   (nothing else running)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/m50}"
rm -rf "$out"
for side in before after; do
  tree=$([[ $side == before ]] && echo "$BEFORE" || echo "$AFTER")
  cp "$AFTER/tests/integration/small_workloads.py" "$tree/tests/integration/small_workloads.py" 2>/dev/null || true
  (cd "$tree" && PYTHONPATH="$tree" .venv/bin/distbench compare --out "$out" --run-id "default-$side" \
      > "$here/default-$side.txt" 2> "$here/default-$side-stderr.txt")
  (cd "$tree" && PYTHONPATH="$tree" .venv/bin/distbench compare --workload tests.integration.small_workloads:gru \
      --backends ddp,horovod@gloo,fsdp --out "$out" --run-id "gru-$side" \
      > "$here/gru-$side.txt" 2> "$here/gru-$side-stderr.txt")
done
# default-window12*.txt: the default compare after the window became 12 s (`distbench compare`, nothing else running).
