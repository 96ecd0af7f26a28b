#!/usr/bin/python3
"""Timelines of `memcolo bench reclaim` runs.

Usage: plot.py RESULTS_DIR

Reads RESULTS_DIR/timeline-<level>-<mode>.csv (250 ms samples: node headroom in bytes,
reclaim workers, low/high marks) and RESULTS_DIR/latency-<level>-<mode>.csv (per-second
p99 in µs) and writes RESULTS_DIR/timeline-<level>.png: for each pressure level, the
headroom with the adaptive marks, the reclaim workers, and the per-second p99 latency
of every mode (Hermit, NSDI'23, Fig. "Hermit's adaptive reclaim scheduling").
"""
import csv
import glob
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = float(1 << 20)


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(v):
    return float(v) if v not in (None, "") else float("nan")


def main(out):
    runs = {}
    for p in glob.glob(os.path.join(out, "timeline-*.csv")):
        m = re.match(r"timeline-(\d+)-(\w+)\.csv$", os.path.basename(p))
        if m:
            runs.setdefault(int(m.group(1)), []).append(m.group(2))
    written = []
    for level, modes in sorted(runs.items()):
        fig, ax = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
        for mode in sorted(modes):
            t = read(os.path.join(out, f"timeline-{level}-{mode}.csv"))
            xs = [num(r["t_s"]) for r in t]
            ax[0].plot(xs, [num(r["headroom_bytes"]) / MIB for r in t], label=f"{mode} headroom")
            if mode == "reclaim":
                ax[0].plot(xs, [num(r["low_mark_bytes"]) / MIB for r in t], "--", label="reclaim low mark")
                ax[0].plot(xs, [num(r["high_mark_bytes"]) / MIB for r in t], ":", label="reclaim high mark")
            if mode in ("reclaim", "fixed"):
                ax[1].step(xs, [num(r["workers_active"]) for r in t], where="post", label=f"{mode} active workers")
            lat = os.path.join(out, f"latency-{level}-{mode}.csv")
            if os.path.exists(lat):
                rows = read(lat)
                ax[2].plot([num(r["second"]) + 0.5 for r in rows], [num(r["p99_us"]) for r in rows], marker="o", label=mode)
        ax[0].set_ylabel("MiB")
        ax[0].set_title(f"{level} % pressure: free headroom of the node")
        ax[1].set_ylabel("workers")
        ax[2].set_ylabel("p99 latency per second (µs)")
        ax[2].set_yscale("log")
        ax[2].set_xlabel("seconds into the measured phase")
        for a in ax:
            a.legend(fontsize=7, loc="upper right")
            a.grid(alpha=0.3)
        fig.tight_layout()
        path = os.path.join(out, f"timeline-{level}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    print("\n".join(written))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
