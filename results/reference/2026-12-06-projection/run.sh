#!/bin/bash
# The fifth sitting (2026-12-06) wrote to O=/tmp/grid6; set O and N of your own to rerun it.
# As grid-third/run.sh, but every sweep made twice, before the compares and after them (O/ar-hH-L/before,
# .../after), and `distbench project --allreduce` given both: a slow stretch of the machine then weighs on
# neither side alone (docs/benchmarks.md, the test's point).
# usage: run.sh H L "W1 W2 ..."
cd /work/main; export PATH=/work/main/.venv/bin:$PATH
H=$1; L=$2; WS=$3; N=${N:-g$H$L}; O=${O:-/tmp/grid6}
SZ=65536,262144,1048576,4194304
mkdir -p $O
log(){ echo "$(date +%T) $*" >> $O/timeline.log; }
sweep(){  # the allreduce of all three, and torch's reduce-scatter and all-gather, under O/ar-hH-L/$1
  distbench allreduce --compare --cluster $N --nproc $H --impls torch,horovod-gloo,horovod-mpi --sizes $SZ --out $O/ar-h$H-$L/$1 --run-id ar > $O/ar-h$H-$L-$1.txt 2>&1; log ar $1 rc=$?
  for C in reduce_scatter all_gather; do
    distbench allreduce --compare --cluster $N --nproc $H --impls torch --collective $C --sizes $SZ --out $O/ar-h$H-$L/$1 --run-id $C > $O/$C-h$H-$L-$1.txt 2>&1; log $C $1 rc=$?
  done
}
log start h$H $L
distbench cluster up --hosts $H --link $L --name $N > $O/cluster-h$H-$L.txt 2>&1 || { log cluster-fail; exit 1; }
sweep before
for W in $WS; do
  distbench compare --cluster $N --nproc $H --backends ddp,horovod@gloo,horovod@mpi,fsdp --repeats 2 --workload $W --steps-per-epoch 40 --out $O --run-id $W-h$H-$L > $O/$W-h$H-$L.txt 2>&1; log $W rc=$?
done
sweep after
distbench cluster down $N >> $O/cluster-h$H-$L.txt 2>&1; log down rc=$?
for W in $WS; do
  distbench project $O/$W-h$H-$L --ranks 2,3,4,8,64 --allreduce $O/ar-h$H-$L > $O/$W-h$H-$L.project.txt 2>&1; log project $W rc=$?
done
