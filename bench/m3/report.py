#!/usr/bin/python3
"""Report of the M3 evaluation (bench/m3/run.py): per-job and mean speedups (M3 §7.2),
worst case (identical jobs, §7 Fig. 8), memory timelines with the low/high/top lines
(Fig. 6) and effective memory utilisation (§7.3).

    /usr/bin/python3 bench/m3/report.py bench/out/m3/quick

Reads ``runs.jsonl`` and ``timelines/`` of the directory; writes ``summary.csv``,
``speedups.csv``, ``report.md`` and ``plots/*.png`` (matplotlib; plots are skipped
with a warning when it is missing), and the section named after the directory in
``bench/m3/RESULTS.md`` (``benchlib.publish``; only for a directory under bench/out).

The Oracle of a workload is the static partition (settings whose solo peak
footprints add up to at most the node), among those run for it, that gives memcolo
the smallest mean per-job speedup, i.e. the best static partition under the metric
reported (M3 §7.1.2: "the best found static memory partitioning for each individual
workload"). The *clairvoyant* static baseline is the same over every static setting
run, including those that oversubscribe the node where the schedule keeps the jobs
apart. A setting counts only if every job of every repetition completed without an
OOM kill.
"""

import csv
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as m3  # noqa: E402
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
TARGET_SPEEDUP = 1.6
TARGET_SLOWDOWN = 0.04


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def load(out):
    return list(m3.load_runs(out).values())


def by_config(runs, workload):
    """{config label: [runs]} of one workload; static runs are labelled by settings."""
    acc = {}
    for r in runs:
        if r["kind"] != "workload" or r["workload"] != workload:
            continue
        label = r["run_id"].split(".")[1]
        acc.setdefault(label, []).append(r)
    return acc


def job_times(rs):
    """Mean elapsed per job index over the repetitions, or None if any failed."""
    if not rs or not all(r["ok"] for r in rs):
        return None
    n = len(rs[0]["jobs"])
    return [mean(r["jobs"][i]["elapsed_s"] for r in rs) for i in range(n)]


def speedups(base, memcolo):
    return [b / m for b, m in zip(base, memcolo)]


def analyse(runs):
    workloads = []
    names = []
    for r in runs:
        if r["kind"] == "workload" and r["workload"] not in names:
            names.append(r["workload"])
    specs = dict(m3.WORKLOADS_FULL)
    for w in names:
        cfgs = by_config(runs, w)
        mc = job_times(cfgs.get("memcolo", []))
        spec = specs.get(w)
        entry = {"name": w, "spec": spec, "identical": m3.is_identical(spec) if spec else False,
                 "configs": cfgs, "memcolo": mc, "oracle": None, "oracle_label": None, "default": None}
        d = job_times(cfgs.get("default", []))
        entry["default"] = d
        entry["default_ok"] = d is not None
        statics = {k: job_times(v) for k, v in cfgs.items() if k.startswith("static-")}
        entry["statics"] = statics
        prof = {key: m3.profiles({r["run_id"]: r for r in runs}, key) for key in m3.JOB_TYPES}
        entry["partition"] = {}
        for k, v in cfgs.items():
            if k.startswith("static-") and spec:
                combo = [int(x) for x in k[len("static-"):].split("-")]
                try:
                    entry["partition"][k] = m3.combo_peaks_fit(prof, spec, combo, v[0]["node_mib"])
                except KeyError:
                    entry["partition"][k] = False
        valid = {k: v for k, v in statics.items() if v is not None}
        parts = {k: v for k, v in valid.items() if entry["partition"].get(k)}
        entry["clairvoyant"] = entry["clairvoyant_label"] = None
        if mc and parts:
            label = min(parts, key=lambda k: mean(speedups(parts[k], mc)))
            entry["oracle"], entry["oracle_label"] = parts[label], label
        if mc and valid:
            label = min(valid, key=lambda k: mean(speedups(valid[k], mc)))
            entry["clairvoyant"], entry["clairvoyant_label"] = valid[label], label
        workloads.append(entry)
    return workloads


def memory_stats(rs):
    """Mean node usage, working set and useful bytes over the runs' timelines."""
    return {
        "mean_usage_gib": mean(r["mean_usage_bytes"] for r in rs) / GIB,
        "mean_working_set_gib": mean(r["mean_working_set_bytes"] for r in rs) / GIB,
        "mean_useful_gib": mean(r["mean_useful_bytes"] for r in rs) / GIB,
        "wall_s": mean(r["wall_s"] for r in rs),
    }


def read_timeline(out, run_id):
    p = os.path.join(out, "timelines", run_id + ".csv")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        rows = list(csv.DictReader(f))

    def col(k):
        return [float(r[k]) if r.get(k) not in (None, "") else float("nan") for r in rows]

    return rows, col


def plot_all(out, runs, workloads):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots (use Debian's /usr/bin/python3)")
        return []
    pdir = os.path.join(out, "plots")
    os.makedirs(pdir, exist_ok=True)
    made = []
    colors = {"C": "tab:blue", "J": "tab:orange", "P": "tab:green"}

    # Fig. 6: memory timelines, memcolo on top, Oracle (and Default) below.
    for w in workloads:
        panels = [("memcolo", w["configs"].get("memcolo", []))]
        if w["oracle_label"]:
            panels.append(("Oracle (%s)" % w["oracle_label"], w["configs"][w["oracle_label"]]))
        if w["configs"].get("default"):
            panels.append(("Default", w["configs"]["default"]))
        panels = [(t, rs) for t, rs in panels if rs]
        if not panels:
            continue
        fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), sharex=True, squeeze=False)
        for ax, (title, rs) in zip(axes[:, 0], panels):
            r = rs[0]
            tl = read_timeline(out, r["run_id"])
            if tl is None:
                continue
            rows, col = tl
            t = col("t_s")
            stack, labels, cols = [], [], []
            for j in r["jobs"]:
                stack.append([v / GIB for v in col("j%d_usage_bytes" % j["idx"])])
                labels.append("%s (delay %ss)" % (j["name"], j["delay_s"]))
                cols.append(colors.get(j["type"]))
            ax.stackplot(t, stack, labels=labels, colors=cols, alpha=0.55)
            useful = [sum(col("j%d_useful_bytes" % j["idx"])[i] for j in r["jobs"]) / GIB for i in range(len(t))]
            ax.plot(t, useful, color="k", lw=1, ls=":", label="useful data (cache/blocks/partitions)")
            ax.plot(t, [v / GIB for v in col("usage_bytes")], color="grey", lw=1, label="node usage")
            if "low_bytes" in rows[0]:
                for k, c, lab in (("low_bytes", "gold", "low"), ("high_bytes", "red", "high"), ("top_bytes", "purple", "top")):
                    ax.plot(t, [v / GIB for v in col(k)], color=c, lw=1.2, label=lab)
            ax.axhline(r["node_mib"] / 1024, color="k", lw=0.8, ls="--", label="node limit")
            ax.set_ylabel("GiB")
            ax.set_title("%s — %s (run %s)" % (w["name"], title, r["run_id"]), fontsize=9)
            ax.legend(fontsize=6, loc="upper right", ncol=2)
        axes[-1, 0].set_xlabel("time since the first job started (s)")
        fig.tight_layout()
        p = os.path.join(pdir, "timeline-%s.png" % w["name"])
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)

    # Fig. 5 / Fig. 8: per-job run times per configuration, and mean speedups.
    ws = [w for w in workloads if w["memcolo"]]
    if ws:
        fig, axes = plt.subplots(1, len(ws), figsize=(4 * len(ws), 3.6), squeeze=False)
        for ax, w in zip(axes[0], ws):
            series = [("memcolo", w["memcolo"]), ("Oracle", w["oracle"]), ("Default", w["default"])]
            n = len(w["memcolo"])
            width = 0.25
            for k, (lab, ts) in enumerate(series):
                if ts is None:
                    continue
                ax.bar([i + (k - 1) * width for i in range(n)], ts, width, label=lab)
            names = [j["name"].split("-")[0] for j in w["configs"]["memcolo"][0]["jobs"]]
            ax.set_xticks(range(n))
            ax.set_xticklabels(names)
            ax.set_ylabel("job run time (s)")
            title = w["name"]
            if w["oracle"]:
                title += "  speedup vs Oracle %.2fx" % mean(speedups(w["oracle"], w["memcolo"]))
            ax.set_title(title, fontsize=9)
            if w["default"] is None and w["configs"].get("default"):
                ax.text(0.5, 0.9, "Default: a job failed (OOM)", transform=ax.transAxes, ha="center", fontsize=8)
            ax.legend(fontsize=7)
        fig.tight_layout()
        p = os.path.join(pdir, "runtimes.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)

    # Solo profiles: run time and peak against the setting.
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for key, jt in m3.JOB_TYPES.items():
        prof = m3.profiles({r["run_id"]: r for r in runs}, key)
        if not prof:
            continue
        xs = sorted(prof)
        ax[0].plot(xs, [prof[x][0] for x in xs], "o-", color=colors[key], label="%s %s" % (key, jt.name))
        ax[1].plot(xs, [prof[x][1] / MIB for x in xs], "o-", color=colors[key], label="%s %s" % (key, jt.name))
    ax[0].set_xlabel("setting (MiB)")
    ax[0].set_ylabel("solo run time (s)")
    ax[1].set_xlabel("setting (MiB)")
    ax[1].set_ylabel("peak footprint (MiB)")
    ax[0].legend(fontsize=8)
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(pdir, "profiles.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    made.append(p)
    return made


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(HERE), "out", "m3", "quick")
    runs = load(out)
    workloads = analyse(runs)

    # Raw summary: one row per run and job.
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run_id", "kind", "workload", "config", "rep", "job", "type", "delay_s", "setting_mib",
                    "ok", "elapsed_s", "peak_mib", "run_oom_kills", "run_mean_usage_mib", "run_mean_useful_mib",
                    "cpu_busy_pct", "steal_pct", "notify_low", "notify_high", "notify_top", "agent_kills"])
        for r in sorted(runs, key=lambda r: r["run_id"]):
            ag = r.get("agent", {})
            for j in r["jobs"]:
                w.writerow([r["run_id"], r["kind"], r["workload"], r["config"], r["rep"], j["name"], j["type"],
                            j["delay_s"], j["setting_mib"], j["ok"], j["elapsed_s"], j["peak_bytes"] // MIB,
                            r["oom_kills"], int(r["mean_usage_bytes"] // MIB), int(r["mean_useful_bytes"] // MIB),
                            r["cpu_busy_pct"], r["steal_pct"], ag.get("notify", {}).get("low"),
                            ag.get("notify", {}).get("high"), ag.get("notify", {}).get("top"), ag.get("kills")])

    lines = ["# M3 evaluation on a scratch cgroup node (bench/m3)", ""]
    node = runs[0]["node_mib"] if runs else 0
    lines += [
        "Raw data: `runs.jsonl` (one object per run), `summary.csv` (one row per job and run),",
        "`speedups.csv`, `timelines/<run>.csv` (every 250 ms), `events/<run>.jsonl` (agent event log).",
        "Method, jobs and configurations: `bench/m3/README.md`. Node: %d MiB (cgroup v1 limit), no swap." % node,
        "",
        "## Speedups (M3 §7.2: per-job speedup t_config / t_memcolo, averaged over the jobs)",
        "",
        "| workload | jobs (delay s) | memcolo run times (s) | Oracle partition (MiB) | Oracle run times (s) | per-job speedup vs Oracle | mean | clairvoyant static (MiB) | its run times (s) | mean speedup vs it | Default run times (s) | mean speedup vs Default |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    sp_rows = []
    staggered, identical, staggered_cv, identical_cv = [], [], [], []
    for w in workloads:
        mc = w["memcolo"]
        jobs_desc = ", ".join("%s@%d" % (k, d) for k, d in w["spec"]) if w["spec"] else "?"
        if mc is None:
            lines.append("| %s | %s | failed or missing | | | | | | | | | |" % (w["name"], jobs_desc))
            continue
        o = w["oracle"]
        so = speedups(o, mc) if o else None
        d = w["default"]
        sd = speedups(d, mc) if d else None
        if so:
            (identical if w["identical"] else staggered).append((w["name"], mean(so)))
        cv = w["clairvoyant"]
        scv = speedups(cv, mc) if cv else None
        if scv:
            (identical_cv if w["identical"] else staggered_cv).append((w["name"], mean(scv)))
        dtxt = "%s" % ", ".join("%.1f" % x for x in d) if d else (
            "a job failed (OOM)" if w["configs"].get("default") else "not run")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            w["name"], jobs_desc, ", ".join("%.1f" % x for x in mc),
            w["oracle_label"].replace("static-", "") if o else "none completed",
            ", ".join("%.1f" % x for x in o) if o else "",
            ", ".join("%.2fx" % x for x in so) if so else "",
            "**%.2fx**" % mean(so) if so else "",
            w["clairvoyant_label"].replace("static-", "") if cv else "",
            ", ".join("%.1f" % x for x in cv) if cv else "", "%.2fx" % mean(scv) if scv else "",
            dtxt, "%.2fx" % mean(sd) if sd else ""))
        for i, t in enumerate(mc):
            sp_rows.append([w["name"], i, w["spec"][i][0] if w["spec"] else "", t,
                            o[i] if o else "", so[i] if so else "", d[i] if d else "", sd[i] if sd else ""])
    with open(os.path.join(out, "speedups.csv"), "w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(["workload", "job", "type", "memcolo_s", "oracle_s", "speedup_vs_oracle", "default_s",
                     "speedup_vs_default"])
        cw.writerows(sp_rows)

    abl = []
    for w in workloads:
        for label in sorted(w["configs"]):
            if not label.startswith("memcolo+"):
                continue
            ts = job_times(w["configs"][label])
            v = m3.VARIANTS.get(label.split("+", 1)[1], {})
            desc = ", ".join("%s %s" % (k, json.dumps(x)) for k, x in v.get("agent_m3", {}).items())
            if v.get("jvm_flags"):
                desc = (desc + ", " if desc else "") + "J flags " + " ".join(v["jvm_flags"])
            if v.get("num_epochs"):
                desc = (desc + ", " if desc else "") + "NUM_epochs %d for J and P" % v["num_epochs"]
            if ts is None:
                abl.append("| %s | %s | %s | a job failed or was OOM-killed | | | |" % (w["name"], label, desc))
                continue
            abl.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                w["name"], label, desc, ", ".join("%.1f" % x for x in ts),
                "%.2fx" % mean(speedups(w["oracle"], ts)) if w["oracle"] else "",
                "%.2fx" % mean(speedups(w["clairvoyant"], ts)) if w["clairvoyant"] else "",
                "%.2fx" % mean(speedups(w["memcolo"], ts)) if w["memcolo"] else ""))
    if abl:
        lines += ["", "## Ablations of the memcolo configuration (same workloads, one setting changed)", "",
                  "| workload | config | change | run times (s) | mean speedup vs Oracle | vs clairvoyant | vs memcolo defaults |",
                  "|---|---|---|---|---|---|---|"] + abl

    lines += ["", "## Every static partition run (the Oracle search)", "",
              "| workload | settings (MiB per job) | partition? | run times (s) | mean speedup of memcolo over it |", "|---|---|---|---|---|"]
    for w in workloads:
        for label, ts in sorted(w["statics"].items()):
            mark = " (Oracle)" if label == w["oracle_label"] else (
                " (clairvoyant)" if label == w["clairvoyant_label"] else "")
            part = "yes" if w["partition"].get(label) else "no: oversubscribes the node"
            if ts is None:
                fails = [r for r in w["configs"][label] if not r["ok"]]
                why = ("OOM kill" if any(r["oom_kills"] for r in fails) else
                       "timed out (node at its limit, reclaim stall)" if any(
                           j["rc"] == "timeout" for r in fails for j in r["jobs"]) else "a job failed")
                lines.append("| %s | %s | %s | %s | |" % (w["name"], label.replace("static-", ""), part, why))
            else:
                lines.append("| %s | %s%s | %s | %s | %s |" % (
                    w["name"], label.replace("static-", ""), mark, part, ", ".join("%.1f" % x for x in ts),
                    "%.2fx" % mean(speedups(ts, w["memcolo"])) if w["memcolo"] else ""))

    lines += ["", "## Effective memory utilisation (M3 §7.3)", "",
              "Mean over each run's duration of the node's charged memory (what the OS sees), its",
              "working set (charged less inactive page cache) and the data the jobs actually keep",
              "(cache contents, cached blocks, in-memory partitions).", "",
              "| workload | config | run wall (s) | mean charged (GiB) | mean working set (GiB) | mean useful data (GiB) | useful / charged |",
              "|---|---|---|---|---|---|---|"]
    for w in workloads:
        for label, title in (("memcolo", "memcolo"), (w["oracle_label"], "Oracle"),
                             (w["clairvoyant_label"] if w["clairvoyant_label"] != w["oracle_label"] else None,
                              "clairvoyant"), ("default", "Default")):
            rs = w["configs"].get(label) if label else None
            if not rs:
                continue
            ms = memory_stats(rs)
            lines.append("| %s | %s | %.1f | %.2f | %.2f | %.2f | %.0f %% |" % (
                w["name"], title, ms["wall_s"], ms["mean_usage_gib"], ms["mean_working_set_gib"],
                ms["mean_useful_gib"], 100 * ms["mean_useful_gib"] / ms["mean_usage_gib"] if ms["mean_usage_gib"] else 0))

    lines += ["", "## Agent activity and failures (memcolo runs)", "",
              "| run | notifications low / high / top | answers ok / failed | reclaimed (MiB) | agent kills | OOM kills | zone samples | CPU busy % | steal % |",
              "|---|---|---|---|---|---|---|---|---|"]
    kills = ooms = 0
    for r in sorted(runs, key=lambda r: r["run_id"]):
        if not r["config"].startswith("memcolo"):
            continue
        ag = r.get("agent", {})
        n = ag.get("notify", {})
        kills += ag.get("kills", 0)
        ooms += r["oom_kills"] + sum(1 for j in r["jobs"] if not j["ok"])
        lines.append("| %s | %d / %d / %d | %d / %d | %d | %d | %d | %s | %.0f | %.1f |" % (
            r["run_id"], n.get("low", 0), n.get("high", 0), n.get("top", 0), ag.get("reclaimed_ok", 0),
            ag.get("reclaimed_failed", 0), ag.get("reclaimed_bytes", 0) // MIB, ag.get("kills", 0),
            r["oom_kills"], ag.get("zone_samples"), r["cpu_busy_pct"], r["steal_pct"]))
    other_fail = [r["run_id"] for r in runs if not r["config"].startswith("memcolo") and not r["ok"]]
    if other_fail:
        lines += ["", "Runs without the agent where a job failed or was OOM-killed: " + ", ".join(sorted(other_fail)) + "."]

    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    if staggered:
        ms = mean(s for _, s in staggered)
        lines.append("| mean per-job speedup ≥ %.1fx over the best static partition, staggered workloads | %.2fx (%s) | %s |" % (
            TARGET_SPEEDUP, ms, ", ".join("%s %.2fx" % x for x in staggered), "yes" if ms >= TARGET_SPEEDUP else "**no**"))
    else:
        lines.append("| mean speedup ≥ %.1fx over Oracle, staggered | not measured | |" % TARGET_SPEEDUP)
    if identical:
        worst = max(1 / s - 1 for _, s in identical)
        lines.append("| ≤ %d %% slowdown on identical simultaneous jobs | %s (worst %+.1f %%) | %s |" % (
            TARGET_SLOWDOWN * 100, ", ".join("%s %+.1f %%" % (n, 100 * (1 / s - 1)) for n, s in identical),
            100 * worst, "yes" if worst <= TARGET_SLOWDOWN else "**no**"))
    else:
        lines.append("| ≤ 4 % slowdown, identical jobs | not measured | |")
    if staggered_cv:
        ms = mean(s for _, s in staggered_cv)
        lines.append("| (for reference) mean per-job speedup over the clairvoyant static setting, staggered | %.2fx (%s) | %s |" % (
            ms, ", ".join("%s %.2fx" % x for x in staggered_cv), "yes" if ms >= TARGET_SPEEDUP else "no"))
    lines.append("| no process killed, no OOM (memcolo runs) | %d agent kills, %d OOM-killed or failed jobs | %s |" % (
        kills, ooms, "yes" if kills == 0 and ooms == 0 else "**no**"))

    plots = plot_all(out, runs, workloads)
    if plots:
        lines += ["", "## Plots", ""]
        for p in plots:
            rel = os.path.relpath(p, out)
            lines.append("![%s](%s)" % (os.path.basename(p), rel))
    prof_lines = ["", "## Solo profiles (one job alone in the node, static setting)", "",
                  "| job | setting (MiB) | run time (s) | peak footprint (MiB) |", "|---|---|---|---|"]
    rmap = {r["run_id"]: r for r in runs}
    for key, jt in m3.JOB_TYPES.items():
        prof = m3.profiles(rmap, key)
        for s in sorted(prof):
            prof_lines.append("| %s %s | %d | %.1f | %d |" % (key, jt.name, s, prof[s][0], prof[s][1] // MIB))
    lines += prof_lines
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    benchlib.publish(HERE, os.path.basename(os.path.normpath(out)), out,
                     command="/usr/bin/python3 bench/m3/report.py " + os.path.relpath(out, benchlib.REPO),
                     figures=["plots/timeline-CJP.png", "plots/timeline-JJJ-0.png", "plots/runtimes.png"])


if __name__ == "__main__":
    main()
