#!/usr/bin/python3
"""Match an LC service's slow seconds with the wake-latency probes of probe_run.sh.

Input: a probe_run.sh output directory — `bench.log` (each run's measured phase start on
CLOCK_MONOTONIC), `bench/latency-<level>-<mode>.csv` (per-second p99 / max by due
time), `bench/runs.csv` — or a `side_by_side.py --probe` chunk (`driver.log`, the
bench's files beside it); in both, `probe-cpu0.csv` / `probe-cpu1.csv` (SCHED_FIFO 1 ms sleeps:
`mono_s` at the wake-up, `overshoot_us`), `host-mm.csv` (250 ms samples of steal per
CPU, free page reporting, kdamond CPU).

Per run it prints and writes to `OUT/probe-attr.md`: the LC p99, the measured seconds,
the seconds with an LC p99 over `--slow-ms` (default 10), how many of them also had a
FIFO wake-up on CPU 0 (the LC CPU) late by more than `--late-ms` (default 10) — the
vCPU not run: no guest task can hold a FIFO thread up — and the FIFO late wake-ups of
the run; then each slow second with the probes' worst overshoot on both CPUs, steal
ms per CPU, reporting passes and MiB and kdamond ms in it. A probe overshoot counts
in a second when its late interval (wake-up − overshoot, wake-up) overlaps it.

    bench/reclaim/probe_attr.py OUTDIR [--slow-ms 10] [--late-ms 10]
"""
import argparse
import bisect
import csv
import os
import re


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def late_intervals(path):
    """[(from_s, to_s, overshoot_ms)] of the probe's late wake-ups, sorted."""
    out = []
    for r in read_csv(path):
        t, us = float(r["mono_s"]), int(r["overshoot_us"])
        out.append((t - us / 1e6, t, us / 1000.0))
    return sorted(out)


def worst_in(intervals, a, b):
    """The largest overshoot (ms) of the intervals overlapping [a, b)."""
    w = 0.0
    for lo, hi, ms in intervals:
        if lo < b and hi > a:
            w = max(w, ms)
    return w


def mm_delta(rows, a, b, col):
    """Increase of cumulative column `col` of host-mm.csv over [a, b] (nearest samples
    outside the window)."""
    if not rows:
        return 0.0
    ts = [r[0] for r in rows]
    i = max(0, bisect.bisect_right(ts, a) - 1)
    j = min(len(rows) - 1, bisect.bisect_left(ts, b))
    return rows[j][col] - rows[i][col]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--slow-ms", type=float, default=10)
    ap.add_argument("--late-ms", type=float, default=10)
    a = ap.parse_args()
    d = a.dir
    # probe_run.sh writes bench.log and bench/; a side_by_side.py --probe chunk
    # driver.log and the bench's files in the chunk directory itself.
    log_path, bench = os.path.join(d, "bench.log"), os.path.join(d, "bench")
    if not os.path.exists(log_path):
        log_path, bench = os.path.join(d, "driver.log"), d
    starts = []
    with open(log_path) as f:
        for line in f:
            m = re.search(r"\] (\d+)% (\S+): measured (\d+) s from CLOCK_MONOTONIC ([0-9.]+)", line)
            if m:
                starts.append((int(m.group(1)), m.group(2), int(m.group(3)), float(m.group(4))))
    p0 = late_intervals(os.path.join(d, "probe-cpu0.csv"))
    p1 = late_intervals(os.path.join(d, "probe-cpu1.csv"))
    mm_rows, head = [], []
    mm_path = os.path.join(d, "host-mm.csv")
    if os.path.exists(mm_path):
        with open(mm_path) as f:
            r = csv.reader(f)
            head = next(r)
            mm_rows = [[float(x) for x in line] for line in r]
    col = {k: head.index(k) for k in head}
    runs = {(r["level_pct"], r["mode"]): r for r in read_csv(os.path.join(bench, "runs.csv"))}
    out = [f"# Slow LC seconds against SCHED_FIFO wake-ups ({d})", "",
           f"Slow second: LC p99 > {a.slow_ms:g} ms. Late: a FIFO 1 ms sleep woke more than "
           f"{a.late_ms:g} ms late (the vCPU not run). Computed by `bench/reclaim/probe_attr.py`.",
           "",
           "| run | LC p99 µs | busy % | slow s / measured | slow s with CPU0 late | "
           f"CPU0 late (> {a.late_ms:g} ms) in run, max ms | CPU1 late in run, max ms | "
           "steal CPU0 / CPU1 ms | reported MiB (passes) |",
           "|---|---:|---:|---|---:|---|---|---|---|"]
    detail = ["", "| run | second | LC p99 / max ms | CPU0 worst late ms | CPU1 worst late ms | "
              "steal CPU0 / CPU1 ms | passes | reported MiB | kdamond ms |",
              "|---|---:|---|---:|---:|---|---:|---:|---:|"]
    for level, mode, dur, t0 in starts:
        name = f"{level}-{mode}"
        lat = read_csv(os.path.join(bench, f"latency-{name}.csv"))
        run = runs.get((str(level), mode), {})
        slow = slow_late = 0
        for row in lat:
            s = int(row["second"])
            p99 = int(row["p99_us"]) / 1000.0
            if p99 <= a.slow_ms:
                continue
            slow += 1
            lo, hi = t0 + s, t0 + s + 1
            w0, w1 = worst_in(p0, lo, hi), worst_in(p1, lo, hi)
            slow_late += w0 > a.late_ms
            dm = (lambda c: mm_delta(mm_rows, lo, hi, col[c]) if c in col else 0)
            detail.append(
                f"| {name} | {s} | {p99:.1f} / {int(row['max_us']) / 1000:.1f} | {w0:.1f} | "
                f"{w1:.1f} | {dm('steal_ms_cpu0'):.0f} / {dm('steal_ms_cpu1'):.0f} | "
                f"{dm('passes'):.0f} | {dm('reported_kib') / 1024:.0f} | {dm('kdamond_cpu_ms'):.0f} |")
        lo, hi = t0, t0 + dur
        late0 = [ms for l, h, ms in p0 if l < hi and h > lo and ms > a.late_ms]
        late1 = [ms for l, h, ms in p1 if l < hi and h > lo and ms > a.late_ms]
        dm = (lambda c: mm_delta(mm_rows, lo, hi, col[c]) if c in col else 0)
        out.append(
            f"| {name} | {run.get('p99_us', '-')} | {float(run.get('cpu_busy_pct') or 0):.0f} | "
            f"{slow} / {len(lat)} | {slow_late} | {len(late0)}, {max(late0, default=0):.1f} | "
            f"{len(late1)}, {max(late1, default=0):.1f} | {dm('steal_ms_cpu0'):.0f} / "
            f"{dm('steal_ms_cpu1'):.0f} | {dm('reported_kib') / 1024:.0f} ({dm('passes'):.0f}) |")
    text = "\n".join(out + detail) + "\n"
    with open(os.path.join(d, "probe-attr.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
