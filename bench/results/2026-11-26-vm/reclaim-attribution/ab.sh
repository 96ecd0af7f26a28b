#!/bin/bash
OUT=$1; B=$2; shift 2
mkdir -p $OUT
$B bench reclaim --quick --duration-s 5 --levels 0 --modes kernel --no-solo --no-plot --out $OUT/warmup-discarded > $OUT/warmup.log 2>&1
python3 /tmp/rc/thr_sampler.py $OUT/threads.json & S=$!
S0=/work/main/bench/results/2026-11-24-vm/reclaim-all/solo.csv
cat /proc/loadavg > $OUT/loadavg-before.txt
$B bench reclaim --quick --duration-s 15 --keep-going --no-plot --levels 150 --modes kernel,reclaim --solo-csv $S0 --out $OUT/new > $OUT/new.log 2>&1
$B bench reclaim --quick --duration-s 15 --keep-going --no-plot --levels 150 --modes reclaim --reclaim-set "max_batch_bytes = 16777216" --solo-csv $S0 --out $OUT/old > $OUT/old.log 2>&1
cat /proc/loadavg > $OUT/loadavg-after.txt
kill $S; wait $S
