#!/bin/sh
# pressure.sh BUILD — libmemcolo under memory-cgroup pressure while zram swap is
# switched on and off: in a scratch v1 memory cgroup of 384 MiB below this process's
# own group, a hog (plain glibc python, oom_score_adj 1000, restarted when the group's
# OOM killer takes it) keeps the group at its limit, and CPython (PYTHONMALLOC=malloc,
# class lc and no class) and test/fault_prog run again and again under libmemcolo; zram
# swap is switched on and off every 2 s. Every run must exit 0 with an empty stderr (no
# MemoryError, no NULL; a run taken by the group's OOM killer is counted apart).
# The swap is a zram device of the test's own (hot_add), switched off and removed
# afterwards, as is the group. Other swap devices stay as they are (with zram0 on as
# swap, the hog's pages may also go there: the test's own device toggles regardless).
# Prints "PASS name" / "FAIL name"; where it cannot run (not root, no cgroup v1 memory
# controller, no zram) "FAIL", or "SKIP" with MEMCOLO_TEST_ALLOW_SKIP=1.
B=${1:-build}
LIB=$(readlink -f "$B/libmemcolo.so")
PROG=$(readlink -f "$B/fault_prog")
PY=/usr/bin/python3
cannot_run() {
  if [ "${MEMCOLO_TEST_ALLOW_SKIP:-0}" = 1 ]; then echo "SKIP pressure ($1)"; else echo "FAIL pressure (cannot run: $1)"; fi
  exit 0
}
[ "$(id -u)" = 0 ] || cannot_run "needs root"
OWN=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
CGROOT=/sys/fs/cgroup/memory
[ -n "$OWN" ] && [ -f "$CGROOT$OWN/memory.limit_in_bytes" ] || cannot_run "no cgroup v1 memory controller"
command -v mkswap >/dev/null || cannot_run "no mkswap"

TMP=$(mktemp -d /tmp/memcolo-pressure.XXXXXX)
SCOPE="$CGROOT${OWN%/}/memcolo-alloc-pressure-$$"
HOGLOOP=""
TOGGLE=""
ZRAM_MINE=0
cleanup() {
  trap - EXIT INT TERM
  # the loop first, as a whole process group with SIGKILL (a shell defers SIGTERM until
  # its child ends and would start a new hog meanwhile; a hog forked just before the
  # kill would still enter the group), then whatever is in the group
  [ -n "$HOGLOOP" ] && { kill -9 "-$HOGLOOP" 2>/dev/null; kill -9 "$HOGLOOP" 2>/dev/null; }
  [ -n "$TOGGLE" ] && kill -9 "$TOGGLE" 2>/dev/null
  # kill and remove together until the group is gone: a task can join between a read
  # of cgroup.procs and the rmdir, and killed processes with pages in swap can take
  # seconds to go (bounded at 120 s; cgroup files have size 0: read, not tested with -s)
  i=0
  while [ -d "$SCOPE" ] && ! rmdir "$SCOPE" 2>/dev/null && [ $i -lt 1200 ]; do
    for p in $(cat "$SCOPE/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    sleep 0.1; i=$((i + 1))
  done
  if [ -d "$SCOPE" ]; then
    echo "FAIL pressure cleanup: $SCOPE left"
    for p in $(cat "$SCOPE/cgroup.procs" 2>/dev/null); do
      echo "  task $p: $(cut -d' ' -f2-3 "/proc/$p/stat" 2>/dev/null) wchan $(cat "/proc/$p/wchan" 2>/dev/null)"
      head -5 "/proc/$p/stack" 2>/dev/null | sed 's/^/    /'
    done
  fi
  if [ "$ZRAM_MINE" = 1 ]; then
    i=0
    while grep -q "^$ZDEV " /proc/swaps && [ $i -lt 10 ]; do
      swapoff "$ZDEV" 2>/dev/null || sleep 1
      i=$((i + 1))
    done
    echo 1 >/sys/block/zram$ZN/reset 2>/dev/null
    echo "$ZN" >/sys/class/zram-control/hot_remove 2>/dev/null || echo "FAIL pressure cleanup: $ZDEV not removed"
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

# a zram device of our own (zram-control hot_add), removed afterwards: zram0 belongs
# to the machine's other tests and benchmarks
[ -w /sys/class/zram-control/hot_add ] || cannot_run "no zram-control (zram module without hot_add)"
ZN=$(cat /sys/class/zram-control/hot_add 2>/dev/null) || cannot_run "zram hot_add refused"
ZDEV=/dev/zram$ZN
ZRAM_MINE=1
i=0
while [ ! -b "$ZDEV" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
echo 512M >/sys/block/zram$ZN/disksize && mkswap "$ZDEV" >/dev/null 2>&1 || cannot_run "cannot set up $ZDEV"

mkdir "$SCOPE" || cannot_run "cannot make $SCOPE"
echo $((384 << 20)) >"$SCOPE/memory.limit_in_bytes"

# the hog: 320 MiB touched over and over, which with the programs' 60-120 MiB keeps the
# group at its limit (reclaim, swap-out with zram on, now and then the OOM killer with
# it off); only the hog itself enters the group. The loop is a session of its own
# (setsid execs in place: $! is its pid and process group) so cleanup kills it whole.
setsid sh -c '
  while :; do
    sh -c "echo \$\$ >\"\$1/cgroup.procs\" && echo 1000 >/proc/self/oom_score_adj && exec \"\$2\" -c \"\$3\"" \
      sh "$1" "$2" "$3" >/dev/null 2>&1 </dev/null
    sleep 0.2
  done' sh "$SCOPE" "$PY" "
b = bytearray(320 << 20)
while True:
    for i in range(0, len(b), 4096): b[i] = (b[i] + 1) & 255
" >/dev/null 2>&1 </dev/null &
HOGLOOP=$!

# swap on and off every 2 s, for about 24 s
(
  for i in 1 2 3 4 5 6; do
    swapon -p 200 "$ZDEV" 2>/dev/null; sleep 2
    timeout 20 swapoff "$ZDEV" 2>/dev/null; sleep 2
  done
) >/dev/null 2>&1 &
TOGGLE=$!

runs=0 bad=0 oomkilled=0
# judge RC OUT ERR WHAT: 0 and a clean stderr, or killed by the group's OOM killer
# (SIGKILL: the hog is its first choice, the program the next when the hog restarts);
# any other end is a failure (a NULL becomes MemoryError or a FAIL line)
judge() {
  if [ "$1" -eq 137 ]; then oomkilled=$((oomkilled + 1)); return; fi
  if [ "$1" -ne 0 ] || [ -s "$3" ] || ! grep -q "$2" "$TMP/out"; then
    bad=$((bad + 1)); echo "$4 exit $1: $(cat "$TMP/out") $(tail -2 "$3" | tr '\n' ' ')"
  fi
}
PYPROG="import json; d=[{'k':i,'v':'x'*(i%300)} for i in range(60000)]; assert json.loads(json.dumps(d))==d; print('ok')"
while kill -0 "$TOGGLE" 2>/dev/null; do
  for cls in lc ""; do
    runs=$((runs + 1))
    sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$SCOPE" \
      env MEMCOLO_CLASS=$cls MEMCOLO_SOCKET="$TMP/no-agent.sock" PYTHONMALLOC=malloc LD_PRELOAD="$LIB" \
      $PY -c "$PYPROG" >"$TMP/out" 2>"$TMP/err"
    judge $? '^ok$' "$TMP/err" "cpython class '$cls'"
  done
  runs=$((runs + 1))
  sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$SCOPE" \
    env MEMCOLO_CLASS=lc MEMCOLO_SOCKET="$TMP/no-agent.sock" LD_PRELOAD="$LIB" "$PROG" work 0.5 >"$TMP/out" 2>"$TMP/err"
  judge $? ' 0 failed$' "$TMP/err" fault_prog
done
wait "$TOGGLE"
if [ "$bad" -eq 0 ] && [ $((runs - oomkilled)) -ge 4 ]; then
  echo "PASS pressure ($runs runs at the group's limit, $oomkilled taken by its OOM killer, swap on and off; failcnt $(cat "$SCOPE/memory.failcnt"))"
else
  echo "FAIL pressure ($bad of $runs runs failed, $oomkilled OOM-killed)"
fi
