#!/bin/sh
# test-install.sh — `make install` into a temporary DESTDIR, then checks it: each file
# in its place with its mode, `pkg-config --cflags --libs memcolo` through
# PKG_CONFIG_SYSROOT_DIR, a C program compiled and linked with those flags runs on the
# installed library, `systemd-analyze verify` accepts the installed unit (a copy whose
# ExecStart names the binary under DESTDIR) and refuses it when the binary is
# missing, a second install keeps an existing agent.toml, `make uninstall` removes
# every installed file but agent.toml, and an
# install with DESTDIR empty (PREFIX below the temporary directory, ldconfig and
# systemctl stubbed) starts the service where PID 1 is systemd and says how to start
# the agent by hand where it is not.
# Uses the binary that `cargo test` built (MEMCOLO_BIN, default target/debug/memcolo),
# so no release build is needed. Last line "N passed, N failed"; exit 1 on a failure.
set -u
cd "$(dirname "$0")/.."
BIN=${MEMCOLO_BIN:-target/debug/memcolo}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
PASSED=0
FAILED=0
ok() { echo "PASS $1"; PASSED=$((PASSED + 1)); }
no() { echo "FAIL $1"; FAILED=$((FAILED + 1)); }
t() { name=$1; shift; if "$@" >"$D.out" 2>&1; then ok "$name"; else no "$name"; sed 's/^/  /' "$D.out" | tail -20; fi; }

[ -x "$BIN" ] || cargo build --locked -p memcolo
t "make install DESTDIR" make --no-print-directory install DESTDIR="$D" MEMCOLO_BIN="$BIN"
mode() { [ "$(stat -c %a "$D$1")" = "$2" ]; }
t "binary" mode /usr/local/bin/memcolo 755
t "library" mode /usr/local/lib/libmemcolo.so 755
t "header" mode /usr/local/include/memcolo.h 644
t "pkg-config file" mode /usr/local/lib/pkgconfig/memcolo.pc 644
t "unit" mode /usr/local/lib/systemd/system/memcolo.service 644
t "example config" mode /etc/memcolo/agent.toml.example 644
t "unit runs the installed binary" grep -qx 'ExecStart=/usr/local/bin/memcolo agent' \
  "$D/usr/local/lib/systemd/system/memcolo.service"
t "installed binary runs" "$D/usr/local/bin/memcolo" --version

flags=$(PKG_CONFIG_SYSROOT_DIR="$D" PKG_CONFIG_LIBDIR="$D/usr/local/lib/pkgconfig" \
  pkg-config --cflags --libs memcolo | sed 's/ *$//')
t "pkg-config --cflags --libs memcolo" [ "$flags" = "-I$D/usr/local/include -L$D/usr/local/lib -lmemcolo" ]
cat >"$D/prog.c" <<'C'
#include <memcolo.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
  memcolo_stats_t s;
  void *p = malloc(1000);
  int rc = memcolo_stats(&s);
  free(p);
  if (rc != 0 || s.version != MEMCOLO_STATS_VERSION) return 1;
  puts("linked");
  return 0;
}
C
# shellcheck disable=SC2086 # the flags are words
t "a program links with pkg-config's flags" ${CC:-cc} -o "$D/prog" "$D/prog.c" $flags
t "and runs on the installed library" sh -c "export LD_LIBRARY_PATH='$D/usr/local/lib';
  '$D/prog' | grep -qx linked && ldd '$D/prog' | grep -q '=> $D/usr/local/lib/libmemcolo.so'"

# verify wants ExecStart's binary on this machine: the copy names the DESTDIR one.
mkdir -p "$D/verify" "$D/verify-bad"
sed "s|^ExecStart=/usr/local/bin/|ExecStart=$D/usr/local/bin/|" \
  "$D/usr/local/lib/systemd/system/memcolo.service" >"$D/verify/memcolo.service"
# verify exits 0 on an unknown or misspelt setting, so its output must be empty too.
t "systemd-analyze verify, without a warning" sh -c \
  "out=\$(systemd-analyze verify '$D/verify/memcolo.service' 2>&1) && [ -z \"\$out\" ] || { echo \"\$out\"; exit 1; }"
sed "s|^ExecStart=/usr/local/bin/memcolo|ExecStart=$D/no-such-memcolo|" \
  "$D/usr/local/lib/systemd/system/memcolo.service" >"$D/verify-bad/memcolo.service"
t "systemd-analyze verify fails on a unit whose binary is missing" sh -c \
  "! systemd-analyze verify '$D/verify-bad/memcolo.service'"

echo "# the operator's own settings" >"$D/etc/memcolo/agent.toml"
t "a second install" make --no-print-directory install DESTDIR="$D" MEMCOLO_BIN="$BIN"
t "keeps agent.toml" grep -qx "# the operator's own settings" "$D/etc/memcolo/agent.toml"
t "make uninstall DESTDIR" make --no-print-directory uninstall DESTDIR="$D"
left=$(cd "$D" && find . -type f ! -name 'prog*' ! -path './verify*' | sort | tr '\n' ' ')
t "uninstall leaves only agent.toml" [ "$left" = "./etc/memcolo/agent.toml " ]
# DESTDIR empty (into a PREFIX below $D, with ldconfig and systemctl stubbed): the
# service is enabled and started when PID 1 is systemd, else the operator is told
# how to start the agent.
P=$D/prefix
t "without systemd: one line on starting the agent by hand" sh -c \
  "out=\$(make --no-print-directory install PREFIX='$P' CONFDIR='$P/etc/memcolo' \
     MEMCOLO_BIN='$BIN' LDCONFIG='echo ldconfig' SYSTEMCTL='echo systemctl' \
     SYSTEMD_RUNDIR='$D/no-such-dir') &&
   echo \"\$out\" | grep -qx ldconfig &&
   echo \"\$out\" | grep -qx 'memcolo: PID 1 is not systemd, no service started; start the agent by hand: $P/bin/memcolo agent &' &&
   ! echo \"\$out\" | grep -q '^systemctl'"
mkdir -p "$D/systemd-run"
t "with systemd: daemon-reload, then enable --now" sh -c \
  "out=\$(make --no-print-directory install PREFIX='$P' CONFDIR='$P/etc/memcolo' \
     MEMCOLO_BIN='$BIN' LDCONFIG='echo ldconfig' SYSTEMCTL='echo systemctl' \
     SYSTEMD_RUNDIR='$D/systemd-run') &&
   [ \"\$(echo \"\$out\" | grep '^systemctl' | tr '\n' ';')\" = 'systemctl daemon-reload;systemctl enable --now memcolo.service;' ]"
rm -f "$D.out"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
