#!/usr/bin/python3
"""Report of a bench/tiering/run.py result directory: summary.csv, report.md, plots/.

    /usr/bin/python3 bench/tiering/report.py bench/tiering/results/overhead

Per configuration: runs, mean / median / standard deviation of the measured
throughput (million updates per second, MUPS), and for managed runs the mean a_miss
of the measure phase, slow faults and sample hits per second. The overhead of a
configuration is 1 − its mean / the unmanaged mean; the paired overhead is the
median over rounds of 1 − run / the unmanaged run of the same round (rounds share
the seed and sit next to each other in time).
"""

import csv
import json
import os
import statistics
import sys


def load(d):
    runs = []
    with open(os.path.join(d, "runs.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("rc") == 0 and "mups" in r:
                runs.append(r)
    return runs


def rnd(r):
    return r["run"].rsplit("-r", 1)[1]


def rate(r, key):
    m = r.get("manager")
    if not m:
        return float("nan")
    wall = r["warmup_s"] + r["measure_s"] + r["init_s"]
    return m.get(key, 0) / wall


def summarize(runs):
    configs = []
    for r in runs:
        if r["config"] not in configs:
            configs.append(r["config"])
    base = {rnd(r): r["mups"] for r in runs if r["config"] == "off"}
    base_mean = statistics.mean(base.values()) if base else None
    rows = []
    for c in configs:
        rs = [r for r in runs if r["config"] == c]
        m = [r["mups"] for r in rs]
        row = {
            "config": c,
            "runs": len(rs),
            "mups_mean": statistics.mean(m),
            "mups_median": statistics.median(m),
            "mups_sd": statistics.stdev(m) if len(m) > 1 else 0.0,
            "a_miss_mean": statistics.mean([r.get("a_miss_mean_measure", float("nan")) for r in rs]),
            "slow_faults_per_s": statistics.mean([rate(r, "slow_faults") for r in rs]),
            "sample_hits_per_s": statistics.mean([rate(r, "sample_hits") for r in rs]),
            "evictions_per_s": statistics.mean([rate(r, "evictions") for r in rs]),
            "fast_mib": rs[0].get("fast_mib", rs[0]["footprint_mib"]),
            "cg_peak_mib": statistics.mean([r["cg_max_usage_bytes"] for r in rs]) / 2**20,
        }
        if base_mean:
            row["overhead_mean"] = 1 - row["mups_mean"] / base_mean
            paired = [1 - r["mups"] / base[rnd(r)] for r in rs if rnd(r) in base]
            row["overhead_paired_median"] = statistics.median(paired) if paired else float("nan")
            row["overhead_paired_all"] = paired
        rows.append(row)
    return rows


def plots(d, runs, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots (use Debian's /usr/bin/python3)")
        return []
    pdir = os.path.join(d, "plots")
    os.makedirs(pdir, exist_ok=True)
    made = []
    # Throughput per configuration, every run as a point.
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, row in enumerate(rows):
        ys = [r["mups"] for r in runs if r["config"] == row["config"]]
        ax.bar(i, row["mups_mean"], color="lightsteelblue", edgecolor="k")
        ax.plot([i] * len(ys), ys, "k.", ms=6)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["config"] for r in rows])
    ax.set_ylabel("GUPS throughput, MUPS (measure phase)")
    ax.set_title("GUPS, 1 GiB, 60/30/10 % over 1:2:4 sets")
    fig.tight_layout()
    p = os.path.join(pdir, "throughput.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    made.append(p)
    # Per-second timelines of the first run of each configuration.
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for row in rows:
        r = next(x for x in runs if x["config"] == row["config"])
        tl = os.path.join(d, "timelines", r["run"] + ".csv")
        if not os.path.exists(tl):
            continue
        with open(tl) as f:
            t = list(csv.DictReader(f))
        xs = [float(x["t_s"]) for x in t]
        axes[0].plot(xs, [float(x["mups"]) for x in t], label=row["config"])
        if r["manage"] != "off":
            axes[1].plot(xs, [float(x["a_miss"]) for x in t], label=row["config"])
    axes[0].set_ylabel("MUPS per second")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[1].set_ylabel("a_miss (EWMA)")
    axes[1].set_xlabel("s since start")
    fig.tight_layout()
    p = os.path.join(pdir, "timeline.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    made.append(p)
    return made


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    d = sys.argv[1]
    runs = load(d)
    if not runs:
        raise SystemExit("no successful runs in %s" % d)
    rows = summarize(runs)
    keys = ["config", "runs", "fast_mib", "mups_mean", "mups_median", "mups_sd", "overhead_mean",
            "overhead_paired_median", "a_miss_mean", "slow_faults_per_s", "sample_hits_per_s",
            "evictions_per_s", "cg_peak_mib"]
    with open(os.path.join(d, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    made = plots(d, runs, rows)

    def fmt(v, spec):
        return "—" if v is None or v != v else format(v, spec)

    lines = ["# GUPS under memcolo's tier manager: %s" % os.path.basename(os.path.abspath(d)), "",
             "From `runs.jsonl` (%d runs). Throughput of the measure phase in million updates per "
             "second (MUPS); overhead against the unmanaged (`off`) mean, and the median of the "
             "per-round ratios (paired)." % len(runs), "",
             "| config | runs | fast MiB | MUPS mean | median | sd | overhead (mean) | overhead (paired median) "
             "| a_miss | slow faults/s | sample hits/s | evictions/s | cgroup peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["config"], r["runs"], r["fast_mib"], fmt(r["mups_mean"], ".2f"), fmt(r["mups_median"], ".2f"),
            fmt(r["mups_sd"], ".2f"),
            fmt(r.get("overhead_mean"), ".1%"), fmt(r.get("overhead_paired_median"), ".1%"),
            fmt(r["a_miss_mean"], ".3f"), fmt(r["slow_faults_per_s"], ".0f"),
            fmt(r["sample_hits_per_s"], ".0f"), fmt(r["evictions_per_s"], ".0f"), fmt(r["cg_peak_mib"], ".0f")))
    lines.append("")
    for r in rows:
        if r.get("overhead_paired_all"):
            lines.append("- `%s` per-round overheads: %s" % (
                r["config"], ", ".join("%.1f %%" % (100 * x) for x in r["overhead_paired_all"])))
    lines.append("")
    for p in made:
        lines.append("![%s](plots/%s)" % (os.path.basename(p), os.path.basename(p)))
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
