#!/bin/bash
# The 36 ms stall (analysis.md): back-to-back 256 KiB, the other CPU taken by a spinner in
# its own session (autogroup), as when the machine is busy from outside; memcolo lc with
# MEMCOLO_RSV_YIELD_US = 0 (no stepping aside) / 200 / 2000 / 4000 and glibc, interleaved,
# 3 repetitions. Run under the lock from the repository root after `make -C alloc` and
# `gcc -O2 -o /tmp/hermes_bench bench/alloc/hermes_bench.c`:
#   flock /tmp/memcolo-bench.lock bash bench/alloc/results/<this run>/diag/ab_yield.sh
# One line per run: p50, p99, p99.9, max (us); HERMES_RAW and MEMCOLO_RSV_TRACE files in
# /tmp/ab-yield (bench/alloc/hermes_bench.c: the two line up on CLOCK_MONOTONIC).
LIB=$PWD/alloc/build/libmemcolo.so HB=/tmp/hermes_bench D=/tmp/ab-yield
mkdir -p $D
setsid timeout 300 sh -c 'while :; do :; done' &
SP=$!
trap 'kill $SP 2>/dev/null' EXIT
sleep 1
for r in 0 1 2; do
  for v in 0 200 2000 4000 glibc; do
    $HB 4096 4096 b2b 0 "" 2048 >/dev/null # warm, as run_bench.py does
    if [ $v = glibc ]; then E=""; else E="LD_PRELOAD=$LIB MEMCOLO_CLASS=lc MEMCOLO_RSV_YIELD_US=$v"; fi
    env HERMES_RAW=$D/raw-$v-$r.csv MEMCOLO_RSV_TRACE=1 $E $HB 262144 268435456 b2b 0 "" 1536 \
      > $D/out-$v-$r.txt 2> $D/trace-$v-$r.txt
    echo "yield $v r$r p50,p99,p99.9,max $(cut -d, -f3,5,6,7 $D/out-$v-$r.txt) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
