#!/bin/sh
# misuse_table.sh BUILD — runs every case of misuse.c under glibc, mimalloc (Debian's
# libmimalloc2.0) and libmemcolo's release and debug builds (LD_PRELOAD), one line per
# case and allocator (memcolo-nocheck: the release build with MEMCOLO_DOUBLE_FREE_CHECK=0):
# "caught: <first line of the message>", "crash (signal N, no
# message)", "handed out twice" or "not caught". The source of the README's table.
B=${1:-build}
CC=${CC:-gcc}
$CC -O1 -g -pthread -Wall -Wno-free-nonheap-object -fno-builtin -o "$B/misuse" "$(dirname "$0")/misuse.c" || exit 1
MI=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2
for c in double-free-adjacent double-free-nonadjacent double-free-cross-thread interior-free \
         foreign-free overflow use-after-free; do
  for a in glibc mimalloc memcolo memcolo-nocheck memcolo-debug; do
    opt=
    case $a in
      glibc) pre= ;;
      mimalloc) pre=$MI ;;
      memcolo) pre=$B/libmemcolo.so ;;
      memcolo-nocheck) pre=$B/libmemcolo.so; opt=MEMCOLO_DOUBLE_FREE_CHECK=0 ;;
      memcolo-debug) pre=$B/libmemcolo-debug.so ;;
    esac
    out=$(env ${pre:+LD_PRELOAD=$pre} $opt "$B/misuse" "$c" 2>"$B/misuse.err")
    rc=$?
    msg=$(grep -v '^$' "$B/misuse.err" | head -1 | cut -c1-110)
    if [ $rc -gt 128 ]; then
      if [ -n "$msg" ]; then r="caught (signal $((rc - 128))): $msg"; else r="crash (signal $((rc - 128)), no message)"; fi
    else
      r=${out:-"exit $rc"}
    fi
    printf '%-26s %-14s %s\n' "$c" "$a" "$r"
  done
done 2>/dev/null
rm -f "$B/misuse.err"
