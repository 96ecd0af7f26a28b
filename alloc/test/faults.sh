#!/bin/sh
# faults.sh BUILD — fault injection (test/faultshim.c preloaded before
# BUILD/libmemcolo.so, test/fault_prog.c as the workload): transient failures of mmap,
# madvise and mlock must never make an allocation return NULL nor put a word on the
# program's stderr; a system that refuses every mapping gets NULL with ENOMEM, and with
# MEMCOLO_VERBOSE=1 the reason on stderr. Also CPython (PYTHONMALLOC=malloc) starting
# under transient mmap failures. Prints "PASS name" / "FAIL name".
B=${1:-build}
LIB=$(readlink -f "$B/libmemcolo.so")
SHIM=$(readlink -f "$B/faultshim.so")
PROG=$(readlink -f "$B/fault_prog")
TMP=$(mktemp -d /tmp/memcolo-faults.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
# no agent here: a socket path that does not exist (the link retries silently)
export MEMCOLO_SOCKET="$TMP/no-agent.sock"

# case NAME MCFI EXPECT_FAILED_CALLS MODE [ENV...]: the program passes its own checks,
# stderr stays empty, and the shim really failed calls (at least one, when asked)
case_run() {
  name=$1 spec=$2 want=$3 mode=$4
  shift 4
  rm -f "$TMP/counts"
  env "$@" MCFI="$spec" MCFI_COUNTS="$TMP/counts" LD_PRELOAD="$SHIM $LIB" "$PROG" $mode >"$TMP/out" 2>"$TMP/err"
  rc=$?
  failed_calls=$(awk '{ n += $3 } END { print n + 0 }' "$TMP/counts" 2>/dev/null)
  if [ "$rc" -ne 0 ]; then
    echo "FAIL $name: exit $rc"; cat "$TMP/out"; head -5 "$TMP/err"
  elif [ -s "$TMP/err" ]; then
    echo "FAIL $name: the program's stderr is not empty:"; head -5 "$TMP/err"
  elif [ "$want" = 1 ] && [ "${failed_calls:-0}" -eq 0 ]; then
    echo "FAIL $name: no call was failed (counts: $(cat "$TMP/counts" 2>/dev/null | tr '\n' ' '))"
  else
    echo "PASS $name ($(cat "$TMP/counts" 2>/dev/null | tr '\n' ' '))"
  fi
}

# the management thread started (pthread_create, which callocs) inside a refill
case_run mgmt-start-inside-refill "" 0 oneclass
case_run mgmt-start-inside-refill-lc "" 0 oneclass MEMCOLO_CLASS=lc

# transient mmap failures: every mapping succeeds within the retries
case_run mmap-enomem-1-in-4 "mmap=ENOMEM:4:1" 1 "work 0.5"
case_run mmap-eagain-2-in-3 "mmap=EAGAIN:3:2" 1 "work 0.5"
case_run mmap-eintr-1-in-2 "mmap=EINTR:2:1" 1 "work 0.5"
case_run mmap-enomem-burst-4 "mmap=ENOMEM:16:4:5" 1 "work 0.5"
case_run mmap-enomem-lc "mmap=ENOMEM:3:1" 1 "work 1" MEMCOLO_CLASS=lc
case_run mremap-enomem "mremap=ENOMEM:1:1" 1 "work 0.5"
# optional calls failing: never a NULL, never a word on stderr (class lc: reservation,
# pooled blocks mlocked, background MADV_COLLAPSE in quiet seconds). Class lc collapses
# only whole free pre-faulted huge pages, and with min_rsv at its 5 MiB the reserve may
# be made of free pages of huge pages in use alone (none then to collapse: 2 runs of 10
# made no MADV_COLLAPSE call): 16 MiB keeps whole ones in it.
for spec in "madvise.25=EAGAIN:1:1" "madvise.25=EBUSY:1:1" "madvise.25=ENOMEM:2:1" \
            "madvise.25=EINVAL:1:1" "madvise.23=ENOMEM:1:1" \
            "madvise.23=EINVAL:1:1" "madvise.23=EINTR:2:1" "madvise.4=EAGAIN:1:1" \
            "mlock=EAGAIN:1:1" "mlock=ENOMEM:1:1" "madvise=EINVAL:3:1"; do
  case_run "lc-$spec" "$spec" 1 "hold 2.2" MEMCOLO_CLASS=lc MEMCOLO_MIN_RSV=16m
done
case_run "none-madvise.25=EAGAIN" "madvise.25=EAGAIN:1:1" 1 "hold 2.2"
case_run "lc-clean-stderr" "" 0 "work 1" MEMCOLO_CLASS=lc

# the system refuses every mapping: NULL with ENOMEM, silent by default, the reason
# with MEMCOLO_VERBOSE=1
if MCFI="mmap=ENOMEM:1:1" LD_PRELOAD="$SHIM $LIB" "$PROG" refuse >"$TMP/out" 2>"$TMP/err" && [ ! -s "$TMP/err" ]; then
  echo "PASS refused-null-silent"
else echo "FAIL refused-null-silent"; cat "$TMP/out"; head -5 "$TMP/err"; fi
if MEMCOLO_VERBOSE=1 MCFI="mmap=ENOMEM:1:1" LD_PRELOAD="$SHIM $LIB" "$PROG" refuse >"$TMP/out" 2>"$TMP/err" &&
   grep -q "memcolo: warning: the system refused .* (errno 12) after [0-9]* tries" "$TMP/err"; then
  echo "PASS refused-null-verbose"
else echo "FAIL refused-null-verbose"; cat "$TMP/out"; head -5 "$TMP/err"; fi

# CPython under transient mmap failures (the MemoryError at start-up)
PY=/usr/bin/python3
for spec in "mmap=ENOMEM:6:1" "mmap=ENOMEM:10:2" "mmap=EAGAIN:5:3:2"; do
  if PYTHONMALLOC=malloc MCFI="$spec" LD_PRELOAD="$SHIM $LIB" $PY -c \
     "import json; d=[{'k':i,'v':'x'*(i%300)} for i in range(100000)]; assert json.loads(json.dumps(d))==d; print('ok')" \
     >"$TMP/out" 2>"$TMP/err" && [ "$(cat "$TMP/out")" = ok ] && [ ! -s "$TMP/err" ]; then
    echo "PASS cpython-$spec"
  else echo "FAIL cpython-$spec"; tail -3 "$TMP/err"; fi
done
