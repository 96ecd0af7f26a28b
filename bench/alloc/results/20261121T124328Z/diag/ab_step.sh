#!/bin/bash
# A/B of how the fill steps aside (b2b 256 KiB, 256 MiB, the other CPU taken by a spinner in
# its own session). usage: ab_step.sh REPS VARIANT...   VARIANT = name:ENV=V,ENV=V | glibc | jemalloc
LIB=${LIB:-/tmp/alc/libmemcolo.so} HB=${HB:-/tmp/alc/hermes_bench} D=${D:-/tmp/alc/ab}
SPIN=${SPIN:-1}
mkdir -p $D
REPS=$1; shift
if [ "$SPIN" = 1 ]; then
  setsid timeout 600 sh -c 'while :; do :; done' &
  SP=$!
  trap 'kill $SP 2>/dev/null' EXIT
fi
sleep 1
K0=$(awk '{print $14+$15}' /proc/77/stat); R0=$(cat /sys/module/page_reporting/parameters/reported_kib 2>/dev/null)
for r in $(seq 0 $((REPS-1))); do
  for v in "$@"; do
    name=${v%%:*}; envs=""
    case $name in
      glibc) E="";;
      jemalloc) E="LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";;
      *) E="LD_PRELOAD=$LIB MEMCOLO_CLASS=lc MEMCOLO_AGENT=0 $(echo ${v#*:} | tr ',' ' ')";;
    esac
    $HB 4096 4096 b2b 0 "" 2048 >/dev/null
    read i0 a0 < <(awk '/^cpu /{print $5+$6, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
    env HERMES_RAW=$D/raw-$name-$r.csv MEMCOLO_RSV_TRACE=1 $E $HB 262144 268435456 b2b 0 "" 0 \
      > $D/out-$name-$r.txt 2> $D/trace-$name-$r.txt
    read i1 a1 < <(awk '/^cpu /{print $5+$6, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
    busy=$(echo "scale=2; 1-($i1-$i0)/($a1-$a0)" | bc)
    ys=$(grep '^rsv_trace,' $D/trace-$name-$r.txt | tail -1 | cut -d, -f11)
    echo "$name r$r mean,p50,p90,p99,p99.9,max $(cut -d, -f2-7 $D/out-$name-$r.txt) yields ${ys:--} busy $busy load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
K1=$(awk '{print $14+$15}' /proc/77/stat); R1=$(cat /sys/module/page_reporting/parameters/reported_kib 2>/dev/null)
echo "kdamond ticks $((K1-K0)) reported_kib delta $((R1-R0))"
