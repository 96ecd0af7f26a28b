#!/usr/bin/env bash
# Runs measure.py in the cgroup v2 guest (scripts/v2bed/run.sh, no tests) under the
# machine's benchmark lock, keeps the raw lines in bench/out/v2reclaim/ and writes
# RESULTS.md from them (report.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bench/out/v2reclaim
none=$(mktemp)
echo "# no tests: a measurement run" >"$none"
MEMCOLO_V2BED_TESTS=$none MEMCOLO_V2BED_RUN=bench/v2reclaim/measure.py \
  flock /tmp/memcolo-bench.lock scripts/v2bed/run.sh
rm -f "$none"
raw=bench/out/v2reclaim/$(date -u +%Y%m%dT%H%M%SZ).jsonl
cp target/v2bed/measure.jsonl "$raw"
python3 bench/v2reclaim/report.py "$raw" >bench/v2reclaim/RESULTS.md
echo "v2reclaim: $raw -> bench/v2reclaim/RESULTS.md"
