#!/usr/bin/env bash
# `make install` on a machine whose PID 1 is systemd gives a running memcolo.service.
#
# The machine CI and development run on does not boot systemd, so the check boots
# one: a Debian bookworm root file system (made once by scripts/setup.sh with
# debootstrap, at $MEMCOLO_NSPAWN_BASE) is copied to a scratch directory, this
# checkout is bind-mounted into it, and systemd-nspawn boots it with systemd as
# PID 1. Inside, as an operator would: `make install` (the release binary and
# libmemcolo built by scripts/setup.sh are installed, nothing is compiled), then the
# unit must be enabled and active, `memcolo status` must answer on the installed
# socket, and `systemctl stop` must stop it cleanly. The scratch copy is removed.
#
# Needs root, systemd-nspawn (Debian's systemd-container) and the base tree.
# Prints `service-test: N passed, N failed` last; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
BASE=${MEMCOLO_NSPAWN_BASE:-/var/lib/memcolo-test/bookworm}
passed=0
failed=0
check() { # name, command...
  local name=$1
  shift
  if "$@"; then
    echo "ok: $name"
    passed=$((passed + 1))
  else
    echo "FAILED: $name" >&2
    failed=$((failed + 1))
  fi
}
finish() {
  echo "service-test: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

if [ "$(id -u)" -ne 0 ]; then
  echo "service-test: needs root (systemd-nspawn)" >&2
  failed=1
  finish
  exit 1
fi
for need in systemd-nspawn nsenter; do
  command -v "$need" >/dev/null || {
    echo "service-test: $need not found (scripts/setup.sh installs it)" >&2
    failed=1
    finish
    exit 1
  }
done
if [ ! -x "$BASE/lib/systemd/systemd" ]; then
  echo "service-test: no systemd root file system at $BASE (scripts/setup.sh makes it)" >&2
  failed=1
  finish
  exit 1
fi
for f in target/release/memcolo alloc/build/libmemcolo.so; do
  [ -e "$f" ] || {
    echo "service-test: $f is missing (scripts/setup.sh builds it)" >&2
    failed=1
    finish
    exit 1
  }
done

work=$(mktemp -d /var/tmp/memcolo-service-test.XXXXXX)
root="$work/root"
nspawn_pid=""
cleanup() {
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    # SIGRTMIN+4 asks systemd for a poweroff; then the container is killed.
    [ -n "${init:-}" ] && kill -s RTMIN+4 "$init" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$nspawn_pid" 2>/dev/null
    wait "$nspawn_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
cp -a "$BASE" "$root"
mkdir -p "$root/src/memcolo"

# The host has no system bus and is not systemd: no machine registration, and the
# container stays in the caller's cgroup (--keep-unit).
systemd-nspawn -b -q -D "$root" --register=no --keep-unit \
  --bind="$REPO:/src/memcolo" --machine=memcolo-service-test \
  >"$work/boot.log" 2>&1 </dev/null &
nspawn_pid=$!
init=""
for _ in $(seq 1 60); do
  init=$(pgrep -P "$nspawn_pid" -x systemd | head -1)
  [ -n "$init" ] && break
  sleep 1
done
if [ -z "$init" ]; then
  echo "service-test: the container did not start systemd; its output:" >&2
  tail -20 "$work/boot.log" >&2
  failed=1
  finish
  exit 1
fi
inside() { nsenter -t "$init" -a -- "$@"; }
state=$(inside timeout 120 systemctl is-system-running --wait 2>&1)
echo "service-test: systemd in the container is $state"

install_ok=true
# MEMCOLO_BIN names the binary setup.sh built, so that make installs it as it is
# (the machine under test has no Rust toolchain).
inside sh -c 'cd /src/memcolo && make install MEMCOLO_BIN=/src/memcolo/target/release/memcolo' \
  >"$work/install.log" 2>&1 || {
  install_ok=false
  tail -30 "$work/install.log" >&2
}
check "make install inside the systemd machine" $install_ok
check "memcolo.service is enabled" inside systemctl is-enabled -q memcolo.service
active=false
for _ in $(seq 1 30); do
  if inside systemctl is-active -q memcolo.service; then active=true; break; fi
  sleep 1
done
check "memcolo.service is active" $active
inside systemctl show -p MainPID -p ActiveState -p ExecMainStartTimestamp memcolo.service | tr '\n' ' '
echo
check "memcolo status answers on the installed socket" \
  inside sh -c 'for i in $(seq 1 20); do memcolo status >/dev/null 2>&1 && exit 0; sleep 1; done; memcolo status'
# 0: every default mechanism can run; 1: some cannot (a container may lack one);
# anything else is a failure of the command itself.
inside memcolo doctor >"$work/doctor.log" 2>&1
rc=$?
# Every mechanism that is on by default must have started under the unit's sandbox.
inside memcolo status --json >"$work/status.json" 2>&1
check "every mechanism runs under the unit's sandbox ($(grep -Eo '"mechanisms_off": *\{[^}]*\}' "$work/status.json"))" \
  grep -Eq '"mechanisms_off": *\{\}' "$work/status.json"
check "memcolo doctor runs on the installed binary (exit $rc)" test "$rc" -le 1
check "the service stops cleanly" inside systemctl stop memcolo.service
check "the stopped service did not fail" \
  sh -c "! nsenter -t $init -a -- systemctl is-failed -q memcolo.service"
if [ "$failed" -gt 0 ]; then
  inside journalctl -u memcolo.service --no-pager -n 40 >&2 || true
fi
finish
