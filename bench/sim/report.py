#!/usr/bin/python3
"""Report of bench/sim (``bench/sim/run.sh``): the papers' headline experiments at
their sizes set beside the papers' figures, the fleet A/B and the validation against
this machine, as ``report.md`` and PNG plots.

    /usr/bin/python3 bench/sim/report.py bench/out/sim/<date>-<host>

Input, in the directory (written by ``run.sh``; each ``report.json`` is ``memcolo sim
SCENARIO --out DIR``'s, rows as documented in ``docs/sim.md``):

  m3-paper/report.json       M3 §7.2: per workload the best static partition and the
                             mean per-job speedup of M3 over it;
  hermes-paper/report.json   Hermes §5.3: per level SLO violations (%) under the
                             kernel alone and memcolo and their reduction;
  maxmem-paper/report.json   MaxMem §5.1.2: per (change, process) epochs to target,
                             fast memory (MiB) and the saving against a table each;
  fleet-ab/report.json       the fleet's kernel/memcolo A/B (optional);
  validate/validation.json   ``memcolo sim --validate``: sim against measured per cell
                             (optional).

Output, in the directory: ``report.md`` (tables beside the papers' figures) and
``plots/papers.png``, ``plots/fleet.png``, ``plots/validation.png`` (matplotlib;
skipped with a note in ``report.md`` when it does not import). Exit status 2 with a
message when a required input is missing or malformed.
"""

import json
import os
import statistics
import sys

# The papers' figures, with their source.
M3_FIG5_MEAN = 1.86  # M3 §7.2: mean speedup over the Oracle, twelve workloads.
M3_FIG5_OWS = 1.60  # ... over Oracle with Spark configuration (OWS).
M3_FIG8_MEAN = 1 - 0.0377  # §7.2, Fig. 8: average slow-down 3.77 % vs OWS.
HERMES_FIG16_MAX_REDUCTION = 83.6  # Hermes §5.3.1, Fig. 16: Redis, levels >= 100 %.
HERMES_UTILISATION = 98.5  # Hermes §5.3.2: average node memory utilisation.
MAXMEM_SAVED = 32.0  # MaxMem §5.2: fast memory saved against HeMem's partition.


def die(msg):
    print(f"report.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path, required=True):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        if required:
            die(f"{path} missing (run bench/sim/run.sh)")
        return None
    except (OSError, ValueError) as e:
        die(f"{path}: {e}")


def rows(report, name):
    if not isinstance(report, dict) or not isinstance(report.get("rows"), list):
        die(f"{name}: no rows")
    return report["rows"]


def m3_tables(r):
    fig5 = [x for x in r if not x["workload"].endswith("-0")]
    fig8 = [x for x in r if x["workload"].endswith("-0")]
    out = ["| workload | best static (GiB) | static run s | M3 run s | per-job speedup | mean |",
           "|---|---|---|---|---|---:|"]
    for x in r:
        ms = x["mean_speedup"]
        out.append(f"| {x['workload']} | {x['best_static_gib']} | {x['static_run_s']} | "
                   f"{x['m3_run_s']} | {x['speedups']} | {'-' if ms is None else f'{ms:.2f}'} |")

    def mean(xs):
        v = [x["mean_speedup"] for x in xs if x["mean_speedup"] is not None]
        return statistics.mean(v) if v else float("nan")

    out.append("")
    out.append("| | sim | paper |")
    out.append("|---|---:|---:|")
    out.append(f"| Fig. 5 shape, mean speedup over the Oracle | {mean(fig5):.2f} | "
               f"{M3_FIG5_MEAN} (over OWS {M3_FIG5_OWS}) |")
    out.append(f"| Fig. 8 worst cases, mean | {mean(fig8):.2f} | {M3_FIG8_MEAN:.3f} |")
    used = [(x["static_used_gib"], x["m3_used_gib"]) for x in fig5]
    if used:
        out.append(f"| Fig. 5 shape, memory in use static / M3 (GiB) | "
                   f"{statistics.mean(u[0] for u in used):.1f} / "
                   f"{statistics.mean(u[1] for u in used):.1f} | 63 / 38 (Fig. 6), 54 / 48 (Fig. 7) |")
    return out, mean(fig5), mean(fig8)


def hermes_table(r):
    out = ["| level % | SLO µs | violations kernel % | memcolo % | reduction % | "
           "utilisation kernel % | memcolo % |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r:
        red = x["reduction_pct"]
        out.append(f"| {x['level']} | {x['slo_us']:.0f} | {x['kernel_slo_violation_pct']:.1f} | "
                   f"{x['memcolo_slo_violation_pct']:.1f} | {'-' if red is None else f'{red:.1f}'} | "
                   f"{x['kernel_utilisation_pct']:.1f} | {x['memcolo_utilisation_pct']:.1f} |")
    loaded = [x["reduction_pct"] for x in r if x["level"] >= 100 and x["reduction_pct"] is not None]
    best = max(loaded) if loaded else float("nan")
    out.append("")
    out.append(f"Largest reduction at levels >= 100 %: sim {best:.1f} %, paper "
               f"{HERMES_FIG16_MAX_REDUCTION} % (Fig. 16, Redis).")
    return out, best


def maxmem_table(r):
    out = ["| change | process | epochs to target | fast MiB | hot MiB | saved vs table % |",
           "|---|---|---:|---:|---:|---:|"]
    for x in r:
        s = x["saved_vs_table_pct"]
        e = x["epochs_to_target"]
        out.append(f"| {x['change']} | {x['process']} | {'-' if e is None else e} | "
                   f"{x['fast_mib_at_end']:.0f} | {x['hot_mib']:.0f} | {'-' if s is None else f'{s:.1f}'} |")
    return out


def plots(d, m3, hermes, maxmem, fleet, validation):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return [f"Plots skipped: matplotlib does not import ({e})."]
    pdir = os.path.join(d, "plots")
    os.makedirs(pdir, exist_ok=True)
    written = []

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    names = [x["workload"] for x in m3]
    vals = [x["mean_speedup"] or 0 for x in m3]
    colors = ["tab:gray" if n.endswith("-0") else "tab:blue" for n in names]
    ax[0].bar(range(len(names)), vals, color=colors)
    ax[0].axhline(M3_FIG5_MEAN, color="tab:red", ls="--", label=f"paper Fig. 5 mean {M3_FIG5_MEAN}")
    ax[0].axhline(M3_FIG8_MEAN, color="k", ls=":", label=f"paper Fig. 8 mean {M3_FIG8_MEAN:.2f}")
    ax[0].set_xticks(range(len(names)))
    ax[0].set_xticklabels(names, rotation=60, fontsize=8)
    ax[0].set_ylabel("mean per-job speedup over the Oracle")
    ax[0].set_title("M3 §7.2 at 64 GiB (sim; grey: Fig. 8 cases)")
    ax[0].legend(fontsize=8)

    lv = [x["level"] for x in hermes]
    ax[1].plot(lv, [x["kernel_slo_violation_pct"] for x in hermes], "o-", label="kernel alone")
    ax[1].plot(lv, [x["memcolo_slo_violation_pct"] for x in hermes], "s-", label="memcolo")
    ax[1].set_ylim(bottom=0)
    ax[1].set_xlabel("batch demand, % of node")
    ax[1].set_ylabel("requests over SLO (p90 alone), %")
    ax[1].set_title(f"Hermes §5.3 at 128 GiB (paper: up to -{HERMES_FIG16_MAX_REDUCTION} %)")
    ax[1].legend(fontsize=8)

    last = {}
    for x in maxmem:
        last[x["process"]] = x
    procs = sorted(last)
    ax[2].bar([i - 0.2 for i in range(len(procs))], [last[p]["fast_mib_at_end"] / 1024 for p in procs],
              width=0.4, label="fast memory at the end (MaxMem)")
    ax[2].bar([i + 0.2 for i in range(len(procs))], [last[p]["hot_mib"] / 1024 for p in procs],
              width=0.4, label="hot set (static partition with hindsight)")
    ax[2].set_xticks(range(len(procs)))
    ax[2].set_xticklabels(procs)
    ax[2].set_ylabel("GiB")
    ax[2].set_title("MaxMem §5.1.2 at 144 GiB fast, after the last change")
    ax[2].legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(pdir, "papers.png")
    fig.savefig(p, dpi=90)
    plt.close(fig)
    written.append(p)

    if fleet:
        fr = fleet["rows"]
        metrics = [("utilisation", "utilisation %", 100), ("lc_stall_s", "LC stall, s (fleet)", 1),
                   ("oom_kills", "OOM kills", 1), ("m3_kills", "M3 kills", 1),
                   ("peak_swap_ratio", "peak swap, worst node %", 100)]
        fig, ax = plt.subplots(1, len(metrics), figsize=(15, 3.3))
        for a, (k, label, scale) in zip(ax, metrics):
            a.bar([x["mode"] for x in fr], [x[k] * scale for x in fr], color=["tab:gray", "tab:blue"][:len(fr)])
            a.set_title(label)
        fig.suptitle(f"fleet: {fr[0]['nodes']} nodes, a simulated day, same mixes")
        fig.tight_layout()
        p = os.path.join(pdir, "fleet.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)

    if validation:
        cells = validation["cells"]
        ms = sorted({c["metric"] for c in cells})
        ncol = min(4, len(ms))
        nrow = (len(ms) + ncol - 1) // ncol
        fig, ax = plt.subplots(nrow, ncol, figsize=(3.8 * ncol, 3.4 * nrow), squeeze=False)
        ax = [a for r in ax for a in r]
        for a in ax[len(ms):]:
            a.axis("off")
        for a, m in zip(ax, ms):
            cs = [c for c in cells if c["metric"] == m and c["measured"] > 0 and c["sim"] > 0]
            if not cs:
                continue
            a.errorbar([c["measured"] for c in cs], [c["sim"] for c in cs],
                       xerr=[[c["measured"] - c["measured_min"] for c in cs],
                             [c["measured_max"] - c["measured"] for c in cs]],
                       fmt="o", ms=4, alpha=0.8)
            lo = min(min(c["measured_min"], c["sim"]) for c in cs) * 0.8
            hi = max(max(c["measured_max"], c["sim"]) for c in cs) * 1.2
            a.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            a.plot([lo, hi], [lo * 1.25, hi * 1.25], "k:", lw=0.8)
            a.plot([lo, hi], [lo * 0.75, hi * 0.75], "k:", lw=0.8)
            if hi / max(lo, 1e-9) > 20:
                a.set_xscale("log")
                a.set_yscale("log")
            a.set_title(m, fontsize=9)
            a.set_xlabel("measured")
        ax[0].set_ylabel("simulated (dotted: ±25 %)")
        fig.tight_layout()
        p = os.path.join(pdir, "validation.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
    return written


def main():
    if len(sys.argv) != 2:
        die(__doc__)
    d = sys.argv[1]
    m3 = rows(load(os.path.join(d, "m3-paper", "report.json")), "m3-paper")
    hermes = rows(load(os.path.join(d, "hermes-paper", "report.json")), "hermes-paper")
    maxmem = rows(load(os.path.join(d, "maxmem-paper", "report.json")), "maxmem-paper")
    fleet = load(os.path.join(d, "fleet-ab", "report.json"), required=False)
    validation = load(os.path.join(d, "validate", "validation.json"), required=False)
    md = ["# bench/sim report", ""]
    md += ["## M3 §7.2 at 64 GiB (`memcolo sim m3-paper`)", ""]
    t, _, _ = m3_tables(m3)
    md += t + [""]
    md += ["## Hermes §5.3 at 128 GiB (`memcolo sim hermes-paper`)", ""]
    t, _ = hermes_table(hermes)
    md += t + [""]
    md += ["## MaxMem §5.1.2 at 144 GiB (`memcolo sim maxmem-timeline`)", ""]
    md += maxmem_table(maxmem) + [""]
    if validation:
        md += ["## Validation (`memcolo sim --validate`)", "",
               "| metric | cells | mean abs error % | largest % | inside measured range | pass |",
               "|---|---:|---:|---:|---:|---|"]
        for m in validation["metrics"]:
            md.append(f"| {m['metric']} | {m['cells']} | {m['mean_abs_error_pct']:.0f} | "
                      f"{m['max_abs_error_pct']:.0f} | {m['within_measured_range']} | {m['pass']} |")
        md.append("")
    written = plots(d, m3, hermes, maxmem, fleet, validation)
    md += ["## Plots", ""] + [f"- {os.path.relpath(p, d)}" if p.endswith(".png") else p
                              for p in written] + [""]
    out = os.path.join(d, "report.md")
    with open(out, "w") as f:
        f.write("\n".join(md))
    print(out)
    for p in written:
        if p.endswith(".png"):
            print(p)


if __name__ == "__main__":
    main()
