#!/bin/sh
# run.sh BUILD — runs every test program of every build (release, debug with invariant
# checks, ASan+UBSan), the real-program preload checks, the options table check
# (options_table.sh) and the test against the real agent (agent_real.sh); prints the
# total as its last
# line, "N passed, N failed", and exits non-zero on any failure.
B=${1:-build}
HERE=$(dirname "$0")
PASSED=0
FAILED=0
add() { PASSED=$((PASSED + $1)); FAILED=$((FAILED + $2)); }

run_prog() { # name env... -- cmd
  name=$1; shift
  out=$(mktemp)
  env "$@" >"$out" 2>"$out.err"
  rc=$?
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -1)
  if [ -z "$line" ]; then
    echo "FAIL $name: no result line (exit $rc)"; tail -15 "$out.err"; add 0 1
  else
    p=${line%% passed*}; f=${line#*, }; f=${f%% failed}
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    echo "$name: $line"
    [ "$f" -ne 0 ] && grep -E "FAIL|error" "$out.err" | head -20
    add "$p" "$f"
  fi
  rm -f "$out" "$out.err"
}

for v in rel dbg; do
  run_prog "$v/test_unit" "$B/$v/test_unit"
  run_prog "$v/test_stress" "$B/$v/test_stress"
  run_prog "$v/test_errors" "$B/$v/test_errors"
  run_prog "$v/test_errors (MEMCOLO_DOUBLE_FREE_CHECK=0)" MEMCOLO_DOUBLE_FREE_CHECK=0 "$B/$v/test_errors"
  run_prog "$v/test_reserve" MEMCOLO_CLASS=lc "$B/$v/test_reserve"
  run_prog "$v/test_agent" "$B/$v/test_agent"
  run_prog "$v/test_vectors" "$B/$v/test_vectors"
done
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run_prog "san/test_unit" "$B/san/test_unit"
run_prog "san/test_stress" "$B/san/test_stress"

for lib in "$B/libmemcolo.so" "$B/libmemcolo-debug.so"; do
  res=$(sh "$HERE/preload.sh" "$lib" 2>&1)
  echo "$res" | sed "s|^|$(basename "$lib"): |" | grep -E "PASS|FAIL" 
  [ -n "$(echo "$res" | grep '^FAIL')" ] && echo "$res" | grep -v '^PASS' | head -40
  add "$(echo "$res" | grep -c '^PASS')" "$(echo "$res" | grep -c '^FAIL')"
done
# fault injection: transient mmap/madvise/mlock failures never give NULL nor stderr output
res=$(sh "$HERE/faults.sh" "$B" 2>&1)
echo "$res" | grep -E "^(PASS|FAIL)" | sed 's/ (.*//'
[ -n "$(echo "$res" | grep '^FAIL')" ] && echo "$res" | grep -v '^PASS' | head -40
add "$(echo "$res" | grep -c '^PASS')" "$(echo "$res" | grep -c '^FAIL')"
# memory-cgroup pressure with zram swap switched on and off (root, cgroup v1)
res=$(sh "$HERE/pressure.sh" "$B" 2>&1)
echo "$res" | grep -E "^(PASS|FAIL|SKIP)"
[ -n "$(echo "$res" | grep '^FAIL')" ] && echo "$res" | grep -v -E '^(PASS|SKIP)' | head -20
add "$(echo "$res" | grep -c '^PASS')" "$(echo "$res" | grep -c '^FAIL')"
# README.md's options table is options.c's
res=$(sh "$HERE/options_table.sh" "$B" 2>&1)
echo "$res" | grep -E "^(PASS|FAIL)"
[ -n "$(echo "$res" | grep '^FAIL')" ] && echo "$res" | grep -v '^PASS' | head -40
add "$(echo "$res" | grep -c '^PASS')" "$(echo "$res" | grep -c '^FAIL')"
# the library against the real agent (fails where it cannot run: not root, no cgroup v1,
# unless MEMCOLO_TEST_ALLOW_SKIP=1 skips it on purpose)
res=$(sh "$HERE/agent_real.sh" "$B" 2>&1)
echo "$res" | grep -E "^(PASS|FAIL|SKIP)"
[ -n "$(echo "$res" | grep '^FAIL')" ] && echo "$res" | grep -v -E '^(PASS|SKIP)' | head -40
add "$(echo "$res" | grep -c '^PASS')" "$(echo "$res" | grep -c '^FAIL')"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
