#!/bin/bash
OUT=$1; shift
mkdir -p $OUT
B=/tmp/rc/memcolo-attr
$B bench reclaim --quick --duration-s 5 --levels 0 --modes kernel --no-solo --no-plot --out $OUT/warmup-discarded > $OUT/warmup.log 2>&1
python3 /tmp/rc/thr_sampler.py $OUT/threads.json & S=$!
perf record -a -g -F 299 -o $OUT/perf.data -- sleep 40 > $OUT/perf.log 2>&1 & P=$!
$B bench reclaim --quick --duration-s 15 --keep-going --no-plot --levels 150 --solo-csv /work/main/bench/results/2026-11-24-vm/reclaim-all/solo.csv --out $OUT "$@" > $OUT/bench.log 2>&1
kill -INT $P; wait $P
kill $S; wait $S
