#!/usr/bin/env python3
"""Attribute an LC service's latency stalls from a scheduler trace.

Input: the text of `perf script -F cpu,comm,pid,time,event,trace` over a recording of
`sched:sched_switch` and the `vmscan:mm_vmscan_memcg_reclaim_*` /
`vmscan:mm_vmscan_direct_reclaim_*` tracepoints (`perf record -a -e ...` during
`memcolo bench reclaim`), and the LC service's pid(s), comma-separated.

Output: the LC's longest off-CPU intervals that it entered preempted (state R: it waited
for a CPU) or blocked (D), each with what ran on every CPU meanwhile (ms per command,
trailing digits folded); the time each command ran on each CPU over the LC's lifetime;
and the memcg / direct reclaim calls per command (count and total time) in that span,
which tells reclaim on the LC's own thread apart from reclaim elsewhere.

    perf record -a -o perf.data -e sched:sched_switch \
        -e vmscan:mm_vmscan_memcg_reclaim_begin -e vmscan:mm_vmscan_memcg_reclaim_end &
    ... memcolo bench reclaim ...
    perf script -i perf.data -F cpu,comm,pid,time,event,trace > perf.txt
    bench/diag/sched_stalls.py perf.txt REDIS_PID
"""
import re, sys, collections
path = sys.argv[1]; pids = set(int(p) for p in sys.argv[2].split(','))
rx = re.compile(r'^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)$')
sw = re.compile(r'prev_comm=(.*?) prev_pid=(\d+) prev_prio=(\d+) prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+) next_prio=(\d+)')
running = {}  # cpu -> (comm, pid, since)
runs = collections.defaultdict(list)  # cpu -> [(start,end,comm,pid)]
off = {}  # pid -> (t, state)
stalls = []
first = last = None
reclaim = []  # (cpu, comm, pid, t, ev)
for line in open(path):
    m = rx.match(line)
    if not m: continue
    comm, pid, cpu, t, ev, rest = m.groups(); cpu = int(cpu); t = float(t); pid = int(pid)
    if ev == 'sched:sched_switch':
        s = sw.search(rest)
        if not s: continue
        pc, pp, _, st, nc, npid, _ = s.groups(); pp = int(pp); npid = int(npid)
        if cpu in running:
            c0, p0, t0 = running[cpu]
            runs[cpu].append((t0, t, c0, p0))
        running[cpu] = (nc, npid, t)
        if pp in pids:
            off[pp] = (t, st, cpu)
            first = first or t
        if npid in pids and npid in off:
            t0, st0, c = off.pop(npid)
            if st0 != 'S' and t - t0 > 0.002:
                stalls.append((t - t0, t0, t, st0, cpu, npid))
        if npid in pids or pp in pids:
            last = t
    else:
        reclaim.append((cpu, comm, pid, t, ev))
print(f"LC pid(s) {sorted(pids)} seen {first:.3f}..{last:.3f} ({last-first:.1f} s)")
stalls.sort(reverse=True)
def who(cpu, a, b):
    share = collections.Counter()
    for (s, e, c, p) in runs[cpu]:
        if e < a or s > b: continue
        share[re.sub(r'[\d/:]+$', '', c)] += min(e, b) - max(s, a)
    return ', '.join(f"{k} {v*1e3:.1f}ms" for k, v in share.most_common(6))
print("longest non-sleep off-CPU intervals of the LC (state R = preempted, D = blocked):")
for d, a, b, st, cpu, p in stalls[:15]:
    print(f"  {d*1e3:7.1f} ms at {a:.3f} state {st} pid {p} back on cpu {cpu}; cpu0: {who(0,a,b)} | cpu1: {who(1,a,b)}")
tot = collections.Counter(); 
for (d,a,b,st,cpu,p) in stalls: tot[st] += d
print("sum of those >2ms by state:", {k: f"{v*1e3:.0f} ms" for k,v in tot.items()})
for cpu in sorted(runs):
    share = collections.Counter()
    for (s, e, c, p) in runs[cpu]:
        if e < first or s > last: continue
        share[re.sub(r'[\d/:]+$', '', c)] += min(e, last) - max(s, first)
    print(f"cpu{cpu} over the LC's life: " + ', '.join(f"{k} {v:.2f}s" for k, v in share.most_common(10)))
rc = collections.Counter(); rt = collections.defaultdict(float); open_ = {}
for cpu, comm, pid, t, ev in reclaim:
    if t < first or t > last: continue
    if ev.endswith('_begin'): open_[(pid)] = t
    elif pid in open_:
        d = t - open_.pop(pid); key = (re.sub(r'[\d/:]+$', '', comm), ev.split(':')[1].replace('_end',''))
        rc[key] += 1; rt[key] += d
print("memcg/direct reclaim during the LC's life:", {f"{k[0]} {k[1]}": f"{rc[k]}x {rt[k]*1e3:.0f} ms" for k in rc})
