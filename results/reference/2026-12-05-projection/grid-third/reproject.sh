#!/bin/bash
# The third sitting wrote to O=/tmp/grid4, the fourth to O=/tmp/grid5; set O of your own to rerun it.
cd /work/main; export PATH=/work/main/.venv/bin:$PATH; O=${O:-/tmp/grid4}
for d in $O/*-h?-*; do
  [ -d $d ] || continue; n=$(basename $d); case $n in ar-*) continue;; esac
  hl=${n#*-}; ar=$O/ar-$hl
  [ -d $O/nocpu/ar-$hl ] || { mkdir -p $O/nocpu/ar-$hl; cp -r $ar/ar $ar/reduce_scatter $ar/all_gather $O/nocpu/ar-$hl/ 2>/dev/null
    for f in $(find $O/nocpu/ar-$hl -name "*.csv"); do python3 -c "
import pandas as pd,sys; f=sys.argv[1]; d=pd.read_csv(f)
if 'caller_cpu_mean_s' in d: d['caller_cpu_mean_s']=d['cpu_mean_s']; d.to_csv(f,index=False)" $f; done; }
  distbench project $d --ranks 2,3,4,8,64 --allreduce $ar --out $d/projection > $O/$n.project.txt 2>&1
  distbench project $d --ranks 2,3,4,8,64 --allreduce $O/nocpu/ar-$hl --out $d/projection-nocpu > $O/$n.project-nocpu.txt 2>&1
done
