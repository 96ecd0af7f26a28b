#!/bin/bash
# Traced b2b 256 KiB runs under file-cache pressure (the run_bench.py "file" condition: a
# scratch memory cgroup of 1.5 GiB below our own, a reader of a 2 GiB file looping in it),
# the allocators interleaved, each run under perf (system-wide, CLOCK_MONOTONIC):
# sched_switch, memcg reclaim begin/end, user page faults; per run the group's
# memory.stat and /proc/vmstat deltas, kdamond.0's CPU ticks and free page reporting's
# reported_kib delta. file_trace.py attributes the slow allocations. Run under the lock:
#   flock /tmp/memcolo-bench.lock bench/diag/file_trace.sh OUTDIR REPS ALLOC...
# ALLOC: glibc | jemalloc | tcmalloc | mimalloc | memcolo | NAME:MEMCOLO_X=V,...
# LIB / HB: the libmemcolo.so and hermes_bench to run (default alloc/build's).
# WARM_MB=N: touch and free N MiB outside the group before each run (run_bench.py's warm()
# of the dedicated condition; the pressure conditions run without it).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=${LIB:-$ROOT/alloc/build/libmemcolo.so} HB=${HB:-$ROOT/alloc/build/bench/hermes_bench}
SYS=/usr/lib/x86_64-linux-gnu
D=$1 REPS=$2; shift 2
mkdir -p "$D"
OWN=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
CG=/sys/fs/cgroup/memory$OWN/mcdiag-file-$$
BIG=/var/tmp/memcolo-alloc-bench.dat
[ -s $BIG ] || dd if=/dev/urandom of=$BIG bs=1M count=2048 status=none
mkdir "$CG" && echo $((3 << 29)) > "$CG/memory.limit_in_bytes"
setsid sh -c "echo \$\$ > $CG/cgroup.procs; exec sh -c 'while :; do cat $BIG > /dev/null; done'" &
HOG=$!
cleanup() { kill -- -$HOG 2>/dev/null; sleep 0.5; rmdir "$CG" 2>/dev/null || { sleep 2; rmdir "$CG"; }; }
trap cleanup EXIT
sleep 6
KD=$(pgrep -x kdamond.0 | head -1)
stat_of() { awk '/^(pgfault|pgmajfault|pgpgin|pgpgout) /{printf "%s=%s ", $1, $2}' "$CG/memory.stat"
            awk '/^(pgscan_direct|pgsteal_direct|allocstall_normal|allocstall_movable|pgscan_kswapd) /{printf "%s=%s ", $1, $2}' /proc/vmstat
            echo "kdamond_ticks=$(awk '{print $14+$15}' /proc/$KD/stat) reported_kib=$(cat /sys/module/page_reporting/parameters/reported_kib)"; }
echo "start load $(cat /proc/loadavg)" | tee -a "$D/runs.txt"
for r in $(seq 0 $((REPS - 1))); do
  for v in "$@"; do
    name=${v%%:*}
    case $name in
      glibc) E="";;
      jemalloc) E="LD_PRELOAD=$SYS/libjemalloc.so.2";;
      tcmalloc) E="LD_PRELOAD=$SYS/libtcmalloc_minimal.so.4";;
      mimalloc) E="LD_PRELOAD=$SYS/libmimalloc.so.2";;
      memcolo) E="LD_PRELOAD=$LIB MEMCOLO_CLASS=lc MEMCOLO_AGENT=0";;
      *) E="LD_PRELOAD=$LIB MEMCOLO_CLASS=lc MEMCOLO_AGENT=0 $(echo "${v#*:}" | tr ',' ' ')";;
    esac
    [ "${WARM_MB:-0}" -gt 0 ] && $HB 4096 4096 b2b 0 '' "$WARM_MB" > /dev/null
    s0=$(stat_of)
    read -r i0 a0 < <(awk '/^cpu /{print $5+$6, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
    perf record -q -a -k CLOCK_MONOTONIC -o "$D/perf-$name-$r.data" \
      -e sched:sched_switch -e vmscan:mm_vmscan_memcg_reclaim_begin -e vmscan:mm_vmscan_memcg_reclaim_end \
      -e exceptions:page_fault_user -- \
      sh -c "echo \$\$ > $CG/cgroup.procs; exec env HERMES_RAW=$D/raw-$name-$r.csv MEMCOLO_RSV_TRACE=1 $E $HB 262144 268435456 b2b 0 '' 0" \
      > "$D/out-$name-$r.txt" 2> "$D/trace-$name-$r.txt"
    read -r i1 a1 < <(awk '/^cpu /{print $5+$6, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
    s1=$(stat_of)
    busy=$(echo "scale=2; 1-($i1-$i0)/($a1-$a0)" | bc)
    echo "$name r$r mean,p50,p90,p99,p99.9,max $(cut -d, -f2-7 "$D/out-$name-$r.txt") busy $busy load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$D/runs.txt"
    echo "  before $s0" >> "$D/runs.txt"; echo "  after  $s1" >> "$D/runs.txt"
  done
done
