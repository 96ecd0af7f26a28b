#!/bin/sh
# agent_real.sh BUILD — libmemcolo against the real agent (`memcolo agent`), on a scratch
# memory cgroup (v1) scope of 384 MiB below this process's own group:
#   1. an LC process linked with libmemcolo registers itself (class lc, its comm as name,
#      notify: socket) and shows as connected in `memcolo status`;
#   2. a memory hog takes the scope past the high threshold: the agent notifies the LC
#      process, which subreleases free pages and reports them (`reclaimed`): the agent
#      records the bytes;
#   3. the agent restarts: the library reconnects and registers again;
#   4. `memcolo alloc-stats PID` (and --json) reads the process's allocator telemetry.
# Prints "PASS name" / "FAIL name". Where it cannot run (not root, no cgroup v1 memory
# controller, no memcolo binary) it fails saying why, unless MEMCOLO_TEST_ALLOW_SKIP=1
# asks on purpose to skip it ("SKIP why"). Every wait is bounded.
B=$(readlink -f "${1:-build}")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=/usr/bin/python3
MC=""
for c in "$ROOT/target/release/memcolo" "$ROOT/target/debug/memcolo"; do
  if [ -x "$c" ] && "$c" alloc-stats --help >/dev/null 2>&1; then MC=$c; break; fi
done
cannot_run() {
  if [ "${MEMCOLO_TEST_ALLOW_SKIP:-}" = 1 ]; then
    echo "SKIP agent-real ($1; skipped on purpose: MEMCOLO_TEST_ALLOW_SKIP=1)"
  else
    echo "FAIL agent-real cannot run: $1 (set MEMCOLO_TEST_ALLOW_SKIP=1 to skip it on purpose)"
  fi
  exit 0
}
[ "$(id -u)" = 0 ] || cannot_run "needs root"
[ -n "$MC" ] || cannot_run "no target/*/memcolo with alloc-stats: cargo build"
OWN=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
CGROOT=/sys/fs/cgroup/memory
[ -n "$OWN" ] && [ -f "$CGROOT$OWN/memory.limit_in_bytes" ] || cannot_run "no cgroup v1 memory controller"

TMP=$(mktemp -d /tmp/memcolo-agent-real.XXXXXX)
SCOPE="$CGROOT$OWN/memcolo-alloc-e2e-$$"
AGENT=""; PROBE=""; HOG=""
cleanup() {
  for p in $HOG $PROBE $AGENT; do kill -9 "$p" 2>/dev/null; done
  for p in $HOG $PROBE $AGENT; do wait "$p" 2>/dev/null; done
  i=0
  while [ -s "$SCOPE/cgroup.procs" ] && [ $i -lt 50 ]; do
    for p in $(cat "$SCOPE/cgroup.procs"); do kill -9 "$p" 2>/dev/null; done
    sleep 0.1; i=$((i + 1))
  done
  rmdir "$SCOPE" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
mkdir "$SCOPE" && echo $((384 << 20)) >"$SCOPE/memory.limit_in_bytes" || { echo "FAIL agent-real (scratch cgroup)"; exit 0; }

gcc -O2 -I"$HERE/../include" -o "$TMP/agent_probe" "$HERE/agent_probe.c" -L"$B" -lmemcolo -Wl,-rpath,"$B" || {
  echo "FAIL agent-real (build agent_probe)"; exit 0; }

SOCK="$TMP/agent.sock"
start_agent() {
  MEMCOLO_LOG=warn "$MC" agent --scope "cgroup:$SCOPE" --socket "$SOCK" --state-dir "$TMP/state" \
    --metrics-addr off --event-log "$TMP/events.jsonl" --poll-ms 200 --kill-after-s 3600 2>>"$TMP/agent.err" &
  AGENT=$!
  i=0; while [ ! -S "$SOCK" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
}
# wait_for SECONDS CMD...: polls CMD every 0.2 s
wait_for() {
  n=$(($1 * 5)); shift; i=0
  while [ $i -lt $n ]; do "$@" && return 0; sleep 0.2; i=$((i + 1)); done
  return 1
}
# proc_field PID FIELD: a field of the process's entry in `memcolo status --json`
proc_field() {
  "$MC" status --json --socket "$SOCK" 2>/dev/null | $PY -c "
import json, sys
s = json.load(sys.stdin)
for p in s['processes']:
    if p['pid'] == $1:
        print(json.dumps(p.get('$2')))
" 2>/dev/null
}
registered() { [ "$(proc_field "$PROBE" connected)" = "true" ]; }
reclaimed_enough() { v=$(proc_field "$PROBE" reclaimed_bytes); [ -n "$v" ] && [ "$v" != null ] && [ "$v" -gt 0 ]; }
probe_ready() { grep -q '^ready' "$TMP/probe.out"; }

start_agent
[ -S "$SOCK" ] || { echo "FAIL agent-real (the agent did not start)"; tail -5 "$TMP/agent.err"; exit 0; }

# 1. registration (MEMCOLO_RESERVE=0: with the reservation on, the management thread
# itself gives back the free memory above the reserve's target, and the probe's free
# pages would be gone before the agent asks for them)
sh -c "echo \$\$ >'$SCOPE/cgroup.procs' && exec env MEMCOLO_CLASS=lc MEMCOLO_RESERVE=0 MEMCOLO_SOCKET='$SOCK' MEMCOLO_HP_CACHE=256m '$TMP/agent_probe'" \
  >"$TMP/probe.out" 2>"$TMP/probe.err" &
PROBE=$!
if wait_for 30 registered && [ "$(proc_field "$PROBE" class)" = '"lc"' ] && \
   [ "$(proc_field "$PROBE" name)" = '"agent_probe"' ] && [ "$(proc_field "$PROBE" notify)" = '"socket"' ]; then
  echo "PASS agent-real-register"
else
  echo "FAIL agent-real-register"; "$MC" status --json --socket "$SOCK" 2>&1 | head -c 2000; tail -5 "$TMP/probe.err"
fi

# 2. pressure: the hog grows to 240 MiB in 8 MiB steps and holds
wait_for 30 probe_ready
sh -c "echo \$\$ >'$SCOPE/cgroup.procs' && exec $PY -c '
import time
chunks = []
for _ in range(30):
    b = bytearray(8 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    chunks.append(b)
    time.sleep(0.1)
time.sleep(600)
'" >/dev/null 2>&1 &
HOG=$!
if wait_for 60 reclaimed_enough; then
  echo "PASS agent-real-notify-reclaimed"
else
  echo "FAIL agent-real-notify-reclaimed (reclaimed_bytes $(proc_field "$PROBE" reclaimed_bytes))"
  tail -3 "$TMP/probe.out"; grep -E '"notif|reclaimed' "$TMP/events.jsonl" | tail -5
fi
# the library's own counters (printed every 100 ms) agree: notified, bytes released
lib_released() { last=$(grep '^stats' "$TMP/probe.out" | tail -1); set -- $last; [ "${3:-0}" -ge 1 ] && [ "${4:-0}" -gt 0 ]; }
if wait_for 10 lib_released; then
  echo "PASS agent-real-library-counters"
else
  echo "FAIL agent-real-library-counters ($last)"
fi
kill -9 $HOG 2>/dev/null; wait $HOG 2>/dev/null; HOG=""

# 3. the agent restarts: the library registers again
kill -TERM $AGENT; wait $AGENT 2>/dev/null
rm -f "$SOCK"
start_agent
if wait_for 30 registered; then
  echo "PASS agent-real-reconnect"
else
  echo "FAIL agent-real-reconnect"; tail -5 "$TMP/agent.err"
fi

# 4. memcolo alloc-stats PID, table and JSON
out=$("$MC" alloc-stats "$PROBE" --socket "$SOCK" 2>&1)
js=$("$MC" alloc-stats "$PROBE" --json --socket "$SOCK" 2>&1)
if echo "$out" | grep -q "huge page coverage" && echo "$out" | grep -q "reservation hits" && \
   echo "$js" | $PY -c "
import json, sys
d = json.load(sys.stdin)
assert d['pid'] == $PROBE, d
for k in ('hugepage_coverage', 'realized_fragmentation_bytes', 'skipped_subrelease_bytes',
          'skipped_correct_bytes', 'reserve_hits', 'reserve_misses', 'prefaulted_bytes',
          'released_total_bytes'):
    assert k in d['stats'], k
assert d['stats']['released_total_bytes'] > 0, d['stats']
"; then
  echo "PASS agent-real-alloc-stats"
else
  echo "FAIL agent-real-alloc-stats"; echo "$out" | head -20; echo "$js" | head -c 1500
fi
