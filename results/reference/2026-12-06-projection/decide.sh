#!/bin/bash
# A measured decision to set the projection's pick beside: 2 emulated hosts (one rank each, not oversubscribed),
# two variants, enough runs of each for the compare to resolve which is faster.
# usage: decide.sh L W REPEATS   (wrote to O=/tmp/grid6)
cd /work/main; export PATH=/work/main/.venv/bin:$PATH
L=$1; W=$2; R=$3; N=${N:-d2}; O=${O:-/tmp/grid6}
SZ=65536,262144,1048576,4194304
mkdir -p $O
log(){ echo "$(date +%T) $*" >> $O/timeline.log; }
sweep(){ distbench allreduce --compare --cluster $N --impls torch,horovod-gloo --sizes $SZ --out $O/ar-d2-$W-$L/$1 --run-id ar > $O/ar-d2-$W-$L-$1.txt 2>&1; log ar d2 $1 rc=$?; }
distbench cluster up --hosts 2 --link $L --name $N > $O/cluster-d2-$W-$L.txt 2>&1 || { log cluster-fail; exit 1; }
sweep before
distbench compare --cluster $N --backends ddp,horovod@gloo --repeats $R --workload $W --steps-per-epoch 40 --out $O --run-id $W-d2-$L > $O/$W-d2-$L.txt 2>&1; log $W d2 rc=$?
sweep after
distbench cluster down $N >> $O/cluster-d2-$W-$L.txt 2>&1; log down rc=$?
distbench project $O/$W-d2-$L --ranks 2,8,64 --allreduce $O/ar-d2-$W-$L > $O/$W-d2-$L.project.txt 2>&1; log project $W d2 rc=$?
