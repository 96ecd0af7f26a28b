#!/usr/bin/env python3
"""Plots of `memcolo bench colocation` results.

Usage: plot.py RESULTS_DIR

Reads RESULTS_DIR/runs.csv (one row per (level, mode) run) and
RESULTS_DIR/percentiles.csv (HDR percentile distribution per run) and writes:
  summary.png      p90 / p99 / p99.9 latency (µs, log scale) with the SLO, SLO
                   violation ratio, BE file throughput and node memory utilisation,
                   each against memory pressure level (BE demand / node memory,
                   Hermes §5.1), one line per mode (kernel alone, agent);
  latency_cdf.png  latency CDF tails (1 - percentile, log-log) at 0 %, 100 % and the
                   highest level, per mode.
Prints the names of the PNG files written, one per line. Needs matplotlib.
"""

import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = {"kernel": ("kernel alone", "tab:red", "o"), "agent": ("memcolo agent", "tab:blue", "s")}


def read_runs(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    return [r for r in rows if r["status"] == "ok"]


def fnum(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def series(runs, mode, column):
    pts = sorted(
        (int(r["level_pct"]), fnum(r[column]))
        for r in runs
        if r["mode"] == mode and fnum(r[column]) is not None
    )
    return [p[0] for p in pts], [p[1] for p in pts]


def summary(runs, out):
    panels = [
        ("p90_us", "p90 latency (µs)", True),
        ("p99_us", "p99 latency (µs)", True),
        ("p999_us", "p99.9 latency (µs)", True),
        ("slo_violation_ratio", "SLO violation (% of requests)", False),
        ("be_file_mib_per_min", "BE file streamer (MiB/min)", False),
        ("node_util", "node memory utilisation (%)", False),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    slo = next((fnum(r["slo_us"]) for r in runs if fnum(r["slo_us"])), None)
    for ax, (col, title, log) in zip(axes.flat, panels):
        for mode, (label, color, marker) in MODES.items():
            x, y = series(runs, mode, col)
            if col in ("slo_violation_ratio", "node_util"):
                y = [v * 100 for v in y]
            if x:
                ax.plot(x, y, marker=marker, color=color, label=label)
        if col == "p90_us" and slo:
            ax.axhline(slo, color="gray", linestyle="--", label=f"SLO {slo:.0f} µs")
        if log:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("memory pressure (% of node memory)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Redis (LC) beside batch jobs (BE): kernel alone vs memcolo agent")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "summary.png"), dpi=110)
    plt.close(fig)
    return "summary.png"


def cdf(out, runs):
    path = os.path.join(out, "percentiles.csv")
    if not os.path.exists(path):
        return None
    dist = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            key = (int(r["level_pct"]), r["mode"])
            dist.setdefault(key, []).append((float(r["latency_us"]), float(r["percentile"])))
    if not dist:
        return None
    levels = sorted({k[0] for k in dist})
    wanted = [l for l in (0, 100, levels[-1]) if l in levels]
    wanted = sorted(set(wanted))
    styles = ["-", "--", ":"]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, level in enumerate(wanted):
        for mode, (label, color, _) in MODES.items():
            pts = dist.get((level, mode))
            if not pts:
                continue
            xs = [p[0] for p in pts if p[1] < 100.0]
            ys = [1.0 - p[1] / 100.0 for p in pts if p[1] < 100.0]
            ax.plot(xs, ys, styles[i % len(styles)], color=color, label=f"{level}% {label}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("query latency from intended send time (µs)")
    ax.set_ylabel("fraction of requests slower (1 - CDF)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Latency tail of Redis")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "latency_cdf.png"), dpi=110)
    plt.close(fig)
    return "latency_cdf.png"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: plot.py RESULTS_DIR")
    out = sys.argv[1]
    runs = read_runs(os.path.join(out, "runs.csv"))
    if not runs:
        sys.exit("no successful runs in runs.csv")
    for name in (summary(runs, out), cdf(out, runs)):
        if name:
            print(name)


if __name__ == "__main__":
    main()
