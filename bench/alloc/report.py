#!/usr/bin/python3
"""Writes report.md and PNG plots for a results directory of run_bench.py: first a table
that checks every target of the issue (libmemcolo's numbers against the thresholds and
the best peer), then the raw tables and plots. A hand-written analysis.md in the
directory (the measured cause of each miss) is included after the targets.
usage: report.py RESULTS_DIR"""
import csv
import glob
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def plot_cdfs(d, rows):
    keys = sorted({(r["condition"], r["block_bytes"], r["mode"]) for r in rows})
    out = []
    for cond, size, mode in keys:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for r in rows:
            if (r["condition"], r["block_bytes"], r["mode"]) != (cond, size, mode):
                continue
            rep = f"-r{r['rep_median']}" if r.get("rep_median") not in (None, "") else ""
            pts = read(os.path.join(d, "cdf", f"{cond}-{size}-{mode}-{r['allocator']}{rep}.csv"))
            if not pts:
                continue
            pts.sort(key=lambda p: float(p["quantile"]))
            ax.plot([max(float(p["latency_us"]), 0.01) for p in pts], [float(p["quantile"]) for p in pts],
                    label=r["allocator"], lw=1.4)
        ax.set_xscale("log")
        ax.set_xlabel("latency of malloc + first write to each 4 KiB page (us)")
        ax.set_ylabel("CDF")
        ax.set_title(f"{int(size) // 1024} KiB blocks, {mode}, {cond} (repetition with the median p99)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        name = f"cdf-{cond}-{size}-{mode}.png"
        fig.tight_layout()
        fig.savefig(os.path.join(d, name), dpi=110)
        plt.close(fig)
        out.append(name)
    return out


def plot_tput(d, rows):
    if not rows:
        return None
    benches = sorted({r["benchmark"] for r in rows})
    allocs = []
    for r in rows:
        if r["allocator"] not in allocs:
            allocs.append(r["allocator"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.8 / len(allocs)
    for k, a in enumerate(allocs):
        xs, ws, rs = [], [], []
        for i, b in enumerate(benches):
            for r in rows:
                if r["benchmark"] == b and r["allocator"] == a:
                    xs.append(i + k * w)
                    ws.append(float(r["wall_ms_median"]))
                    rs.append(float(r["peak_rss_kib_median"]) / 1024)
        axes[0].bar(xs, ws, w, label=a)
        axes[1].bar(xs, rs, w, label=a)
    for ax, t in zip(axes, ("wall time (ms, lower is better)", "peak RSS (MiB)")):
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(benches))])
        ax.set_xticklabels(benches)
        ax.set_title(t)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "tput.png"), dpi=110)
    plt.close(fig)
    return "tput.png"


def plot_subrelease(d):
    files = sorted(glob.glob(os.path.join(d, "subrelease-delta*.csv")))
    if not files:
        return None
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for path in files:
        label = "Delta = " + os.path.basename(path)[len("subrelease-delta"):-4] + " s"
        rows = read(path)
        t = [float(r["t_s"]) for r in rows]
        axes[0].plot(t, [float(r["coverage"]) * 100 for r in rows], label=label + " (memcolo)")
        axes[0].plot(t, [100 * int(r["anon_huge_kib"]) / max(1, int(r["rss_kib"])) for r in rows], ls=":",
                     label=label + " (kernel AnonHugePages/Rss)")
        axes[1].plot(t, [int(r["used_bytes"]) / 2**20 for r in rows], label=label + " used")
        axes[1].plot(t, [int(r["mapped_bytes"]) / 2**20 for r in rows], ls="--", label=label + " mapped")
        axes[2].plot(t, [int(r["free_backed_bytes"]) / 2**20 for r in rows], label=label + " average")
        axes[2].plot(t, [int(r["realized_frag_bytes"]) / 2**20 for r in rows], ls="--", label=label + " realized")
    axes[0].set_ylabel("huge page coverage %")
    axes[1].set_ylabel("MiB")
    axes[2].set_ylabel("fragmentation MiB")
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "subrelease.png"), dpi=110)
    plt.close(fig)
    return "subrelease.png"


PEERS = ("glibc", "jemalloc", "tcmalloc", "mimalloc")
PCOLS = ("mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "min_us", "iqm_us", "timer_p50_us",
         "timer_iqm_us")


def aggregate(rows):
    """One row per (condition, block, mode, allocator): each percentile the median over
    the repetitions (rows of run_bench.py's --reps), with "reps", the p99 spread
    ("p99_lo", "p99_hi"), the repetitions' p99s in run order ("p99_all"), the busy
    share range and "rep_median" (the repetition whose p99 is the median, for the CDF)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["condition"], r["block_bytes"], r["mode"], r["allocator"]), []).append(r)
    out = []
    for key, rs in groups.items():
        rs.sort(key=lambda r: int(r.get("rep") or 0))
        a = dict(rs[0])
        for c in PCOLS:
            vals = [float(r[c]) for r in rs if r.get(c)]  # older rows lack the newer columns
            a[c] = str(statistics.median(vals)) if vals else ""
        p99s = [float(r["p99_us"]) for r in rs]
        a["reps"] = len(rs)
        a["p99_lo"], a["p99_hi"] = min(p99s), max(p99s)
        a["p99_all"] = " / ".join(fmt(x) for x in p99s)
        busy = [float(r["busy"]) for r in rs if r.get("busy")]
        a["busy_range"] = f"{min(busy):.2f}-{max(busy):.2f}" if busy else ""
        by_p99 = sorted(rs, key=lambda r: float(r["p99_us"]))
        a["rep_median"] = by_p99[(len(by_p99) - 1) // 2].get("rep") or ""
        out.append(a)
    return out


def targets(h, t, s):
    """rows (target, measured, verdict, margin) for every target that has data; the paced
    targets are checked on the sleeping pacer ("paced"), the spinning one shown beside"""
    out = []

    def spread(r, col):
        if int(r.get("reps", 1)) < 2 or col != "p99_us":
            return ""
        return f" [{fmt(r['p99_lo'])}-{fmt(r['p99_hi'])}]"

    def hrow(cond, size, mode, alloc):
        for r in h:
            if (r["condition"], int(r["block_bytes"]), r["mode"], r["allocator"]) == (cond, size, mode, alloc):
                return r
        return None

    def thresh(name, cond, size, mode, col, limit):
        r = hrow(cond, size, mode, "memcolo")
        if r is None:
            return
        v = float(r[col])
        ok = v <= limit
        spin = hrow(cond, size, "paced-spin", "memcolo")
        shown = f"{v:.2f} us" + spread(r, col) + (f" (paced-spin: {float(spin[col]):.2f} us)" if spin else "")
        out.append((name, shown, "met" if ok else "MISSED",
                    f"{limit - v:+.2f} us" if ok else f"{v - limit:.2f} us over ({v / limit:.1f}x)"))

    thresh("paced 256 KiB, dedicated: p50 <= 10 us", "dedicated", 262144, "paced", "p50_us", 10)
    thresh("paced 256 KiB, dedicated: p99 <= 25 us", "dedicated", 262144, "paced", "p99_us", 25)
    thresh("paced 256 KiB, anon pressure: p99 <= 100 us", "anon", 262144, "paced", "p99_us", 100)
    thresh("paced 1 KiB, anon pressure: p99.9 <= 10 us", "anon", 1024, "paced", "p999_us", 10)
    for cond in ("dedicated", "anon", "file"):
        for size in (262144, 1024):
            me = hrow(cond, size, "b2b", "memcolo")
            peers = [hrow(cond, size, "b2b", p) for p in PEERS]
            peers = [p for p in peers if p]
            if me is None or not peers:
                continue
            for col, label in (("p50_us", "p50"), ("p99_us", "p99")):
                # a p50 within a few clock steps (10 ns here) is judged on the interquartile
                # mean, which the dithered clock resolves (hermes_bench.c); the p50 beside it
                judge = col
                if col == "p50_us" and float(me[col]) < 1 and me.get("iqm_us") and all(p.get("iqm_us") for p in peers):
                    judge = "iqm_us"
                best = min(peers, key=lambda r: float(r[judge]))
                v, b = float(me[judge]), float(best[judge])
                ok = v <= b
                if judge == "iqm_us":
                    shown = (f"{v * 1000:.1f} ns interquartile mean, p50 {float(me[col]) * 1000:.0f} ns (best: "
                             f"{best['allocator']} {b * 1000:.1f} ns, p50 {float(best[col]) * 1000:.0f} ns; clock step "
                             f"10 ns, timer alone {float(me['timer_iqm_us']) * 1000:.1f} ns)")
                else:
                    shown = f"{fmt(v)} us{spread(me, col)} (best: {best['allocator']} {fmt(b)} us{spread(best, col)})"
                out.append((f"back to back {size // 1024} KiB, {cond}: {label} <= best peer", shown,
                            "met" if ok else "MISSED",
                            f"{v / b:.2f}x of best" if b > 0 else "-"))
    for bench in sorted({r["benchmark"] for r in t}):
        rows = {r["allocator"]: r for r in t if r["benchmark"] == bench}
        me = rows.get("memcolo-norsv")
        peers = [rows[p] for p in PEERS if p in rows]
        if me is None or not peers:
            continue
        best = min(peers, key=lambda r: float(r["wall_ms_median"]))
        v, b = float(me["wall_ms_median"]), float(best["wall_ms_median"])
        ok = v <= 1.10 * b
        out.append((f"throughput {bench}: wall <= 1.10 x best peer", f"{v:.1f} ms (best: {best['allocator']} {b:.1f} ms)",
                    "met" if ok else "MISSED", f"{(v / b - 1) * 100:+.0f} %"))
        g = rows.get("glibc")
        if g:
            v, b = float(me["peak_rss_kib_median"]), float(g["peak_rss_kib_median"])
            ok = v <= 1.10 * b
            out.append((f"peak RSS {bench}: <= 1.10 x glibc (no reservation)", f"{v:.0f} KiB (glibc {b:.0f} KiB)",
                        "met" if ok else "MISSED", f"{(v / b - 1) * 100:+.1f} %"))
    by = {r["delta_s"]: r for r in s}
    if "60" in by:
        # Judged on the kernel's view (AnonHugePages of the heap's mappings), what the TLB
        # sees; libmemcolo's own figure (used bytes on intact huge pages) is shown beside it.
        r60 = by["60"]
        v = float(r60.get("kernel_heap_huge_share_mean") or "nan")
        own = f"libmemcolo's count {float(r60['coverage_mean']) * 100:.1f} %"
        if v == v:
            ok = v >= 0.95
            out.append(("huge page coverage, Delta = 60 s: >= 95 %",
                        f"{v * 100:.1f} % of the heap's RSS in THPs (min {float(r60['kernel_heap_huge_share_min']) * 100:.1f} %; {own})",
                        "met" if ok else "MISSED", f"{(v - 0.95) * 100:+.1f} points"))
        else:
            out.append(("huge page coverage, Delta = 60 s: >= 95 %", f"no kernel heap figure in this run ({own})",
                        "not measured", "-"))
    if "60" in by and "0" in by:
        a60 = max(float(by["60"]["realized_fragmentation_mib_end"]), float(by["60"]["realized_fragmentation_mib_max"]))
        a0 = max(float(by["0"]["realized_fragmentation_mib_end"]), float(by["0"]["realized_fragmentation_mib_max"]))
        ok = a60 <= a0
        ts = by["60"].get("t_schedule_s", "?")
        cyc = "realized_in_cycles_t30_mib_max"
        beside = (f"; while demand fluctuates (T = 30 s windows inside the cycles) {float(by['60'][cyc]) * 1024:.0f}"
                  f" vs {float(by['0'][cyc]) * 1024:.0f} KiB" if by["60"].get(cyc) and by["0"].get(cyc) else "")
        out.append((f"realized fragmentation, Delta = 60 s: <= Delta = 0 (T_schedule {ts} s, max over the run)",
                    f"{a60 * 1024:.0f} KiB (Delta = 0: {a0 * 1024:.0f} KiB){beside}",
                    "met" if ok else "MISSED", f"{(a60 - a0) * 1024:+.0f} KiB"))
    return out


def fmt(x):
    """us: 3 decimals (1 ns) below 1 us, where 2 decimals turned 25 ns into 0.03"""
    v = float(x)
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def main():
    d = sys.argv[1]
    h = aggregate(read(os.path.join(d, "hermes.csv")))
    t = read(os.path.join(d, "tput.csv"))
    s = read(os.path.join(d, "subrelease-summary.csv"))
    lines = ["# libmemcolo benchmarks", ""]
    tg = targets(h, t, s)
    if tg:
        met = sum(1 for r in tg if r[2] == "met")
        lines += ["## Targets (issue 3, \"Done when\")", "",
                  f"{met} of {len(tg)} met. libmemcolo = `memcolo` (class lc, Hermes reservation) for latency, "
                  "`memcolo-norsv` (class be) for throughput and peak RSS; peers: glibc, jemalloc, tcmalloc, mimalloc.", "",
                  "| target | libmemcolo | verdict | margin |", "|---|---|---|---|"]
        for r in tg:
            lines.append("| " + " | ".join(r) + " |")
        lines.append("")
    analysis = os.path.join(d, "analysis.md")
    if os.path.exists(analysis):
        lines += [open(analysis).read().strip(), ""]
    if os.path.exists(os.path.join(d, "machine.txt")):
        lines += ["## Machine and parts", "", "```", open(os.path.join(d, "machine.txt")).read().strip(), "```", ""]
    if h:
        lines += ["## Hermes micro benchmark (malloc + first write to each 4 KiB page, until 1 GiB)", "",
                  "Modes: `b2b` back to back (as in the paper); `paced` one allocation every 250 us (256 KiB) or "
                  "1 us (1 KiB), the thread sleeping until each deadline (clock_nanosleep to absolute deadlines, "
                  "as a service waits for its next request; a deadline already past is served at once, so the rate "
                  "is kept) -- the issue's paced targets are checked on it; `paced-spin` the same deadlines, "
                  "busy-waiting between them (the benchmark thread holds its CPU throughout); `paced-1ms` the "
                  "sleeping pacer at a second pace, 256 KiB every 1 ms (~0.26 GB/s, a pace the reservation's fill "
                  "sustains under anonymous pressure), in its own rows beside the 250 us ones and in no target.", "",
                  "Method: each case runs in repetitions (run_bench.py --reps, 3 in the quick run), the six "
                  "allocators taking turns within each repetition, so that load from outside the benchmark "
                  "falls on all of them alike. A single run's p99 is not a measurement here: on this 2-CPU "
                  "machine, shared with other work, one allocator's p99 moved between 120 and 210 us from run "
                  "to run. So every number below, and every verdict in the targets table, is the median over "
                  "the repetitions; `IQM` is the interquartile mean (the clock steps in 10 ns on this VM, so a 1 KiB p50 can only read 20, 30 or 40 ns; the IQM of the dithered readings resolves the centre, and the 1 KiB p50 targets are judged on it); the p99 column gives the spread (lowest-highest repetition) and the "
                  "repetitions' p99s in run order, and `busy` the machine's busy share (both CPUs; the "
                  "benchmark itself, while it runs, is up to 0.50 of it) during the repetitions. The CDF plots show the repetition whose p99 is the median.", "",
                  "| condition | block | mode | allocator | reps | p50 us | IQM us | p90 us | p99 us (spread: each rep) | p99.9 us | max us | busy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in h:
            sp = f" ({r['p99_all']})" if int(r["reps"]) > 1 else ""
            lines.append(f"| {r['condition']} | {int(r['block_bytes']) // 1024} KiB | {r['mode']} | {r['allocator']} | "
                         f"{r['reps']} | {fmt(r['p50_us'])} | {fmt(r['iqm_us']) if r.get('iqm_us') else '-'} | {fmt(r['p90_us'])} | {fmt(r['p99_us'])}{sp} | "
                         f"{fmt(r['p999_us'])} | {fmt(r['max_us'])} | {r['busy_range']} |")
        lines.append("")
        for name in plot_cdfs(d, h):
            lines.append(f"![{name}]({name})")
        lines.append("")
    if t:
        lines += ["## Throughput and peak RSS (2 threads, median)", "",
                  "| benchmark | allocator | wall ms | runs | peak RSS KiB | runs |", "|---|---|---|---|---|---|"]
        for r in t:
            lines.append(f"| {r['benchmark']} | {r['allocator']} | {float(r['wall_ms_median']):.0f} | {r['wall_ms_all']} | "
                         f"{int(float(r['peak_rss_kib_median']))} | {r.get('peak_rss_kib_all', '')} |")
        lines.append("")
        p = plot_tput(d, t)
        if p:
            lines.append(f"![{p}]({p})")
        lines.append("")
    if s:
        lines += ["## Subrelease: fluctuating demand (200 K x 1 KiB added, 5 s wait, removed; x10; then a low-demand tail)", "",
                  "| Delta s | coverage mean | coverage min | kernel heap THP share mean / min | kernel AnonHugePages/Rss (process) | average frag MiB | "
                  "realized frag MiB (end / max) | skipped MiB | confirmed correct MiB |", "|---|---|---|---|---|---|---|---|---|"]
        for r in s:
            heap = (f"{float(r['kernel_heap_huge_share_mean']):.3f} / {float(r['kernel_heap_huge_share_min']):.3f}"
                    if r.get("kernel_heap_huge_share_mean") else "-")
            lines.append(f"| {r['delta_s']} | {float(r['coverage_mean']):.3f} | {float(r['coverage_min']):.3f} | {heap} | "
                         f"{float(r['kernel_anonhuge_share_mean']):.3f} | {float(r['avg_fragmentation_mib']):.1f} | "
                         f"{float(r['realized_fragmentation_mib_end']):.3f} / {float(r['realized_fragmentation_mib_max']):.3f} | "
                         f"{float(r['skipped_mib']):.1f} | {float(r['skipped_correct_mib']):.1f} |")
        lines.append("")
        p = plot_subrelease(d)
        if p:
            lines.append(f"![{p}]({p})")
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    benchlib.publish(HERE, "latest", d, command="/usr/bin/python3 bench/alloc/report.py " + os.path.relpath(d, benchlib.REPO),
                     figures=["cdf-anon-262144-paced.png", "tput.png", "subrelease.png"], notes="analysis.md")


if __name__ == "__main__":
    main()
