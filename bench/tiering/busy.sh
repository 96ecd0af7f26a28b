#!/bin/bash
# Runs "$@" and appends to $BUSY_LOG the machine's busy share (from /proc/stat) and load over it.
read -r _ u n s i w q sq st _ < /proc/stat; b0=$((u+n+s+q+sq+st)); t0=$((b0+i+w))
"$@"; rc=$?
read -r _ u n s i w q sq st _ < /proc/stat; b1=$((u+n+s+q+sq+st)); t1=$((b1+i+w))
echo "$(date -u +%FT%TZ) busy $(( 100*(b1-b0)/(t1-t0) ))% load $(cut -d' ' -f1-3 /proc/loadavg) rc $rc: $*" >> "$BUSY_LOG"
exit $rc
