#!/bin/bash
OUT=$1; B=$2
mkdir -p $OUT
$B bench reclaim --quick --duration-s 5 --levels 0 --modes kernel --no-solo --no-plot --out $OUT/warmup-discarded > $OUT/warmup.log 2>&1
for i in 1 2; do
  cat /proc/loadavg > $OUT/loadavg-new$i.txt
  $B bench reclaim --quick --duration-s 15 --keep-going --no-plot --no-solo --levels 100 --modes reclaim --out $OUT/new$i > $OUT/new$i.log 2>&1
  cat /proc/loadavg > $OUT/loadavg-old$i.txt
  $B bench reclaim --quick --duration-s 15 --keep-going --no-plot --no-solo --levels 100 --modes reclaim --reclaim-set "max_batch_bytes = 16777216" --out $OUT/old$i > $OUT/old$i.log 2>&1
done
