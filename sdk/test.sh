#!/usr/bin/env bash
# Runs the test suites of every memcolo SDK that this machine has the toolchain for
# (Rust, Python, Go, C, Java), all against the shared vectors in sdk/testvectors.
# Stops at the first failing suite with a non-zero exit; the last line is always
# "N passed, N failed" (counting suites). A suite whose toolchain is missing fails,
# unless MEMCOLO_TEST_ALLOW_SKIP=1 asks on purpose to skip it (then it is reported as
# skipped and not counted).
#   sdk/test.sh            all suites
#   sdk/test.sh go c       only those
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
passed=0
failed=0

have() { command -v "$1" >/dev/null 2>&1; }

run_suite() {
  local name=$1; shift
  echo "=== sdk/$name: $*"
  if "$@"; then
    passed=$((passed + 1))
    echo "=== sdk/$name: passed"
  else
    failed=$((failed + 1))
    echo "=== sdk/$name: FAILED"
    echo "$passed passed, $failed failed"
    exit 1
  fi
}

skip() {
  if [ "${MEMCOLO_TEST_ALLOW_SKIP:-}" = 1 ]; then
    echo "=== sdk/$1: skipped on purpose ($2; MEMCOLO_TEST_ALLOW_SKIP=1)"
  else
    failed=$((failed + 1))
    echo "=== sdk/$1: FAILED: cannot run: $2 (set MEMCOLO_TEST_ALLOW_SKIP=1 to skip it on purpose)"
  fi
}

suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(rust python go c java)
for s in "${suites[@]}"; do
  case $s in
    rust)
      if have cargo; then run_suite rust cargo test -q -p memcolo-sdk; else skip rust "no cargo"; fi ;;
    python)
      if have "$PY" && "$PY" -c 'import pytest' 2>/dev/null; then
        run_suite python "$PY" -m pytest -q -p no:cacheprovider sdk/python
      else skip python "no $PY with pytest"; fi ;;
    go)
      if have go; then run_suite go bash -c 'cd sdk/go && go test -count=1 ./...'; else skip go "no go"; fi ;;
    c)
      if have make && have cc; then run_suite c make -s -C sdk/c test; else skip c "no make/cc"; fi ;;
    java)
      if have mvn && have java; then run_suite java mvn -B -q -f sdk/java test; else skip java "no mvn/java"; fi ;;
    *)
      echo "unknown suite $s (rust, python, go, c, java)"; failed=$((failed + 1))
      echo "$passed passed, $failed failed"; exit 2 ;;
  esac
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
