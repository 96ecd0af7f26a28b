#!/usr/bin/python3
"""Wake-up latency of the LC CPU against the VM's CPU busy share, no memory pressure.

Question (issue 4): Redis at 100 % pressure waits runnable 46–71 ms on a guest-idle
CPU 0 in a few seconds per run. Those runs have the BE CPU busy (VM >= ~60 % busy);
the 0 % baseline has no BE jobs at all. Does CPU share alone, with no memory pressure
and no agent, make the same stalls (for example a host CFS bandwidth quota on the VM
that, once used up in a 100 ms period, leaves a halted vCPU unwoken for the rest of
it)?

Per level (VM busy %, of both CPUs together) the script runs CPU-only load —
`stress-ng --cpu 1 --cpu-load P --cpu-load-slice 10` per loaded CPU, in a scratch
memory cgroup below our own group — and beside it three `wake_probe` loops (1 ms
sleeps, the overshoot of each wake-up; `wake_probe.c` here):

  fifo-cpu0   SCHED_FIFO on CPU 0 (the LC CPU): no guest task can delay it, so a long
              overshoot is the vCPU not run by the host (or interrupts off)
  other-cpu0  SCHED_OTHER on CPU 0: what an LC thread such as Redis sees
  fifo-cpu1   SCHED_FIFO on CPU 1 (the BE CPU)

Load placement `fill` (default) loads CPU 1 first as the BE jobs do, then CPU 0:
level L puts min(2L, 100) % on CPU 1 and max(0, 2L - 100) % on CPU 0; `spread` puts
L % on each. Per level it records the machine's busy share (of /proc/stat, steal
excluded), busy and steal per CPU, kdamond's CPU time, and free page reporting's
reported KiB and passes; `host_mm_sampler.py` runs beside it (250 ms rows) so each
overshoot over 10 ms can be matched with a steal tick or a reporting pass.

Outputs in OUT: `levels.csv` (one row per level and probe), `events-<level>-<probe>.csv`
(every overshoot > 1 ms, CLOCK_MONOTONIC), `host-mm.csv`, `summary.md`.

    sudo flock /tmp/memcolo-bench.lock bench/reclaim/cpu_share_probe.py --out DIR
    sudo flock /tmp/memcolo-bench.lock bench/reclaim/cpu_share_probe.py --out DIR \\
        --levels 0,60,100 --duration-s 30 --placement spread

Needs root (SCHED_FIFO, cgroups), stress-ng and a C compiler. ~(duration + 4) s per
level. Takes no lock itself: run it under the bench lock.
"""
import argparse
import bisect
import csv
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HZ = os.sysconf("SC_CLK_TCK")
PR = "/sys/module/page_reporting/parameters/"
PROBES = [("fifo-cpu0", 0, 50), ("other-cpu0", 0, 0), ("fifo-cpu1", 1, 50)]


def read_int(path, default=0):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def cpu_times():
    """{cpuN: (busy ticks without steal, steal ticks, total ticks)} and the aggregate 'cpu'."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            n = line.split()
            v = [int(x) for x in n[1:9]]
            user, nice, system, idle, iowait, irq, softirq, steal = v
            total = sum(v)
            out[n[0]] = (total - idle - iowait - steal, steal, total)
    return out


def kdamond_cpu_ms():
    ms = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if not open(f"/proc/{d}/comm").read().startswith("kdamond"):
                continue
            f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            ms += (int(f[11]) + int(f[12])) * 1000 // HZ
        except (OSError, IndexError, ValueError):
            pass
    return ms


def snapshot():
    return {
        "cpu": cpu_times(),
        "kdamond_ms": kdamond_cpu_ms(),
        "reported_kib": read_int(PR + "reported_kib"),
        "passes": read_int(PR + "passes"),
        "load1": float(open("/proc/loadavg").read().split()[0]),
    }


class ScratchGroup:
    """A v1 memory cgroup below our own group for the load; removed on close."""

    def __init__(self, name):
        self.path = benchlib.scratch_cgroup(name, 512 << 20)

    def enter_fn(self):
        path = self.path
        return lambda: benchlib.cg_add(path, os.getpid())

    def cpu_ms(self):
        """utime + stime of the group's processes and their threads, ms."""
        ms = 0
        for pid in open(f"{self.path}/cgroup.procs").read().split():
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                    ms += (int(f[11]) + int(f[12])) * 1000 // HZ
            except (OSError, IndexError, ValueError):
                pass
        return ms

    def close(self):
        benchlib.cg_remove(self.path)


def placement(level, how):
    """{cpu: load %} for a VM busy level (percent of both CPUs)."""
    if how == "spread":
        return {0: level, 1: level}
    return {1: min(2 * level, 100), 0: max(0, 2 * level - 100)}


def start_load(loads, seconds, group, log):
    procs = []
    for cpu, pct in loads.items():
        if pct <= 0:
            continue
        cmd = ["stress-ng", "--cpu", "1", "--cpu-load", str(pct), "--cpu-load-slice", "10",
               "--taskset", str(cpu), "--timeout", f"{seconds}s", "--quiet"]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=log,
                                      preexec_fn=group.enter_fn(), start_new_session=True))
    return procs


def stop_load(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def steal_near(rows, t, cpu_col, window_s=0.25):
    """Steal ms of a CPU in the host-mm samples around `t` (from the last sample at or
    before t - window to the first at or after t + window)."""
    times = [r[0] for r in rows]
    i = max(0, bisect.bisect_right(times, t - window_s) - 1)
    j = min(len(rows) - 1, bisect.bisect_left(times, t + window_s))
    return rows[j][cpu_col] - rows[i][cpu_col], rows[j][2] - rows[i][2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--levels", default="0,40,60,75,100",
                    help="VM busy levels, percent of both CPUs (default 0,40,60,75,100)")
    ap.add_argument("--duration-s", type=float, default=40)
    ap.add_argument("--warmup-s", type=float, default=3)
    ap.add_argument("--placement", choices=["fill", "spread"], default="fill")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (SCHED_FIFO, cgroups)")
    levels = [int(x) for x in a.levels.split(",")]
    os.makedirs(a.out, exist_ok=True)
    probe = os.path.join(a.out, "wake_probe")
    subprocess.run(["cc", "-O2", "-Wall", "-o", probe, os.path.join(HERE, "wake_probe.c")],
                   check=True)
    log = open(os.path.join(a.out, "load.log"), "a")
    sampler = subprocess.Popen([sys.executable, os.path.join(HERE, "host_mm_sampler.py"),
                                os.path.join(a.out, "host-mm.csv"), "0.25"])
    group = ScratchGroup(f"memcolo-cpu-probe-{os.getpid()}")
    rows = []
    load = []
    try:
        for level in levels:
            loads = placement(level, a.placement)
            load = start_load(loads, a.warmup_s + a.duration_s + 5, group, log)
            time.sleep(a.warmup_s)
            s0 = snapshot()
            g0 = group.cpu_ms()
            t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
            runs = []
            for name, cpu, fifo in PROBES:
                cmd = [probe, "--cpu", str(cpu), "--duration-s", str(a.duration_s),
                       "--events", os.path.join(a.out, f"events-{level}-{name}.csv")]
                if fifo:
                    cmd += ["--fifo", str(fifo)]
                runs.append((name, subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)))
            res = {name: json.loads(p.communicate()[0]) for name, p in runs}
            s1 = snapshot()
            g1 = group.cpu_ms()
            t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
            stop_load(load)
            load = []
            c0, c1 = s0["cpu"], s1["cpu"]

            def share(key, idx):
                dt = c1[key][2] - c0[key][2]
                return 100.0 * (c1[key][idx] - c0[key][idx]) / dt if dt else 0.0

            # Busy time of the machine less the load's: other work (the probes' own
            # CPU, well under 1 %, counts as foreign).
            ticks = (c1["cpu"][2] - c0["cpu"][2]) or 1
            load_pct = 100.0 * (g1 - g0) / (ticks * 1000 / HZ)
            foreign = max(0.0, share("cpu", 0) - load_pct)
            for name, _, _ in PROBES:
                r = res[name]
                row = {
                    "level_pct": level, "placement": a.placement,
                    "load_cpu0_pct": loads.get(0, 0), "load_cpu1_pct": loads.get(1, 0),
                    "probe": name, "mono_from": f"{t0:.3f}", "mono_to": f"{t1:.3f}",
                    "machine_busy_pct": round(share("cpu", 0), 1),
                    "load_busy_pct": round(load_pct, 1),
                    "foreign_busy_pct": round(foreign, 1),
                    "cpu0_busy_pct": round(share("cpu0", 0), 1),
                    "cpu1_busy_pct": round(share("cpu1", 0), 1),
                    "cpu0_steal_ms": (c1["cpu0"][1] - c0["cpu0"][1]) * 1000 // HZ,
                    "cpu1_steal_ms": (c1["cpu1"][1] - c0["cpu1"][1]) * 1000 // HZ,
                    "kdamond_cpu_ms": s1["kdamond_ms"] - s0["kdamond_ms"],
                    "reported_mib": (s1["reported_kib"] - s0["reported_kib"]) // 1024,
                    "reporting_passes": s1["passes"] - s0["passes"],
                    "load1": s0["load1"],
                }
                row.update({k: r[k] for k in ["samples", "p50_us", "p99_us", "p999_us", "max_us",
                                              "over_1ms", "over_5ms", "over_10ms", "over_20ms",
                                              "over_50ms"]})
                rows.append(row)
            print(f"level {level} %: busy {rows[-1]['machine_busy_pct']} % "
                  f"(foreign {rows[-1]['foreign_busy_pct']} %), " + ", ".join(
                f"{n} max {res[n]['max_us']} us >10ms {res[n]['over_10ms']}"
                for n, _, _ in PROBES), flush=True)
    finally:
        stop_load(load)
        group.close()
        sampler.send_signal(signal.SIGTERM)
        sampler.wait()
    with open(os.path.join(a.out, "levels.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_summary(a.out, rows)


def write_summary(out, rows):
    mm = []
    with open(os.path.join(out, "host-mm.csv")) as f:
        r = csv.reader(f)
        head = next(r)
        for line in r:
            mm.append([float(x) for x in line])
    col0 = head.index("steal_ms_cpu0")
    col1 = head.index("steal_ms_cpu1")
    lines = ["# Wake-up latency against the VM's CPU busy share (no memory pressure)", "",
             "Computed by `bench/reclaim/cpu_share_probe.py` from `levels.csv`, the "
             "`events-*.csv` files and `host-mm.csv`. Overshoot = how late a 1 ms sleep "
             "woke. 'with steal' = overshoots over 10 ms with a steal tick on that CPU in "
             "the 250 ms samples around them; 'with a pass' = with a free-page-reporting "
             "pass there.", "",
             "| level | load CPU0/CPU1 % | probe | machine busy % (load / foreign) | CPU0 / CPU1 busy % | "
             "steal CPU0 / CPU1 ms | samples | p50 / p99 / p99.9 µs | max µs | > 5 ms | "
             "> 10 ms | > 20 ms | > 50 ms | > 10 ms with steal | > 10 ms with a pass | "
             "reported MiB (passes) | kdamond ms |",
             "|---:|---|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for row in rows:
        ev = os.path.join(out, f"events-{row['level_pct']}-{row['probe']}.csv")
        with_steal = with_pass = n10 = 0
        col = col1 if row["probe"].endswith("cpu1") else col0
        with open(ev) as f:
            for e in csv.DictReader(f):
                if int(e["overshoot_us"]) <= 10000:
                    continue
                n10 += 1
                st, passes = steal_near(mm, float(e["mono_s"]), col) if mm else (0, 0)
                with_steal += st > 0
                with_pass += passes > 0
        lines.append(
            f"| {row['level_pct']} % | {row['load_cpu0_pct']}/{row['load_cpu1_pct']} | "
            f"{row['probe']} | {row['machine_busy_pct']} ({row['load_busy_pct']} / "
            f"{row['foreign_busy_pct']}) | {row['cpu0_busy_pct']} / "
            f"{row['cpu1_busy_pct']} | {row['cpu0_steal_ms']} / {row['cpu1_steal_ms']} | "
            f"{row['samples']} | {row['p50_us']} / {row['p99_us']} / {row['p999_us']} | "
            f"{row['max_us']} | {row['over_5ms']} | {row['over_10ms']} | {row['over_20ms']} | "
            f"{row['over_50ms']} | {with_steal}/{n10} | {with_pass}/{n10} | "
            f"{row['reported_mib']} ({row['reporting_passes']}) | {row['kdamond_cpu_ms']} |")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
