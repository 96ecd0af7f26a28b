#!/usr/bin/env python3
"""Attribute an LC service's slow seconds from a trace_run.sh recording.

Inputs (all on CLOCK_MONOTONIC: trace_run.sh records with `perf record -k mono`):
  PERF_TXT   `perf script -F cpu,comm,pid,tid,time,event,trace` of the recording
  HOST_MM    host_mm_sampler.py's CSV (free page reporting, kdamond CPU, steal per CPU)
  LATENCY    the bench's latency-<level>-<mode>.csv (per-second p99 by due time)
  --anchor   CLOCK_MONOTONIC of the measured phase's start (the bench log's "measured
             N s from CLOCK_MONOTONIC T" line); second i of LATENCY is [T+i, T+i+1)
  --lc-comm  the LC service's command (default redis-server); --gen-comm the load
             generator's threads (default tokio-rt-worker), --gen-pid the bench's pid

For every second whose p99 is above --slow-ms (default 10), and, for comparison, over
the other seconds (median per second), it prints:
  - the LC's and the load generator's time on CPU, runnable (waiting for a CPU after
    a wake-up or a preemption), blocked (D) and sleeping (S), and each one's longest
    single on-CPU slice and longest runnable / D wait;
  - per CPU: the longest time between two trace events while a task ran on it (a busy
    vCPU takes a timer interrupt every tick; one that the host did not run shows no
    events, and need not show as steal when the host thread sleeps, e.g. in its own
    page fault), busy time by command;
  - memcg / direct reclaim calls per command (count, total ms; the LC's own thread
    reclaiming at the limit shows here);
  - free page reporting: KiB reported and reporting interrupts in the second and the
    one before it; kdamond's CPU ms; steal ms per CPU; swap-outs.
Output is a text report; nothing is written.
"""
import argparse, collections, csv, re, statistics

p = argparse.ArgumentParser()
p.add_argument('perf_txt'); p.add_argument('host_mm'); p.add_argument('latency')
p.add_argument('--anchor', type=float, required=True)
p.add_argument('--lc-comm', default='redis-server')
p.add_argument('--gen-comm', default='tokio-rt-worker')
p.add_argument('--gen-pid', type=int, help="the bench's pid (the agent's threads have the same name)")
p.add_argument('--slow-ms', type=float, default=10.0)
a = p.parse_args()

lat = [r for r in csv.DictReader(open(a.latency))]
nsec = len(lat)
T0 = a.anchor
slow = [int(r['second']) for r in lat if float(r['p99_us']) > a.slow_ms * 1000]

rx = re.compile(r'^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$')
sw = re.compile(r'prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)')
wk = re.compile(r'comm=(.*?) pid=(\d+)')

def sec_of(t):
    s = int((t - T0) // 1)
    return s if 0 <= s < nsec else None

def fold(c):
    return re.sub(r'[\d/:]+$', '', c)

# Per thread of interest: list of (start, end, kind) with kind in run/runnable/D/S.
ivals = collections.defaultdict(list)
roles = {}       # tid -> 'lc' | 'gen'
state = {}       # tid -> (kind, since)
cpu_last = {}    # cpu -> last event time
cpu_gap = collections.defaultdict(list)   # cpu -> [(gap, t_end)]
running = {}     # cpu -> (comm, since)
busy = collections.defaultdict(lambda: collections.defaultdict(float))  # (sec,cpu) -> comm -> s
reclaim_open = {}  # (tid, kind) -> t
reclaim = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
reporting = collections.defaultdict(list)

def add_busy(cpu, comm, t0, t1):
    while t0 < t1:
        s = sec_of(t0)
        nxt = T0 + ((t0 - T0) // 1 + 1)
        e = min(t1, nxt)
        if s is not None:
            busy[(s, cpu)][fold(comm)] += e - t0
        t0 = e

def close(tid, t, new_kind):
    if tid in state:
        k, t0 = state[tid]
        ivals[tid].append((t0, t, k))
    state[tid] = (new_kind, t)

# The generator's threads: tids of a.gen_comm in the bench's process (any, if not given).
gen_tids = set()
for line in open(a.perf_txt):
    m = rx.match(line)
    if m and m.group(1) == a.gen_comm and (a.gen_pid is None or int(m.group(2)) == a.gen_pid):
        gen_tids.add(int(m.group(3)))

for line in open(a.perf_txt):
    m = rx.match(line)
    if not m:
        continue
    comm, pid, tid, cpu, t, ev, rest = m.groups()
    cpu = int(cpu); t = float(t); tid = int(tid)
    if cpu in cpu_last and t - cpu_last[cpu] > 0.005:
        # Only while a task ran: an idle vCPU (NOHZ) has no ticks anyway.
        if not running.get(cpu, ('swapper', 0))[0].startswith('swapper'):
            cpu_gap[cpu].append((t - cpu_last[cpu], t))
    cpu_last[cpu] = t
    if ev == 'sched:sched_switch':
        s = sw.search(rest)
        if not s:
            continue
        pc, pp, st, nc, npid = s.groups(); pp = int(pp); npid = int(npid)
        if cpu in running:
            add_busy(cpu, running[cpu][0], running[cpu][1], t)
        running[cpu] = (nc, t)
        for c, tid_ in ((pc, pp), (nc, npid)):
            if tid_ not in roles and tid_ != 0:
                if c == a.lc_comm:
                    roles[tid_] = 'lc'
                elif c == a.gen_comm and tid_ in gen_tids:
                    roles[tid_] = 'gen'
        if pp in roles:
            close(pp, t, 'runnable' if st.startswith('R') else ('D' if 'D' in st else 'S'))
        if npid in roles:
            close(npid, t, 'run')
    elif ev == 'sched:sched_wakeup':
        w = wk.search(rest)
        if w:
            wt = int(w.group(2))
            if wt in roles and wt in state and state[wt][0] in ('S', 'D'):
                close(wt, t, 'runnable')
    elif ev.startswith('vmscan:') and ev.endswith('_begin'):
        reclaim_open[(tid, ev[:-6])] = t
    elif ev.startswith('vmscan:') and ev.endswith('_end'):
        t0 = reclaim_open.pop((tid, ev[:-4]), None)
        if t0 is not None:
            s = sec_of(t0)
            if s is not None:
                r = reclaim[s][f'{fold(comm)} {ev[7:-4]}']
                r[0] += 1; r[1] += t - t0
    elif ev == 'irq:irq_handler_entry' and 'reporting' in rest:
        s = sec_of(t)
        if s is not None:
            reporting[s].append(t)

# Per-second thread figures.
def thread_second(role, s):
    lo, hi = T0 + s, T0 + s + 1
    tot = collections.Counter(); longest = collections.Counter()
    for tid, iv in ivals.items():
        if roles.get(tid) != role:
            continue
        for (t0, t1, k) in iv:
            if t1 < lo or t0 > hi:
                continue
            d = min(t1, hi) - max(t0, lo)
            tot[k] += d
            longest[k] = max(longest[k], t1 - t0)
    return tot, longest

hm = [r for r in csv.DictReader(open(a.host_mm))]
for r in hm:
    for k in r:
        r[k] = float(r[k])
steal_cols = [k for k in (hm[0] if hm else {}) if k.startswith('steal_ms_')]

def host_delta(t0, t1):
    rows = [r for r in hm if t0 - 0.13 <= r['mono_s'] <= t1 + 0.13]
    if len(rows) < 2:
        return {}
    f, l = rows[0], rows[-1]
    d = {k: l[k] - f[k] for k in f if k != 'mono_s'}
    d['span_s'] = l['mono_s'] - f['mono_s']
    # the largest 250 ms reported_kib step in the window
    d['max_step_reported_kib'] = max((b['reported_kib'] - a_['reported_kib'])
                                     for a_, b in zip(rows, rows[1:]))
    return d

def ms(x):
    return f'{x * 1000:.1f}'

def report(s):
    r = lat[s]
    print(f"second {s} (mono {T0 + s:.3f}): p99 {int(r['p99_us']) / 1000:.1f} ms, "
          f"max {int(r['max_us']) / 1000:.1f} ms")
    for role in ('lc', 'gen'):
        tot, lng = thread_second(role, s)
        name = a.lc_comm if role == 'lc' else a.gen_comm
        print(f"  {name}: on CPU {ms(tot['run'])} ms (longest slice {ms(lng['run'])}), "
              f"runnable {ms(tot['runnable'])} (longest {ms(lng['runnable'])}), "
              f"D {ms(tot['D'])} (longest {ms(lng['D'])}), S {ms(tot['S'])} (longest {ms(lng['S'])}) ms")
    for cpu in sorted(cpu_last):
        gaps = [g for (g, te) in cpu_gap[cpu] if T0 + s <= te < T0 + s + 1 + 0.1]
        top = sorted(busy[(s, cpu)].items(), key=lambda x: -x[1])[:5]
        print(f"  cpu{cpu}: longest event gap while busy {ms(max(gaps, default=0))} ms; busy "
              + ', '.join(f'{c} {ms(v)}' for c, v in top))
    rc = reclaim.get(s, {})
    print('  reclaim: ' + (', '.join(f'{k} {n}x {ms(v)} ms' for k, (n, v) in
                                    sorted(rc.items(), key=lambda x: -x[1][1])) or 'none'))
    for lbl, (t0, t1) in (('this s', (T0 + s, T0 + s + 1)), ('prev s', (T0 + s - 1, T0 + s))):
        d = host_delta(t0, t1)
        if d:
            print(f"  host ({lbl}): reported {d['reported_kib'] / 1024:.0f} MiB "
                  f"(max 250 ms step {d['max_step_reported_kib'] / 1024:.0f} MiB), "
                  f"passes {d['passes']:.0f}, kdamond {d['kdamond_cpu_ms']:.0f} ms, "
                  + ', '.join(f"{k[9:]} steal {d[k]:.0f} ms" for k in steal_cols)
                  + f", pswpout {d['pswpout']:.0f}, majflt {d['pgmajfault']:.0f}")
    irqs = reporting.get(s, [])
    print(f"  reporting irqs: {len(irqs)}" + (' at +' + ', +'.join(f'{t - T0 - s:.3f}' for t in irqs[:8]) if irqs else ''))

print(f"anchor {T0:.3f}; {nsec} seconds; slow (p99 > {a.slow_ms} ms): {slow}")
print(f"LC threads {sorted(t for t, r in roles.items() if r == 'lc')}, "
      f"generator threads {sorted(t for t, r in roles.items() if r == 'gen')}")
for s in slow:
    report(s)
# The other seconds, medians.
others = [s for s in range(nsec) if s not in slow]
if others:
    print(f"\nother seconds ({len(others)}), medians per second:")
    for role in ('lc', 'gen'):
        rows = [thread_second(role, s) for s in others]
        print(f"  {a.lc_comm if role == 'lc' else a.gen_comm}: on CPU "
              f"{ms(statistics.median(t['run'] for t, _ in rows))} ms (longest slice max "
              f"{ms(max(l['run'] for _, l in rows))}), runnable "
              f"{ms(statistics.median(t['runnable'] for t, _ in rows))} (longest max "
              f"{ms(max(l['runnable'] for _, l in rows))}), D longest max "
              f"{ms(max(l['D'] for _, l in rows))} ms")
    for cpu in sorted(cpu_last):
        g = [max([gg for (gg, te) in cpu_gap[cpu] if T0 + s <= te < T0 + s + 1], default=0)
             for s in others]
        print(f"  cpu{cpu}: longest event gap while busy median {ms(statistics.median(g))} ms, max {ms(max(g))} ms")
    ds = [host_delta(T0 + s, T0 + s + 1) for s in others]
    ds = [d for d in ds if d]
    if ds:
        print(f"  host: reported MiB/s median {statistics.median(d['reported_kib'] for d in ds) / 1024:.0f} "
              f"(max {max(d['reported_kib'] for d in ds) / 1024:.0f}), kdamond ms/s median "
              f"{statistics.median(d['kdamond_cpu_ms'] for d in ds):.0f} (max {max(d['kdamond_cpu_ms'] for d in ds):.0f}), "
              + ', '.join(f"{k[9:]} steal ms/s max {max(d[k] for d in ds):.0f}" for k in steal_cols))
    print(f"  reporting irqs per second: {[len(reporting.get(s, [])) for s in range(nsec)]}")
    rc = collections.Counter()
    for s in others:
        for k, (n, v) in reclaim.get(s, {}).items():
            rc[k] += n
    print('  reclaim calls over the other seconds: ' + (', '.join(f'{k} {n}x' for k, n in rc.most_common()) or 'none'))
