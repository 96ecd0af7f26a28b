#!/usr/bin/python3
"""Report of a bench/tiering/run.py result directory: summary.csv, report.md, plots/.

    /usr/bin/python3 bench/tiering/report.py bench/out/tiering/overhead

Per configuration: runs, mean / median / standard deviation of the measured
throughput (million updates per second, MUPS), and for managed runs the mean a_miss
of the measure phase, slow faults and sample hits per second. The overhead of a
configuration is 1 − its mean / the unmanaged mean; the paired overhead is the
median over rounds of 1 − run / the unmanaged run of the same round (rounds share
the seed and sit next to each other in time).

A hand-written ``notes.md`` in the directory (what the numbers say) is appended. The
report becomes the section named after the directory in ``bench/tiering/RESULTS.md``
(``benchlib.publish``; only for a directory under bench/out).

Runs that carry gups' probe (the measure phase's counters) get a second table: the
same throughput over the time the updater did not wait for a CPU held by another
task (``mups_excl_run_delay``: other engineers' work on the shared machine taken
out, management's own costs kept), its overheads, where the updater's time went
(waiting for a CPU; blocked: asleep in faults the manager serves), its voluntary
context switches, the TLB shootdowns of the whole machine, and the table's page
size and transparent huge pages (smaps).
"""

import csv
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchlib  # noqa: E402


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


def probe(r, key):
    p = r.get("probe")
    return p.get(key, float("nan")) if p else float("nan")


def mean(xs):
    xs = [x for x in xs if x == x]
    return statistics.mean(xs) if xs else float("nan")


def summarize(runs):
    configs = []
    for r in runs:
        if r["config"] not in configs:
            configs.append(r["config"])
    base = {rnd(r): r["mups"] for r in runs if r["config"] == "off"}
    base_mean = statistics.mean(base.values()) if base else None
    base_x = {rnd(r): r["mups_excl_run_delay"] for r in runs
              if r["config"] == "off" and "mups_excl_run_delay" in r}
    base_x_mean = statistics.mean(base_x.values()) if base_x else None
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
            "run_delay_share": mean([probe(r, "updater_run_delay_share") for r in rs]),
            "blocked_share": mean([probe(r, "updater_other_share") for r in rs]),
            "vol_cs_per_s": mean([probe(r, "updater_vol_cs_per_s") for r in rs]),
            "tlb_per_s": mean([probe(r, "tlb_shootdowns_per_s") for r in rs]),
            "page_kib": sorted({r.get("table_smaps", {}).get("kernel_page_kib") for r in rs} - {None}),
            "anon_huge_kib": mean([r.get("table_smaps", {}).get("anon_huge_kib", float("nan")) for r in rs]),
        }
        xs = [r["mups_excl_run_delay"] for r in rs if "mups_excl_run_delay" in r]
        if xs:
            row["mups_x_mean"] = statistics.mean(xs)
            row["mups_x_sd"] = statistics.stdev(xs) if len(xs) > 1 else 0.0
            if base_x_mean:
                row["overhead_x_mean"] = 1 - row["mups_x_mean"] / base_x_mean
                paired = [1 - r["mups_excl_run_delay"] / base_x[rnd(r)] for r in rs
                          if rnd(r) in base_x and "mups_excl_run_delay" in r]
                row["overhead_x_paired_median"] = statistics.median(paired) if paired else float("nan")
                row["overhead_x_paired_all"] = paired
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
            "evictions_per_s", "cg_peak_mib", "mups_x_mean", "mups_x_sd", "overhead_x_mean",
            "overhead_x_paired_median", "run_delay_share", "blocked_share", "vol_cs_per_s",
            "tlb_per_s", "page_kib", "anon_huge_kib"]
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
    if any("mups_x_mean" in r for r in rows):
        lines += ["", "Without the wait for a CPU held by other work (see the module docstring); "
                  "the updater's time shares are of the measure phase's wall time.", "",
                  "| config | page KiB | THP KiB | MUPS excl. run delay | sd | overhead (mean) "
                  "| overhead (paired median) | waiting for a CPU | blocked | voluntary cs/s "
                  "| TLB shootdowns/s (machine) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "mups_x_mean" not in r:
                continue
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["config"], "/".join(str(x) for x in r["page_kib"]) or "—", fmt(r["anon_huge_kib"], ".0f"),
                fmt(r["mups_x_mean"], ".2f"), fmt(r["mups_x_sd"], ".2f"),
                fmt(r.get("overhead_x_mean"), ".1%"), fmt(r.get("overhead_x_paired_median"), ".1%"),
                fmt(r["run_delay_share"], ".1%"), fmt(r["blocked_share"], ".2%"),
                fmt(r["vol_cs_per_s"], ".0f"), fmt(r["tlb_per_s"], ".0f")))
    lines.append("")
    for r in rows:
        if r.get("overhead_x_paired_all"):
            lines.append("- `%s` per-round overheads excl. run delay: %s" % (
                r["config"], ", ".join("%.1f %%" % (100 * x) for x in r["overhead_x_paired_all"])))
    for r in rows:
        if r.get("overhead_paired_all"):
            lines.append("- `%s` per-round overheads: %s" % (
                r["config"], ", ".join("%.1f %%" % (100 * x) for x in r["overhead_paired_all"])))
    for r in rows:
        pa = r.get("overhead_paired_all")
        if pa and len(pa) >= 2:
            se = statistics.stdev(pa) / len(pa) ** 0.5
            lines.append("- `%s` paired overhead over %d rounds: mean %.1f %% ± %.1f %% (standard error), "
                         "median %.1f %%, quartiles %.1f..%.1f %%" % (
                             r["config"], len(pa), 100 * statistics.mean(pa), 100 * se,
                             100 * statistics.median(pa), 100 * statistics.quantiles(pa, n=4)[0],
                             100 * statistics.quantiles(pa, n=4)[2]))
    hosted = [x for x in runs if x.get("host")]
    if hosted:
        lines += ["", "Every run with the machine over it (run.py's `host`: busy share of both vCPUs, kdamond's "
                  "CPU time, MiB reported free to the host) and its per-second MUPS spread:", ""]
        for x in sorted(hosted, key=lambda x: (int(rnd(x)), x["config"])):
            ps = x.get("per_second_mups") or [x["mups"]]
            h = x["host"]
            lines.append("- `%s`: %.2f MUPS (per second %.1f..%.1f, median %.1f), busy %.0f %%, kdamond %.2f s, "
                         "reported %.0f MiB, load %s" % (
                             x["run"], x["mups"], min(ps), max(ps), statistics.median(ps), 100 * h["busy_share"],
                             h["kdamond_cpu_s"], h["reported_mib"], " ".join(x.get("loadavg", []))))
    lines.append("")
    for p in made:
        lines.append("![%s](plots/%s)" % (os.path.basename(p), os.path.basename(p)))
    notes = os.path.join(d, "notes.md")
    if os.path.exists(notes):
        with open(notes) as f:
            lines += ["", f.read().rstrip("\n")]
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    benchlib.publish(os.path.dirname(os.path.abspath(__file__)), os.path.basename(os.path.normpath(d)), d,
                     command="/usr/bin/python3 bench/tiering/report.py " + os.path.relpath(d, benchlib.REPO),
                     figures=["plots/throughput.png"] if os.path.basename(os.path.normpath(d)) == "overhead" else (),
                     notes=None)


if __name__ == "__main__":
    main()
