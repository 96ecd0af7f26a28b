"""Writes RESULTS.md (to stdout) from the raw lines of one measure.py run.

Usage: python3 bench/v2qos/report.py bench/out/v2qos/<stamp>.jsonl
Each cell is the median over the rounds and [min–max] (the spread).
"""

import json
import os
import platform
import statistics
import subprocess
import sys

VARIANTS = ("m3", "high", "low", "min", "high+low")
NAMES = {
    "m3": "M3 alone (today)",
    "high": "+ BE `memory.high` in red",
    "low": "+ LC `memory.low`",
    "min": "+ LC `memory.min`",
    "high+low": "+ both",
}


def spread(values, fmt):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "–"
    return f"{fmt(statistics.median(values))} [{fmt(values[0])}–{fmt(values[-1])}]"


def num(v):
    return f"{v:.0f}"


def ms(v):
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def main():
    path = sys.argv[1]
    rows = [json.loads(line) for line in open(path)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "--", "bench/v2qos",
                              ":!bench/v2qos/RESULTS.md", "scripts/v2bed"],
                             capture_output=True, text=True).stdout.strip()
    if changed:
        commit += " with uncommitted changes to bench/v2qos or scripts/v2bed"
    stamp = os.path.basename(path).split(".")[0]
    rounds = max(r["round"] for r in rows) + 1
    round_s = rows[0]["round_s"]
    print("# BE growth in the red zone and LC protection on cgroup v2: `memory.high`, "
          "`memory.low`, `memory.min` against M3 alone\n")
    print(f"Run {stamp} (UTC), commit {commit}, in the guest of scripts/v2bed (Debian's "
          f"cloud kernel 6.1 under qemu TCG, 2 vCPUs, 2 GiB) on a {os.cpu_count()}-core "
          f"{platform.machine()} host shared with other builds; {rounds} rounds of "
          f"{round_s} s per variant, the order rotated each round. Regenerate with "
          "`bench/v2qos/run.sh` (README.md). Each cell: median [min–max]. Times are under "
          "software emulation: compare the variants, not the absolute numbers.\n")
    print("| variant | LC longest 1 MiB alloc ms | LC alloc p99 ms | LC longest request ms | "
          "LC request p99 ms | LC major faults | LC refaults | LC requests served | "
          "BE MiB allocated | BE killed (M3) | BE OOM kills | BE events high | "
          "LC events low | scope events max | s above top |")
    print("|---|" + "---|" * 14)
    for v in VARIANTS:
        rs = [r for r in rows if r["variant"] == v]
        if not rs:
            continue
        print(f"| {NAMES[v]} | "
              f"{spread([r['alloc_ms_max'] for r in rs], ms)} | "
              f"{spread([r['alloc_ms_p99'] for r in rs], ms)} | "
              f"{spread([r['req_ms_max'] for r in rs], ms)} | "
              f"{spread([r['req_ms_p99'] for r in rs], ms)} | "
              f"{spread([r['lc_majflt'] for r in rs], num)} | "
              f"{spread([r['lc_refault'] for r in rs], num)} | "
              f"{spread([r['lc_served'] for r in rs], num)} | "
              f"{spread([r['be_mib'] for r in rs], num)} | "
              f"{sum(1 for r in rs if r['be_killed'])} of {len(rs)} | "
              f"{sum(r['be_oom_kill'] for r in rs)} | "
              f"{spread([r['be_high'] for r in rs], num)} | "
              f"{spread([r['lc_low'] for r in rs], num)} | "
              f"{spread([r['scope_max'] for r in rs], num)} | "
              f"{spread([r['above_top_s'] for r in rs], num)} |")
    print("\nSet-up (measure.py): a scope group with `memory.max` 512 MiB and 1 GiB of zram "
          "swap; in its `lc` child a process holding a 128 MiB working set that every 10 ms "
          "allocates 1 MiB (an allocation) and touches 64 random pages of its working set "
          "(a request); in its `be` child a hog allocating 1 MiB every 2 ms. A controller "
          "polling once a second applies M3's default thresholds for 512 MiB (top 496 MiB, "
          "high 440 MiB, low 400 MiB) to the scope's working set and kills the hog after "
          "10 s above top; `memory.high` variants set the BE group's `memory.high` to its "
          "usage on entering red and back to `max` at low; `memory.low`/`memory.min` "
          "variants protect 144 MiB of the LC group. LC major faults: `ru_majflt` of the "
          "LC process; LC refaults: the LC group's `workingset_refault_anon`.")


if __name__ == "__main__":
    main()
