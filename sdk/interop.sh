#!/usr/bin/env bash
# Every SDK against the real `memcolo agent` (needs root and the cgroup v1 memory
# controller). In a scratch memory cgroup below this shell's own group (limit
# $LIMIT_MIB, default 1024 MiB) it
#   1. starts the agent scoped to that cgroup on a private socket,
#   2. starts each SDK's example beside it and checks that all five registered,
#   3. runs the Go slab cache (sdk/go/examples/gocache), sized to 1.5x the limit,
#      inside the cgroup with the agent, then without one, and reports peak usage,
#      OOM kills, notifications and bytes reclaimed.
# Everything it started is stopped and the cgroup removed on exit, even on failure.
#   sdk/interop.sh [path/to/memcolo]      (default: target/release/memcolo)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MEMCOLO=${1:-$ROOT/target/release/memcolo}
LIMIT_MIB=${LIMIT_MIB:-1024}
RUN_S=${RUN_S:-45}
[ -x "$MEMCOLO" ] || { echo "no memcolo binary at $MEMCOLO (cargo build --release -p memcolo)"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (cgroups)"; exit 2; }
MY=$(grep -E '^[0-9]+:memory:' /proc/self/cgroup | cut -d: -f3)
CG=/sys/fs/cgroup/memory$MY/memcolo-sdk-interop-$$
D=$(mktemp -d /tmp/memcolo-sdk-interop.XXXXXX)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  if [ -d "$CG" ]; then
    while read -r p; do kill -9 "$p" 2>/dev/null || true; done < "$CG/cgroup.procs"
    sleep 0.5
    rmdir "$CG" 2>/dev/null || true
  fi
  echo "logs in $D"
}
trap cleanup EXIT

mkdir "$CG"
echo $((LIMIT_MIB << 20)) > "$CG/memory.limit_in_bytes"
export MEMCOLO_SOCKET=$D/agent.sock

start_agent() {
  "$MEMCOLO" agent --scope "cgroup:$CG" --socket "$MEMCOLO_SOCKET" --state-dir "$D/state" \
    --metrics-addr off --event-log "$D/events.jsonl" --poll-ms 100 > "$D/agent.log" 2>&1 &
  AGENT=$!
  PIDS+=("$AGENT")
  for _ in $(seq 100); do [ -S "$MEMCOLO_SOCKET" ] && return 0; sleep 0.1; done
  echo "agent did not start"; cat "$D/agent.log"; exit 1
}

echo "== building examples"
(cd sdk/go && go build -o "$D/gocache" ./examples/gocache)
make -s -C sdk/c examples > /dev/null
cargo build -q --release -p memcolo-sdk --example elastic_buffer
mvn -B -q -f sdk/java package -DskipTests

start_agent
echo "== 1. registration of every SDK"
python3 sdk/python/examples/elastic_cache.py --max-mib 16 > "$D/python.log" 2>&1 & PIDS+=($!)
"$D/gocache" -keys 1000 -gets 1000000000 > "$D/go.log" 2>&1 & PIDS+=($!)
sdk/c/examples/elastic_buffer 16 > "$D/c.log" 2>&1 & PIDS+=($!)
java -cp sdk/java/target/memcolo-sdk-0.1.0.jar sdk/java/examples/ElasticCache.java 16 > "$D/java.log" 2>&1 & PIDS+=($!)
target/release/examples/elastic_buffer 16 > "$D/rust.log" 2>&1 & PIDS+=($!)
want="py-elastic-cache gocache c-elastic-buffer jvm-elastic-cache elastic-buffer"
ok=0
for _ in $(seq 60); do
  st=$("$MEMCOLO" status --socket "$MEMCOLO_SOCKET" 2>/dev/null || true)
  ok=1
  for n in $want; do grep -qw -- "$n" <<< "$st" || ok=0; done
  [ $ok = 1 ] && break
  sleep 0.5
done
"$MEMCOLO" status --socket "$MEMCOLO_SOCKET" | tail -n 6
[ $ok = 1 ] || { echo "not every SDK registered"; exit 1; }
for p in "${PIDS[@]:1}"; do kill "$p" 2>/dev/null || true; done
PIDS=("$AGENT")
sleep 1

KEYS=$(( (LIMIT_MIB << 20) * 3 / 2 / 4096 ))
run_cache() { # $1: label
  local before_oom peak=0 rc=0
  before_oom=$(awk '/oom_kill /{print $2}' "$CG/memory.oom_control")
  echo 0 > "$CG/memory.max_usage_in_bytes"
  timeout "$RUN_S" sh -c "echo \$\$ > $CG/cgroup.procs; exec $D/gocache -keys $KEYS -value-bytes 4096 -gets 1000000000" \
    > "$D/gocache-$1.log" 2>&1 || rc=$?
  peak=$(( $(cat "$CG/memory.max_usage_in_bytes") >> 20 ))
  echo "$1: exit $rc (124 = ran the full ${RUN_S} s, 137 = killed), peak usage ${peak} MiB of ${LIMIT_MIB}, OOM kills $(( $(awk '/oom_kill /{print $2}' "$CG/memory.oom_control") - before_oom ))"
}

echo "== 2. Go slab cache sized to 1.5x the cgroup (${KEYS} keys of 4 KiB)"
run_cache with-agent
python3 - "$D/events.jsonl" <<'EOF'
import collections, json, sys
levels, ok, freed = collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("event") == "notify":
        levels[e.get("level")] += 1
    if e.get("event") == "reclaimed":
        ok[e.get("ok")] += 1
        freed += e.get("bytes", 0)
print(f"   notifications {dict(levels)}, answers ok={ok[True]} failed={ok[False]}, reclaimed {freed >> 20} MiB")
EOF
kill "$AGENT"; wait "$AGENT" 2>/dev/null || true
PIDS=()
MEMCOLO_SOCKET=$D/no-agent.sock run_cache without-agent
