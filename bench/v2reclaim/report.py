"""Writes RESULTS.md (to stdout) from the raw lines of one measure.py run.

Usage: python3 bench/v2reclaim/report.py bench/out/v2reclaim/<stamp>.jsonl
Each cell is the median over the rounds and [min–max] (the spread).
"""

import json
import os
import platform
import statistics
import subprocess
import sys

MIB = 1 << 20


def spread(values, fmt):
    values = sorted(values)
    return f"{fmt(statistics.median(values))} [{fmt(values[0])}–{fmt(values[-1])}]"


def main():
    path = sys.argv[1]
    rows = [json.loads(line) for line in open(path)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "bench/v2reclaim", "scripts/v2bed"],
                             capture_output=True, text=True).stdout.strip()
    if changed:
        commit += " with uncommitted changes to bench/v2reclaim or scripts/v2bed"
    stamp = os.path.basename(path).split(".")[0]
    rounds = max(r["round"] for r in rows) + 1
    print("# Group-level reclaim on cgroup v2: `memory.reclaim` against stepping `memory.max`\n")
    print(f"Run {stamp} (UTC), commit {commit}, in the guest of scripts/v2bed (Debian's "
          f"cloud kernel 6.1 under qemu TCG, 2 vCPUs, 2 GiB) on a {os.cpu_count()}-core "
          f"{platform.machine()} host shared with other builds; {rounds} rounds per cell, "
          "mechanisms alternating first. Regenerate with `bench/v2reclaim/run.sh` "
          "(README.md). Each cell: median [min–max]. Times are under software "
          "emulation: compare the two mechanisms, not the absolute numbers.\n")
    print("| case | mechanism | request s | reclaimed MiB (pgsteal) | net MiB | "
          "memory.events max | OOM kills | errors | holder's longest 1 MiB allocation ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in ("swap", "grow", "noswap"):
        for mech in ("reclaim", "step"):
            rs = [r for r in rows if r["case"] == case and r["mechanism"] == mech]
            if not rs:
                continue
            errors = sorted({r["error"] for r in rs if r["error"]})
            stall = [r["stall_ms"] for r in rs if r["stall_ms"] is not None]
            print(f"| {case} | {'memory.reclaim' if mech == 'reclaim' else 'step memory.max'} | "
                  f"{spread([r['seconds'] for r in rs], lambda v: f'{v:.2f}')} | "
                  f"{spread([r['reclaimed'] / MIB for r in rs], lambda v: f'{v:.0f}')} | "
                  f"{spread([r['net'] / MIB for r in rs], lambda v: f'{v:.0f}')} | "
                  f"{spread([r['max'] for r in rs], lambda v: f'{v:.0f}')} | "
                  f"{sum(r['oom_kill'] for r in rs)} of {len(rs)} | "
                  f"{len([r for r in rs if r['error']])} {'(' + ', '.join(errors) + ')' if errors else ''} | "
                  f"{spread(stall, lambda v: f'{v:.0f}') if stall else '–'} |")
    print("\nCases (measure.py): `swap` a 192 MiB anonymous holder with zram swap on, "
          "64 MiB asked; `grow` the same while the holder keeps allocating 1 MiB every "
          "2 ms (and freeing its oldest); `noswap` the holder without swap, so nothing "
          "can be reclaimed.")


if __name__ == "__main__":
    main()
