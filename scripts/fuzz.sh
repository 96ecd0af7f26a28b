#!/usr/bin/env bash
# Coverage-guided fuzzing of memcolo's wire decoders (fuzz/, libFuzzer via cargo-fuzz).
#
#   scripts/fuzz.sh smoke [TARGET...]   each target FUZZ_SMOKE_SECONDS (20) from the
#                                       committed seeds (fuzz/seeds/) into a scratch
#                                       corpus; fails on any crash (make fuzz-smoke)
#   scripts/fuzz.sh run [TARGET...]     each target FUZZ_SECONDS (600), keeping the
#                                       corpus in fuzz/corpus/TARGET (make fuzz)
#
# Stable Rust: targets are built with `cargo fuzz build -s none`, i.e. libFuzzer's
# SanitizerCoverage instrumentation (-Cpasses=sancov-module, inline 8-bit counters,
# PC table, trace-compares; all stable rustc flags) and `--cfg fuzzing`, without
# AddressSanitizer (which needs nightly's -Zsanitizer); the decoders are safe Rust,
# so a crash is a panic (an assertion or an overflow check: `-a` keeps them on) or an
# out-of-memory/timeout, which libFuzzer reports all the same. Crash inputs go to
# fuzz/artifacts/TARGET/; replay one with `fuzz/target/x86_64-unknown-linux-gnu/release/TARGET FILE`.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
shift || true
ALL_TARGETS=(agent_request tier_request memserver_frame memserver_conn)
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=("${ALL_TARGETS[@]}")

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi

case "$mode" in
  smoke) seconds="${FUZZ_SMOKE_SECONDS:-20}" ;;
  run) seconds="${FUZZ_SECONDS:-600}" ;;
  *) echo "usage: $0 smoke|run [TARGET...]" >&2; exit 2 ;;
esac

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Release build with debug assertions and overflow checks, no sanitizer (stable).
build=()
[ "${#targets[@]}" -eq 1 ] && build=("${targets[0]}")
cargo fuzz build -s none -a "${build[@]}" >"$scratch/build.log" 2>&1 \
  || { cat "$scratch/build.log" >&2; exit 1; }
bin=fuzz/target/x86_64-unknown-linux-gnu/release

status=0
passed=0
failed=0
for t in "${targets[@]}"; do
  if [ "$mode" = smoke ]; then corpus="$scratch/$t"; else corpus="fuzz/corpus/$t"; fi
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  log="$scratch/$t.log"
  rc=0
  "$bin/$t" "$corpus" "fuzz/seeds/$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1 || rc=$?
  # The build must carry coverage instrumentation: libFuzzer counts its 8-bit counters.
  counters=$(sed -n 's/.*(\([0-9]*\) inline 8-bit counters).*/\1/p' "$log" | head -1)
  inited=$(grep -m1 'INITED' "$log" | grep -o 'cov: [0-9]* ft: [0-9]*' || true)
  done_=$(grep 'DONE' "$log" | tail -1 | grep -o 'cov: [0-9]* ft: [0-9]*' || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  printf 'fuzz %-16s %ss: %s execs, %s exec/s; %s -> %s (%s counters)\n' \
    "$t" "$seconds" "${execs:-?}" "${rate:-?}" "${inited:-?}" "${done_:-?}" "${counters:-0}"
  ok=1
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc); the input is in fuzz/artifacts/$t/:" >&2
    grep -E -A30 'panicked|ERROR: libFuzzer|SUMMARY' "$log" | head -60 >&2
    ok=0
  elif [ "${counters:-0}" -eq 0 ]; then
    echo "fuzz: $t ran without coverage instrumentation" >&2
    ok=0
  fi
  if [ "$ok" -eq 1 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    status=1
  fi
done
# One target, one test: the closing line test runners end with.
echo "fuzz: $passed passed, $failed failed"
exit "$status"
