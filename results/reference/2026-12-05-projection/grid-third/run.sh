#!/bin/bash
# The third sitting wrote to O=/tmp/grid4, the fourth (grid-fourth/) to O=/tmp/grid5 with N=g3m100 and g4m100
# (cluster names take 8 characters: g3100mbit never started); set O and N of your own to rerun it.
# usage: run.sh H L "W1 W2 ..."
cd /work/main; export PATH=/work/main/.venv/bin:$PATH
H=$1; L=$2; WS=$3; N=${N:-g$H$L}; O=${O:-/tmp/grid4}
SZ=65536,262144,1048576,4194304
log(){ echo "$(date +%T) $*" >> $O/timeline.log; }
log start h$H $L
distbench cluster up --hosts $H --link $L --name $N > $O/cluster-h$H-$L.txt 2>&1 || { log cluster-fail; exit 1; }
if [ ! -d $O/ar-h$H-$L/ar ]; then
distbench allreduce --compare --cluster $N --nproc $H --impls torch,horovod-gloo,horovod-mpi --sizes $SZ --out $O/ar-h$H-$L --run-id ar > $O/ar-h$H-$L.txt 2>&1; log ar rc=$?
for C in reduce_scatter all_gather; do
distbench allreduce --compare --cluster $N --nproc $H --impls torch --collective $C --sizes $SZ --out $O/ar-h$H-$L --run-id $C > $O/$C-h$H-$L.txt 2>&1; log $C rc=$?
done
fi
for W in $WS; do
distbench compare --cluster $N --nproc $H --backends ddp,horovod@gloo,horovod@mpi,fsdp --repeats 2 --workload $W --steps-per-epoch 40 --out $O --run-id $W-h$H-$L > $O/$W-h$H-$L.txt 2>&1; log $W rc=$?
distbench project $O/$W-h$H-$L --ranks 2,3,4,8,64 --allreduce $O/ar-h$H-$L > $O/$W-h$H-$L.project.txt 2>&1; log project rc=$?
done
distbench cluster down $N >> $O/cluster-h$H-$L.txt 2>&1; log down rc=$?
