#!/usr/bin/env bash
# The step study of docs/benchmarks.md ("The step users run"): the transformer and the cnn under DDP, Horovod
# (both controllers) and FSDP2, the step as fp32 eager / bf16 / compiled / compiled + bf16, all clipped at 1.0,
# compare's default pilot and budget. From the repository root, nothing else running: bash results/reference/2026-12-07-step/run.sh
set -euo pipefail
here=results/reference/2026-12-07-step
rm -rf /tmp/distbench-step
for workload in transformer cnn; do
  args=(--backends ddp,horovod@gloo,horovod@mpi,fsdp --amp off,bf16 --compile off,on --clip-grad-norm 1.0)
  [[ $workload == cnn ]] && args+=(--workload cnn)
  .venv/bin/distbench compare "${args[@]}" --out /tmp/distbench-step --run-id "$workload" \
    > "$here/$workload-output.txt" 2> "$here/$workload-stderr.txt" || true
done
