#!/usr/bin/python3
"""Where the time of the slow allocations goes, from file_trace.sh's runs.

For each run NAME-REP in DIR (raw-*.csv from hermes_bench's HERMES_RAW, perf-*.data, the
begin line in trace-*.txt): the allocations above the run's own p95 and, for comparison,
those between p25 and p75 (in us, means per allocation):
  lat      malloc + first write to each page
  flt      the application thread's user page faults inside the allocation (64 = every
           page of a 256 KiB block faulted by the application; 0 = a pre-faulted block)
  rcl      the application thread's memcg reclaim (mm_vmscan_memcg_reclaim_begin/end)
  offR     off its CPU while runnable (preempted; who ran instead: `took`)
  offD     off its CPU blocked (D: I/O, locks; S: sleeping)
  rest     lat - rcl - offR - offD: on CPU, outside reclaim (fault handling, zeroing, the
           host's first-touch faults, the allocator itself)
  mgmt     another thread of the process (libmemcolo's management thread) in memcg
           reclaim during the allocation / on a CPU during it
Per run also: the application's and the other threads' reclaim in total (count, ms).
usage: file_trace.py DIR"""
import collections
import csv
import glob
import os
import re
import subprocess
import sys

EV = re.compile(r"\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)")


def events(path):
    out = subprocess.run(["perf", "script", "--ns", "-i", path, "-F", "comm,tid,cpu,time,event,trace"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = EV.match(line)
        if m:
            yield (float(m.group(4)) * 1e6, m.group(1), int(m.group(2)), int(m.group(3)), m.group(5), m.group(6))


def overlap(iv, s, e):
    return sum(max(0.0, min(b, e) - max(a, s)) for a, b, *_ in iv if b > s and a < e)


def analyze(d, tag):
    begin = None
    for line in open(os.path.join(d, f"trace-{tag}.txt")):
        if line.startswith("hermes_begin_mono_us,"):
            begin = int(line.split(",")[1])
    raw = [(float(r["start_us"]), int(r["latency_ns"]) / 1000) for r in csv.DictReader(open(os.path.join(d, f"raw-{tag}.csv")))]
    if begin is None or not raw:
        return None
    ev = list(events(os.path.join(d, f"perf-{tag}.data")))
    tids = collections.Counter(t for _, c, t, _, _, _ in ev if c == "hermes_bench")
    if not tids:
        return None
    app = min(tids)  # the main thread: pid == tid
    others = set(tids) - {app}
    faults = []
    rcl = collections.defaultdict(list)
    open_rcl = {}
    off = []  # (start, end, state, who)
    on = collections.defaultdict(list)
    cur_off = None
    run_since = {}
    for t, comm, tid, cpu, name, rest in ev:
        t -= begin
        if name == "exceptions:page_fault_user" and tid == app:
            faults.append(t)
        elif name.endswith("memcg_reclaim_begin"):
            open_rcl[tid] = t
        elif name.endswith("memcg_reclaim_end") and tid in open_rcl:
            rcl[tid].append((open_rcl.pop(tid), t))
        elif name == "sched:sched_switch":
            f = dict(kv.split("=", 1) for kv in re.findall(r"(\w+=\S+)", rest))
            pp, np_ = int(f.get("prev_pid", -1)), int(f.get("next_pid", -1))
            if pp == app:
                cur_off = (t, f.get("prev_state", "?"), f.get("next_comm", "?"))
            if np_ == app and cur_off:
                off.append((cur_off[0], t, cur_off[1], cur_off[2]))
                cur_off = None
            if pp in others and pp in run_since:
                on[pp].append((run_since.pop(pp), t))
            if np_ in others:
                run_since[np_] = t
    faults.sort()
    import bisect
    lats = sorted(l for _, l in raw)
    n = len(lats)
    p95, p25, p75 = lats[int(0.95 * (n - 1))], lats[int(0.25 * (n - 1))], lats[int(0.75 * (n - 1))]
    offR = [x for x in off if x[2].startswith("R")]
    offD = [x for x in off if not x[2].startswith("R")]
    rows = {}
    for band, sel in (("slow", lambda l: l > p95), ("mid", lambda l: p25 <= l <= p75)):
        acc = collections.Counter()
        took = collections.Counter()
        k = 0
        for s, l in raw:
            if not sel(l):
                continue
            e = s + l
            k += 1
            acc["lat"] += l
            acc["flt"] += bisect.bisect_left(faults, e) - bisect.bisect_left(faults, s)
            acc["rcl"] += overlap(rcl[app], s, e)
            r_ = overlap(offR, s, e)
            acc["offR"] += r_
            acc["offD"] += overlap(offD, s, e)
            for a, b, st, who in offR:
                if b > s and a < e:
                    took[who] += min(b, e) - max(a, s)
            acc["mgmt_rcl"] += sum(overlap(rcl[o], s, e) for o in others)
            acc["mgmt_on"] += sum(overlap(on[o], s, e) for o in others)
            acc["hit"] += (bisect.bisect_left(faults, e) - bisect.bisect_left(faults, s)) == 0
        if k:
            rows[band] = {x: acc[x] / k for x in acc}
            rows[band]["n"] = k
            rows[band]["rest"] = rows[band]["lat"] - rows[band]["rcl"] - rows[band]["offR"] - rows[band]["offD"]
            rows[band]["took"] = ", ".join(f"{w} {v / k:.0f}" for w, v in took.most_common(3))
    tot = {"app_rcl_n": len(rcl[app]), "app_rcl_ms": sum(b - a for a, b in rcl[app]) / 1000,
           "oth_rcl_n": sum(len(rcl[o]) for o in others), "oth_rcl_ms": sum(b - a for o in others for a, b in rcl[o]) / 1000,
           "app_faults": len(faults), "p95": p95, "p99": lats[int(0.99 * (n - 1))]}
    return rows, tot


def main():
    d = sys.argv[1]
    tags = sorted(os.path.basename(p)[4:-4] for p in glob.glob(os.path.join(d, "raw-*.csv")))
    print("run | band | n | lat | flt | hit share | rcl | offR | offD | rest | mgmt rcl | mgmt on | offR: who ran")
    print("---|---|---|---|---|---|---|---|---|---|---|---|---")
    for tag in sorted(tags, key=lambda x: (x.rsplit("-", 1)[0], x.rsplit("-", 1)[1])):
        res = analyze(d, tag)
        if res is None:
            continue
        rows, tot = res
        for band in ("slow", "mid"):
            r = rows.get(band)
            if r:
                print(f"{tag} | {band} | {r['n']} | {r['lat']:.0f} | {r['flt']:.1f} | {r['hit']:.2f} | {r['rcl']:.0f} | "
                      f"{r['offR']:.0f} | {r['offD']:.0f} | {r['rest']:.0f} | {r['mgmt_rcl']:.0f} | {r['mgmt_on']:.0f} | {r['took']}")
        print(f"{tag} | total | p95 {tot['p95']:.0f} p99 {tot['p99']:.0f} | app faults {tot['app_faults']} | app reclaim "
              f"{tot['app_rcl_n']} calls {tot['app_rcl_ms']:.1f} ms | other threads {tot['oth_rcl_n']} calls "
              f"{tot['oth_rcl_ms']:.1f} ms")


if __name__ == "__main__":
    main()
