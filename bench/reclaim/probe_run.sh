#!/bin/bash
# One `memcolo bench reclaim --quick` sweep with SCHED_FIFO wake-latency probes on both
# CPUs (wake_probe.c: 1 ms sleeps, every overshoot over 1 ms logged on CLOCK_MONOTONIC)
# and host_mm_sampler.py's 250 ms samples of free page reporting, kdamond's CPU and
# per-CPU steal beside it. A FIFO thread on the LC CPU cannot be held up by any guest
# task, so an LC stall second in which it also woke tens of ms late is time the vCPU
# was not run (or ran with interrupts off), not a run-queue wait in the guest.
# Lighter than trace_run.sh (no perf). Analyse with probe_attr.py. Under the lock:
#   sudo flock /tmp/memcolo-bench.lock bench/reclaim/probe_run.sh BIN OUTDIR --levels 0,100 --modes kernel,reclaim,no-pressure
#   bench/reclaim/probe_attr.py OUTDIR
# usage: probe_run.sh BIN OUTDIR [extra bench args]
set -u
BIN=$1; OUT=$2; shift 2
HERE=$(dirname "$0")
mkdir -p "$OUT"
cc -O2 -Wall -o "$OUT/wake_probe" "$HERE/wake_probe.c" || exit 1
head -3 /proc/stat > "$OUT/stat-before.txt"; cat /proc/loadavg > "$OUT/loadavg-before.txt"
python3 "$HERE/host_mm_sampler.py" "$OUT/host-mm.csv" &
HS=$!
"$OUT/wake_probe" --cpu 0 --fifo 50 --duration-s 3600 --events "$OUT/probe-cpu0.csv" > "$OUT/probe-cpu0.json" &
P0=$!
"$OUT/wake_probe" --cpu 1 --fifo 50 --duration-s 3600 --events "$OUT/probe-cpu1.csv" > "$OUT/probe-cpu1.json" &
P1=$!
"$BIN" bench reclaim --quick --duration-s 15 --no-plot --out "$OUT/bench" "$@" > "$OUT/bench.log" 2>&1
RC=$?
kill -TERM $P0 $P1 $HS; wait $P0 $P1 $HS
head -3 /proc/stat > "$OUT/stat-after.txt"; cat /proc/loadavg > "$OUT/loadavg-after.txt"
exit $RC
