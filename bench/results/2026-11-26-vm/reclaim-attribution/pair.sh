#!/bin/bash
# usage: pair.sh OUT [extra bench args]
OUT=$1; shift
mkdir -p $OUT
B=/tmp/rc/memcolo-attr
$B bench reclaim --quick --duration-s 5 --levels 0 --modes kernel --no-solo --no-plot --out $OUT/warmup-discarded > $OUT/warmup.log 2>&1
python3 /tmp/rc/thr_sampler.py $OUT/threads.json & S=$!
cat /proc/loadavg > $OUT/loadavg-before.txt; cat /proc/stat > $OUT/stat-before.txt
$B bench reclaim --quick --duration-s 15 --keep-going --no-plot --levels 150 --solo-csv /work/main/bench/results/2026-11-24-vm/reclaim-all/solo.csv --out $OUT "$@" > $OUT/bench.log 2>&1
cat /proc/loadavg > $OUT/loadavg-after.txt; cat /proc/stat > $OUT/stat-after.txt
kill $S; wait $S
