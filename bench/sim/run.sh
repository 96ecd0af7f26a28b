#!/bin/sh
# Runs bench/sim: the scale benchmark (3 runs under the bench lock), the validation
# scenarios and the papers' experiments at their sizes; raw reports go to
# bench/out/sim/<date>-<host>/ (not in git), report.py writes report.md and the plots
# there and copies the plots into bench/sim/plots/ (committed).
# Usage: bench/sim/run.sh   (from the repository root; no root needed)
set -eu
out="bench/out/sim/$(date +%Y-%m-%d)-$(hostname)"
mkdir -p "$out"
cargo build --release -p memcolo-sim --example sim
sim=target/release/examples/sim
git rev-parse --short HEAD > "$out/commit"
for i in 1 2 3; do
    flock /tmp/memcolo-bench.lock "$sim" scale --json > "$out/scale-$i.json"
done
# Exit status 1 while a metric is outside the bound: recorded, not fatal here.
"$sim" --validate --out "$out/validate" > "$out/validate.txt" || true
"$sim" colocation --out "$out/colocation" > "$out/colocation.txt"
"$sim" colocation --node-mem 4G --out "$out/colocation-4g" > "$out/colocation-4g.txt"
"$sim" m3-elastic --node-mem 2G --swap 0 --stagger 0 --out "$out/m3-jjj0" > "$out/m3-jjj0.txt"
"$sim" m3-elastic --out "$out/m3-64g" > "$out/m3-64g.txt"
for s in 1 2 3; do
    "$sim" colocation --seed "$s" --json > "$out/colocation-seed-$s.json"
done
# Fleet: a thousand nodes for a simulated day, memcolo only (the scale figure), three
# times, then the kernel/memcolo A/B once; each run under the lock.
for i in 1 2 3; do
    flock /tmp/memcolo-bench.lock /usr/bin/time -f "%e %U %S" -o "$out/fleet-memcolo-$i.time" \
        "$sim" fleet --modes memcolo --json > "$out/fleet-memcolo-$i.json"
done
flock /tmp/memcolo-bench.lock "$sim" fleet --out "$out/fleet-ab" > "$out/fleet-ab.txt"
# TCMalloc-AS: the fleet A/B of Delta (figures, not timings; RESULTS.md's section)
sh bench/sim/subrelease_ab.sh "$out"
"$sim" maxmem-timeline --out "$out/maxmem-paper" > "$out/maxmem-paper.txt"
"$sim" maxmem-timeline --node-mem 144M --out "$out/maxmem-bench" > "$out/maxmem-bench.txt"
python3 - "$out" <<'PY'
import json, sys, glob
out = sys.argv[1]
walls = [json.load(open(f))["rows"][0]["wall_s"] for f in sorted(glob.glob(out + "/scale-*.json"))]
print("scale wall_s:", ", ".join(f"{w:.2f}" for w in walls), f"(min {min(walls):.2f}, max {max(walls):.2f})")
fleet = [open(f).read().split() for f in sorted(glob.glob(out + "/fleet-memcolo-*.time"))]
print("fleet (1,000 nodes, a day) wall s:", ", ".join(t[0] for t in fleet),
      "| user CPU s:", ", ".join(t[1] for t in fleet))
PY
# The papers' headline experiments at their own sizes.
"$sim" m3-paper --out "$out/m3-paper" > "$out/m3-paper.txt"
"$sim" hermes-paper --out "$out/hermes-paper" > "$out/hermes-paper.txt"
/usr/bin/python3 bench/sim/report.py "$out"
mkdir -p bench/sim/plots
cp "$out"/plots/*.png bench/sim/plots/
echo "reports in $out"
