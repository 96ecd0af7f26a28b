#!/bin/bash
# One `memcolo bench reclaim --quick` sweep under a system-wide perf trace of what can
# take an LC CPU's time: scheduler switches, hard/soft interrupts, the x86 vectors
# (timer, call-function and reschedule IPIs), workqueue items (per-CPU drains,
# vmstat), IPIs sent, TLB flushes, memcg and direct reclaim, wake-ups; timestamps on
# CLOCK_MONOTONIC (perf -k mono), beside host_mm_sampler.py's 250 ms samples of free
# page reporting, kdamond's CPU and per-CPU steal (OUTDIR/host-mm.csv). The bench log
# names the measured phase's start on the same clock. Analyse with cpu_time.py and
# stall_attr.py.
# Run it under the bench lock:
#   sudo flock /tmp/memcolo-bench.lock bench/diag/trace_run.sh BIN OUTDIR --levels 150 --modes reclaim
#   perf script -i OUTDIR/perf.data -F cpu,comm,pid,tid,time,event,trace > OUTDIR/perf.txt
#   bench/diag/cpu_time.py OUTDIR/perf.txt --cpu 0 --from T0 --to T1 --group redis=PID ...
# usage: trace_run.sh BIN OUTDIR [extra bench args]
set -u
BIN=$1; OUT=$2; shift 2
mkdir -p $OUT
cat /proc/stat | head -3 > $OUT/stat-before.txt; cat /proc/loadavg > $OUT/loadavg-before.txt
perf record -a -k mono -o $OUT/perf.data -e sched:sched_wakeup -e sched:sched_switch -e irq:irq_handler_entry -e irq:irq_handler_exit -e irq:softirq_entry -e irq:softirq_exit -e irq_vectors:local_timer_entry -e irq_vectors:local_timer_exit -e irq_vectors:call_function_entry -e irq_vectors:call_function_exit -e irq_vectors:call_function_single_entry -e irq_vectors:call_function_single_exit -e irq_vectors:reschedule_entry -e irq_vectors:reschedule_exit \
  -e workqueue:workqueue_execute_start -e workqueue:workqueue_execute_end -e workqueue:workqueue_queue_work \
  -e ipi:ipi_send_cpu -e tlb:tlb_flush \
  -e vmscan:mm_vmscan_memcg_reclaim_begin -e vmscan:mm_vmscan_memcg_reclaim_end \
  -e vmscan:mm_vmscan_direct_reclaim_begin -e vmscan:mm_vmscan_direct_reclaim_end > $OUT/perf-record.log 2>&1 &
PP=$!
python3 $(dirname $0)/../reclaim/host_mm_sampler.py $OUT/host-mm.csv &
HS=$!
sleep 2; kill -0 $PP || { echo perf died; kill $HS; exit 1; }
$BIN bench reclaim --quick --duration-s 15 --no-solo --no-plot --out $OUT/bench "$@" > $OUT/bench.log 2>&1
kill -INT $PP; wait $PP; kill $HS; wait $HS
cat /proc/stat | head -3 > $OUT/stat-after.txt; cat /proc/loadavg > $OUT/loadavg-after.txt
