#!/bin/bash
# Runs "$@" and appends to $BUSY_LOG the machine's busy share (from /proc/stat) and load
# over it, and the host's own memory management over the same time (common causes of
# first-touch costs that no policy of ours makes): kdamond's CPU time (its DAMON pageout
# scheme, /proc/<pid>/stat utime + stime) and the pages reported free to the host
# (/sys/module/page_reporting/parameters/reported_kib).
kd() { local p; p=$(pgrep -x kdamond.0 | head -1); [ -n "$p" ] && awk '{print $14+$15}' "/proc/$p/stat" || echo 0; }
rk() { cat /sys/module/page_reporting/parameters/reported_kib 2>/dev/null || echo 0; }
read -r _ u n s i w q sq st _ < /proc/stat; b0=$((u+n+s+q+sq+st)); t0=$((b0+i+w)); k0=$(kd); r0=$(rk)
"$@"; rc=$?
read -r _ u n s i w q sq st _ < /proc/stat; b1=$((u+n+s+q+sq+st)); t1=$((b1+i+w)); k1=$(kd); r1=$(rk)
hz=$(getconf CLK_TCK)
echo "$(date -u +%FT%TZ) busy $(( 100*(b1-b0)/(t1-t0) ))% load $(cut -d' ' -f1-3 /proc/loadavg) kdamond_cpu_s $(awk -v a="$k0" -v b="$k1" -v h="$hz" 'BEGIN{printf "%.2f", (b-a)/h}') reported_mib $(( (r1-r0)/1024 )) rc $rc: $*" >> "$BUSY_LOG"
exit $rc
