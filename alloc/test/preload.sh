#!/bin/sh
# preload.sh LIB — real programs under LD_PRELOAD=LIB, each passing its own checks, and
# a probe that the preload really interposes (the MEMCOLO_STATS=1 report at exit shows
# that memcolo served the program's allocations). Prints "PASS name" / "FAIL name".
LIB=$(readlink -f "$1")
TMP=$(mktemp -d /tmp/memcolo-preload.XXXXXX)
MCPID=""
cleanup() { [ -n "$MCPID" ] && kill "$MCPID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM
PY=/usr/bin/python3

ok() { echo "PASS $1"; }
ko() { echo "FAIL $1"; [ -f "$2" ] && tail -20 "$2"; }

# interposition probe: the report exists and memcolo served allocations
served() { grep -q "memcolo: allocator report" "$1" && awk '/malloc_slow_calls/ { if ($2 > 0) found=1 } END { exit !found }' "$1"; }

# 1. python3 running a standard-library test subset (a python whose test package is
#    installed: Debian's python3 ships only test.support)
PYT=""
for cand in "$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null)" /usr/bin/python3; do
  if [ -x "$cand" ] && "$cand" -c "import test.test_list" 2>/dev/null; then PYT=$cand; break; fi
done
if [ -z "$PYT" ]; then
  ko "python3-stdlib-tests (no python with the test package)"
# -w re-runs a failed test file once, verbosely (as CPython's own CI does): a timing
# test of test_threading failed once of six runs on the 2-vCPU VM right after the Rust
# tests and never again; a file failing twice fails here, and the verbose re-run names
# the case in the output shown.
elif LD_PRELOAD=$LIB "$PYT" -m test -q -w -i test_import_from_another_thread test_list test_dict test_set test_re test_json \
     test_collections test_heapq test_bisect test_struct test_threading test_bytes test_unicode \
     >"$TMP/py.out" 2>"$TMP/py.err" && grep -Eq "Tests result: (FAILURE then )?SUCCESS" "$TMP/py.out"; then
  if grep -q "FAILURE then SUCCESS" "$TMP/py.out"; then
    ok "python3-stdlib-tests (passed on its re-run: $(grep -A3 'failed' "$TMP/py.out" | tr -s ' \n' ' ' | cut -c1-120))"
  else ok python3-stdlib-tests; fi
else ko python3-stdlib-tests "$TMP/py.out"; fi
# (the stdlib tests compare children's stderr, so the report probe runs separately)
PY=${PYT:-$PY}
if MEMCOLO_STATS=1 LD_PRELOAD=$LIB $PY -c "import json; d=[{'k':i,'v':'x'*(i%300)} for i in range(200000)]; s=json.dumps(d); assert json.loads(s)==d" 2>"$TMP/py2.err" && served "$TMP/py2.err"; then
  ok python3-interposed
else ko python3-interposed "$TMP/py2.err"; fi

# 2. sqlite3: a table of 100k rows, an index, queries and the integrity check
cat >"$TMP/q.sql" <<'SQL'
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 100000)
INSERT INTO t SELECT x, printf('name-%d-%s', x, hex(randomblob(16))), x * 0.5 FROM c;
CREATE INDEX t_name ON t(name);
SELECT count(*), sum(v) FROM t;
SELECT count(*) FROM t WHERE name LIKE 'name-99%';
DELETE FROM t WHERE id % 3 = 0;
VACUUM;
PRAGMA integrity_check;
SELECT count(*) FROM t;
SQL
if MEMCOLO_STATS=1 LD_PRELOAD=$LIB sqlite3 "$TMP/db.sqlite" <"$TMP/q.sql" >"$TMP/sq.out" 2>"$TMP/sq.err" && \
   [ "$(sed -n 1p "$TMP/sq.out")" = "100000|2500025000.0" ] && [ "$(sed -n 2p "$TMP/sq.out")" = "1111" ] && \
   [ "$(sed -n 3p "$TMP/sq.out")" = "ok" ] && [ "$(sed -n 4p "$TMP/sq.out")" = "66667" ] && served "$TMP/sq.err"; then
  ok sqlite3
else ko sqlite3 "$TMP/sq.out"; cat "$TMP/sq.err" | tail -5; fi

# 3. memcached with a load (sets, gets, deletes from 4 client threads), then a clean exit
PORT=$((20000 + $$ % 20000))
MEMCOLO_STATS=1 LD_PRELOAD=$LIB memcached -u root -l 127.0.0.1 -p $PORT -U 0 -m 256 -t 2 >"$TMP/mc.out" 2>"$TMP/mc.err" &
MCPID=$!
cat >"$TMP/load.py" <<'PYEOF'
import socket, sys, threading, time
port = int(sys.argv[1])
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", port)).close(); break
    except OSError:
        time.sleep(0.05)
errors = []
def client(tid):
    s = socket.create_connection(("127.0.0.1", port)); f = s.makefile("rwb")
    for i in range(5000):
        key = b"k%d_%d" % (tid, i); val = (b"v%d" % i) * (1 + i % 200)
        f.write(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(val), val)); f.flush()
        if f.readline() != b"STORED\r\n": errors.append("set"); return
    for i in range(0, 5000, 7):
        key = b"k%d_%d" % (tid, i); val = (b"v%d" % i) * (1 + i % 200)
        f.write(b"get %s\r\n" % key); f.flush()
        hdr = f.readline(); data = f.readline(); end = f.readline()
        if data[:-2] != val or end != b"END\r\n": errors.append("get"); return
        if i % 2 == 0:
            f.write(b"delete %s\r\n" % key); f.flush()
            if f.readline() != b"DELETED\r\n": errors.append("delete"); return
    s.close()
ts = [threading.Thread(target=client, args=(t,)) for t in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print("errors", len(errors)); sys.exit(1 if errors else 0)
PYEOF
if $PY "$TMP/load.py" $PORT >"$TMP/load.out" 2>&1; then LOADOK=1; else LOADOK=0; fi
kill -TERM $MCPID 2>/dev/null; wait $MCPID 2>/dev/null; MCPID=""
if [ $LOADOK = 1 ] && served "$TMP/mc.err"; then ok memcached-load; else ko memcached-load "$TMP/load.out"; tail -5 "$TMP/mc.err"; fi

# 4. make -j2 of a C project with gcc (cc1, as, ld all preloaded), then run the result
mkdir -p "$TMP/proj"
for i in 1 2 3 4 5 6; do
  cat >"$TMP/proj/m$i.c" <<CEOF
#include <stdlib.h>
#include <string.h>
int f$i(int n) { int *a = malloc(sizeof(int) * (size_t)n); int s = 0;
  for (int k = 0; k < n; k++) a[k] = k * $i; for (int k = 0; k < n; k++) s += a[k]; free(a); return s; }
CEOF
done
cat >"$TMP/proj/main.c" <<'CEOF'
#include <stdio.h>
int f1(int), f2(int), f3(int), f4(int), f5(int), f6(int);
int main(void) { printf("%d\n", f1(100) + f2(100) + f3(100) + f4(100) + f5(100) + f6(100)); return 0; }
CEOF
printf 'OBJS=main.o m1.o m2.o m3.o m4.o m5.o m6.o\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n%%.o: %%.c\n\t$(CC) -O2 -Wall -c $< -o $@\n' >"$TMP/proj/Makefile"
if MEMCOLO_STATS=1 LD_PRELOAD=$LIB make -s -j2 -C "$TMP/proj" >"$TMP/mk.out" 2>"$TMP/mk.err" && \
   [ "$("$TMP/proj/prog")" = "103950" ] && [ "$(grep -c 'memcolo: allocator report' "$TMP/mk.err")" -ge 8 ]; then
  ok make-j2-gcc
else ko make-j2-gcc "$TMP/mk.err"; fi

# 5. a C++ program: new/delete (sized, aligned, arrays) and exceptions through operator new
cat >"$TMP/x.cc" <<'CEOF'
#include <cstdio>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>
struct alignas(256) A { char c[300]; };
void *volatile sink;
volatile size_t big = static_cast<size_t>(1) << 50;
int main() {
  std::map<int, std::string> m;
  for (int i = 0; i < 100000; i++) m[i] = std::string(i % 100, 'x');
  std::vector<std::unique_ptr<A>> v;
  for (int i = 0; i < 1000; i++) { v.emplace_back(new A); if ((reinterpret_cast<unsigned long>(v.back().get()) & 255) != 0) return 2; }
  int *arr = new int[1000]; delete[] arr;
  try { sink = new char[big]; return 4; } catch (const std::bad_alloc &) {}
  try { sink = ::operator new(big); return 5; } catch (const std::bad_alloc &) {}
  std::printf("%zu\n", m.size());
  return 0;
}
CEOF
if g++ -O2 -o "$TMP/x" "$TMP/x.cc" 2>"$TMP/gxx.err" && MEMCOLO_STATS=1 LD_PRELOAD=$LIB "$TMP/x" >"$TMP/x.out" 2>"$TMP/x.err" && \
   [ "$(cat "$TMP/x.out")" = "100000" ] && served "$TMP/x.err"; then
  ok cxx-new-delete
else ko cxx-new-delete "$TMP/x.err"; cat "$TMP/gxx.err" | head; fi
