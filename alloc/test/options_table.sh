#!/bin/sh
# options_table.sh BUILD [--write] — compares README.md's options table (between the
# options-table markers) with the one src/options.c defines (printed by
# BUILD/rel/test_unit --options-table): prints "PASS options table" or "FAIL ..." and
# the difference; with --write, rewrites README.md's table instead. Also fails when a
# source file other than options.c reads a MEMCOLO_ variable itself.
B=${1:-build}
HERE=$(cd "$(dirname "$0")/.." && pwd)
README=$HERE/README.md
BEGIN='<!-- options-table: generated from src/options.c -->'
END='<!-- end options-table -->'
want=$(mktemp)
have=$(mktemp)
trap 'rm -f "$want" "$have"' EXIT
"$B/rel/test_unit" --options-table >"$want" || { echo "FAIL options table: test_unit --options-table"; exit 1; }
if ! grep -qxF "$BEGIN" "$README" || ! grep -qxF "$END" "$README"; then
  echo "FAIL options table: README.md has no options-table markers"; exit 1
fi
# One definition each: no MEMCOLO_ variable is read anywhere but in options.c's table.
stray=$(grep -n 'getenv *( *"MEMCOLO_' "$HERE"/src/*.c | grep -v '/options\.c:')
if [ -n "$stray" ]; then
  echo "FAIL options table: MEMCOLO_ variables read outside src/options.c:"; echo "$stray"; exit 1
fi
if [ "${2:-}" = "--write" ]; then
  awk -v b="$BEGIN" -v e="$END" -v t="$want" '
    $0 == b { print; while ((getline l < t) > 0) print l; skip = 1; next }
    $0 == e { skip = 0 }
    !skip' "$README" >"$README.new" && mv "$README.new" "$README"
  echo "options table: README.md rewritten"
  exit 0
fi
awk -v b="$BEGIN" -v e="$END" '$0 == e { on = 0 } on; $0 == b { on = 1 }' "$README" >"$have"
if diff -u --label README.md --label src/options.c "$have" "$want"; then
  echo "PASS options table"
else
  echo "FAIL options table: README.md and src/options.c differ (make -C alloc options-table rewrites README.md)"
  exit 1
fi
