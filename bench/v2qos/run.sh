#!/usr/bin/env bash
# Runs measure.py in the cgroup v2 guest (scripts/v2bed/run.sh, no tests) under the
# machine's benchmark lock, keeps the raw lines in bench/out/v2qos/ and writes
# RESULTS.md from them (report.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bench/out/v2qos
none=$(mktemp)
echo "# no tests: a measurement run" >"$none"
MEMCOLO_V2BED_TESTS=$none MEMCOLO_V2BED_RUN=bench/v2qos/measure.py \
  flock /tmp/memcolo-bench.lock scripts/v2bed/run.sh
rm -f "$none"
raw=bench/out/v2qos/$(date -u +%Y%m%dT%H%M%SZ).jsonl
cp target/v2bed/measure.jsonl "$raw"
cp target/v2bed/console.log "${raw%.jsonl}.console.log"
python3 bench/v2qos/report.py "$raw" >bench/v2qos/RESULTS.md
echo "v2qos: $raw -> bench/v2qos/RESULTS.md"
