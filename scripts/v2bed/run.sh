#!/usr/bin/env bash
# The cgroup v2 test bed: runs memcolo's real-kernel tests in a guest whose unified
# hierarchy (cgroup2) has the memory controller, which this machine's kernel binds to
# cgroup v1.
#
# 1. Installs what it lacks with apt (qemu-system-x86, linux-image-cloud-amd64,
#    busybox-static; scripts/setup.sh lists them too).
# 2. Builds the test programs named in scripts/v2bed/tests (`cargo test --no-run`) and
#    packs an initramfs: busybox, scripts/v2bed/init as /init, those programs and the
#    memcolo binary at the paths cargo gave them (the tests find the binary by the
#    path compiled into them), python3 with its standard library, util-linux's
#    setpriv, the zram modules of the guest kernel, and every shared library these
#    need (ldd). The image is cached in target/v2bed/ under the hash of its inputs.
# 3. Boots Debian's kernel on it with qemu-system-x86_64 under TCG, bounded by
#    MEMCOLO_V2BED_TIMEOUT seconds (default 1500); /init runs the tests and powers off.
#    It also checks that `memcolo doctor` lists the v2 memory files there.
# 4. Reads the markers /init prints on the serial console, keeps the console log in
#    target/v2bed/console.log and the kernel's text of a v2 group's files in
#    target/v2bed/fixtures/, prints the guest step's wall time and exits non-zero on
#    any failed test, a missing result, or the time bound.
#
# When the bed cannot run here (not root; qemu, the kernel or busybox missing and no
# apt to install them), it fails saying why, unless MEMCOLO_TEST_ALLOW_SKIP=1 asks to
# skip on purpose.
#
# Options: --prepare (install, build and cache the image, do not boot).
# Environment: MEMCOLO_V2BED_MEM (guest memory, default 2G), MEMCOLO_V2BED_TIMEOUT,
# MEMCOLO_V2BED_TESTS (another test list file), MEMCOLO_V2BED_KERNEL (a vmlinuz),
# MEMCOLO_V2BED_RUN (a python3 script the guest runs after the tests; its
# `V2BED:MEASURE <json>` lines are saved to target/v2bed/measure.jsonl).
set -euo pipefail
# The whole script is one compound command, read before it runs: editing the file
# while a guest runs cannot change what this run does.
{
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=$ROOT/target/v2bed
mkdir -p "$OUT"

cannot_run() {
  if [ "${MEMCOLO_TEST_ALLOW_SKIP:-}" = 1 ]; then
    echo "v2bed: skipped on purpose (MEMCOLO_TEST_ALLOW_SKIP=1): $*"
    exit 0
  fi
  echo "v2bed: cannot run here: $* (MEMCOLO_TEST_ALLOW_SKIP=1 skips it on purpose)" >&2
  exit 1
}

PREPARE_ONLY=0
[ "${1:-}" = --prepare ] && PREPARE_ONLY=1

# --- 1. packages -------------------------------------------------------------------
PKGS=(qemu-system-x86 linux-image-cloud-amd64 busybox-static)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || cannot_run "packages ${missing[*]} missing and not root to install them"
  command -v apt-get >/dev/null || cannot_run "packages ${missing[*]} missing and no apt-get"
  echo "v2bed: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || cannot_run "apt-get install ${missing[*]} failed"
fi
[ "$(id -u)" -eq 0 ] || cannot_run "needs root (reads /boot/vmlinuz-*)"
KERNEL=${MEMCOLO_V2BED_KERNEL:-$(ls -v /boot/vmlinuz-*-cloud-amd64 2>/dev/null | tail -n 1)}
[ -r "$KERNEL" ] || cannot_run "no kernel /boot/vmlinuz-*-cloud-amd64"
KVER=${KERNEL##*/vmlinuz-}
BUSYBOX=$(readlink -f /bin/busybox)
command -v qemu-system-x86_64 >/dev/null || cannot_run "no qemu-system-x86_64"
{ ldd "$BUSYBOX" 2>&1 || true; } | grep -q "not a dynamic" || cannot_run "$BUSYBOX is not the static busybox (busybox-static)"

# --- 2. test programs --------------------------------------------------------------
TESTS=${MEMCOLO_V2BED_TESTS:-$ROOT/scripts/v2bed/tests}
# The whole workspace, as `make test-rust` builds it (the same artifacts, no rebuild);
# nothing when the list names no test (a measurement run).
if grep -qv '^\s*\(#\|$\)' "$TESTS"; then
  cargo test --workspace --locked --no-run --message-format=json 2>"$OUT/build.err" >"$OUT/build.json" || {
    cat "$OUT/build.err" >&2
    echo "v2bed: cargo test --no-run failed" >&2
    exit 1
  }
else
  : >"$OUT/build.json"
fi
# The guest's test list: `<executable> <test name>...`, and the binaries it needs.
python3 - "$TESTS" "$OUT/build.json" "$OUT/tests.resolved" "$OUT/bins" <<'PY'
import json, sys
tests, build, resolved, bins = sys.argv[1:]
exe = {}  # (package name, target name) -> test executable
extra = set()
for line in open(build):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    # `path+file:///…/dir#name@1.0`, `path+file:///…/name#1.0`, or `name 1.0 (…)`.
    pid = m["package_id"]
    if " " in pid:
        pkg = pid.split()[0]
    else:
        where, _, frag = pid.partition("#")
        pkg = frag.split("@")[0] if "@" in frag else where.rsplit("/", 1)[-1]
    kinds = m["target"]["kind"]
    if m["profile"]["test"]:
        exe[(pkg, m["target"]["name"])] = m["executable"]
    elif "bin" in kinds and m["target"]["name"] == "memcolo":
        extra.add(m["executable"])  # the agent the tests start
out, need = [], set(extra)
for line in open(tests):
    f = line.split()
    if not f or f[0].startswith("#"):
        continue
    key = (f[0], f[1])
    if key not in exe:
        sys.exit(f"v2bed: no test target {f[1]} in package {f[0]} (scripts/v2bed/tests)")
    out.append(" ".join([exe[key]] + f[2:]))
    need.add(exe[key])
open(resolved, "w").write("\n".join(out) + "\n")
open(bins, "w").write("\n".join(sorted(need)) + "\n")
PY

# --- the image, cached by its inputs ------------------------------------------------
# zram (the guest's /var/tmp and the tests' swap) with its default compressor.
MODS=$(for m in zram lzo-rle; do modprobe -S "$KVER" --show-depends "$m" || echo FAIL "$m"; done \
  | awk '$1 == "insmod" || $1 == "FAIL" {print $2}' | awk '!seen[$0]++')
for m in $MODS; do [ -f "$m" ] || cannot_run "no module $m of kernel $KVER"; done
PYTHON=$(readlink -f /usr/bin/python3)
SETPRIV=$(readlink -f "$(command -v setpriv)") || cannot_run "no setpriv (util-linux)"
PYLIB=$(dirname "$("$PYTHON" -c 'import os; print(os.__file__)')")
key=$( {
  sha256sum "$KERNEL" "$BUSYBOX" "$PYTHON" "$SETPRIV" scripts/v2bed/init "$0" "$OUT/tests.resolved" $MODS \
    ${MEMCOLO_V2BED_RUN:+"$MEMCOLO_V2BED_RUN"}
  xargs -a "$OUT/bins" sha256sum
  echo "$PYLIB"
} | sha256sum | cut -c1-16)
IMAGE=$OUT/initramfs-$key.cpio
if [ ! -f "$IMAGE" ]; then
  t0=$(date +%s.%N)
  STAGE=$OUT/stage
  rm -rf "$STAGE" "$OUT"/initramfs-*.cpio
  mkdir -p "$STAGE"/{usr/bin,usr/sbin,usr/lib,usr/lib64,v2bed/modules,etc,root}
  for d in bin sbin lib lib64; do ln -s usr/$d "$STAGE/$d"; done
  cp "$BUSYBOX" "$STAGE/usr/bin/busybox"
  ln -s busybox "$STAGE/usr/bin/sh"
  install -m 0755 scripts/v2bed/init "$STAGE/init"
  cp "$OUT/tests.resolved" "$STAGE/v2bed/tests"
  [ -z "${MEMCOLO_V2BED_RUN:-}" ] || cp "$MEMCOLO_V2BED_RUN" "$STAGE/v2bed/run.py"
  # The agent binary the tests run, for the guest's `memcolo doctor` check.
  memcolo=$(grep -m1 '/memcolo$' "$OUT/bins" || true)
  [ -z "$memcolo" ] || ln -s "$memcolo" "$STAGE/v2bed/memcolo"
  i=0
  for m in $MODS; do i=$((i + 1)); cp "$m" "$STAGE/v2bed/modules/$(printf %02d $i)-${m##*/}"; done
  echo "root:x:0:0:root:/root:/bin/sh" >"$STAGE/etc/passwd"
  echo "root:x:0:" >"$STAGE/etc/group"
  # Programs at their own paths (resolved: /bin is /usr/bin in the guest too), without
  # debug sections.
  elves=()
  while read -r b; do
    [ -n "$b" ] || continue
    mkdir -p "$STAGE$(dirname "$b")"
    objcopy --strip-debug "$b" "$STAGE$b"
    elves+=("$b")
  done <"$OUT/bins"
  cp "$PYTHON" "$STAGE/usr/bin/"
  ln -s "${PYTHON##*/}" "$STAGE/usr/bin/python3"
  elves+=("$PYTHON")
  # util-linux's setpriv: hermes_e2e's tenants drop to other uids with it.
  cp "$SETPRIV" "$STAGE/usr/bin/setpriv"
  elves+=("$SETPRIV")
  # The standard library without its tests, caches and tools.
  mkdir -p "$STAGE$PYLIB"
  (cd "$PYLIB" && tar -c --exclude=__pycache__ --exclude=./test --exclude=./idlelib \
    --exclude=./tkinter --exclude=./turtledemo --exclude=./ensurepip --exclude=./lib2to3 \
    --exclude=./pydoc_data --exclude=./distutils --exclude='./config-*' \
    --exclude=./dist-packages --exclude=./site-packages .) | tar -x -C "$STAGE$PYLIB"
  elves+=("$PYLIB"/lib-dynload/*.so)
  # Their shared libraries, at the resolved paths.
  for e in "${elves[@]}"; do ldd "$e" 2>/dev/null || true; done \
    | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u \
    | while read -r lib; do
        real=$(readlink -f "$lib")
        mkdir -p "$STAGE$(dirname "$real")"
        [ -e "$STAGE$real" ] || cp "$real" "$STAGE$real"
        # The name programs ask for (the loader's path, a versioned soname).
        case "$lib" in
          /lib64/*|/lib/*) l=/usr$lib ;;
          *) l=$lib ;;
        esac
        [ -e "$STAGE$l" ] || ln -s "$real" "$STAGE$l"
      done
  (cd "$STAGE" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) >"$IMAGE.partial"
  mv "$IMAGE.partial" "$IMAGE"
  rm -rf "$STAGE"
  echo "v2bed: image $(du -m "$IMAGE" | cut -f1) MiB built in $(awk "BEGIN {print $(date +%s.%N) - $t0}") s: $IMAGE"
else
  echo "v2bed: cached image $IMAGE"
fi
[ "$PREPARE_ONLY" = 1 ] && exit 0

# --- 3. boot -----------------------------------------------------------------------
LOG=$OUT/console.log
TIMEOUT=${MEMCOLO_V2BED_TIMEOUT:-1500}
echo "v2bed: booting $KERNEL under TCG (${MEMCOLO_V2BED_MEM:-2G}, 2 CPUs, at most $TIMEOUT s)"
t0=$(date +%s.%N)
set +e
timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max \
  -m "${MEMCOLO_V2BED_MEM:-2G}" -smp 2 -nographic -no-reboot -nic none \
  -kernel "$KERNEL" -initrd "$IMAGE" \
  -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" \
  </dev/null >"$LOG" 2>&1
qrc=$?
set -e
wall=$(awk "BEGIN {print $(date +%s.%N) - $t0}")

# --- 4. results --------------------------------------------------------------------
tr -d '\r' <"$LOG" >"$LOG.tmp" && mv "$LOG.tmp" "$LOG"
grep '^V2BED:FACT' "$LOG" | sed 's/^V2BED:FACT /v2bed: guest /' || true
grep '^V2BED:END' "$LOG" | awk '{sub(".*/", "", $2); print "v2bed:", ($4 == "rc=0" ? "ok  " : "FAIL"), $2, $3, $5}' || true
passed=$(grep -c '^V2BED:END .* rc=0 ' "$LOG" || true)
failed=$(grep '^V2BED:END' "$LOG" | grep -vc ' rc=0 ' || true)
expected=$(awk 'NF {n += NF - 1} END {print n + 0}' "$OUT/tests.resolved")
grep -q '/memcolo$' "$OUT/bins" && expected=$((expected + 1))  # the doctor check
echo "v2bed: guest step $(printf %.1f "$wall") s wall (boot, tests, power-off); console log $LOG"
status=0
if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
  echo "v2bed: the guest did not finish within $TIMEOUT s; the end of $LOG:" >&2
  tail -n 30 "$LOG" >&2
  status=1
elif ! grep -q '^V2BED:DONE' "$LOG"; then
  echo "v2bed: the guest stopped before its end marker (qemu exit $qrc); see $LOG" >&2
  tail -n 30 "$LOG" >&2
  status=1
fi
# The v2 files the guest printed, for crates/memcolo-linux/tests/fixtures/v2-guest/.
rm -rf "$OUT/fixtures" && mkdir -p "$OUT/fixtures"
awk -v dir="$OUT/fixtures" '/^V2BED:FILE-BEGIN / {f = dir "/" $2; printf "" >f; next}
  /^V2BED:FILE-END/ {close(f); f = ""; next} f != "" {print >>f}' "$LOG"
if [ -n "${MEMCOLO_V2BED_RUN:-}" ]; then
  grep '^V2BED:MEASURE ' "$LOG" | sed 's/^V2BED:MEASURE //' >"$OUT/measure.jsonl" || true
  echo "v2bed: $(wc -l <"$OUT/measure.jsonl") measurements in $OUT/measure.jsonl"
  if ! grep -q '^V2BED:RUN-END rc=0' "$LOG"; then
    echo "v2bed: $MEMCOLO_V2BED_RUN failed in the guest; see $LOG" >&2
    status=1
  fi
fi
if [ $((passed + failed)) -ne "$expected" ]; then
  echo "v2bed: $((passed + failed)) of $expected tests reported" >&2
  status=1
fi
if [ "$failed" -gt 0 ]; then
  # The output of each failed test, from its begin marker to its end marker.
  awk '/^V2BED:BEGIN/ {buf = ""; on = 1} on {buf = buf $0 "\n"}
       /^V2BED:END/ {on = 0; if ($4 != "rc=0") printf "%s", buf}' "$LOG" | tail -n 200 >&2
  status=1
fi
# A test that never reported (the guest stopped or ran out of time) counts as failed.
[ $((expected - passed)) -gt "$failed" ] && failed=$((expected - passed))
echo "v2bed: $passed passed, $failed failed"
exit $status
}
