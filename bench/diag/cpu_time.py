#!/usr/bin/env python3
"""Where one CPU's time went, from a perf trace: tasks, kernel workers by work function,
hard and soft interrupts, and the IPIs and TLB flushes sent to it.

Input: the text of `perf script -F cpu,comm,pid,time,event,trace` over a recording
(`perf record -a`) of `sched:sched_switch`, `irq:*`, `irq_vectors:*_entry/_exit`,
`workqueue:workqueue_execute_start/_end`, `workqueue:workqueue_queue_work`,
`ipi:ipi_send_cpu`, `ipi:ipi_send_cpumask` and `tlb:tlb_flush`; the CPU to account
(default 0); optionally `--from T --to T` (perf timestamps, seconds) to cut a window.

Output (text): the window's length; ms per class (the processes named with
`--group NAME=PID`, kernel threads, idle, everything else); ms of the CPU per task command (trailing digits
folded: kworker/0:1 -> kworker/0:), idle = swapper; ms per workqueue work function
run on the CPU; ms per hard interrupt handler, softirq vector and x86 vector
(local timer, call function, reschedule, ...), nested time counted once in each
table it appears in (interrupt time is also inside the task it interrupted); the
work queued onto the CPU per (queuing command, function); IPIs sent to the CPU per
(sender command, call site); TLB flushes on the CPU per reason.

    perf script -i perf.data -F cpu,comm,pid,time,event,trace > perf.txt
    bench/diag/cpu_time.py perf.txt --cpu 0 [--from 1234.5 --to 1250.0]

Used to attribute the LC CPU's "foreign" time of `memcolo bench reclaim`
(`lc_cpus_foreign_pct`) to kernel workers and interrupts (bench/reclaim/README.md).
"""
import argparse
import collections
import re

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--cpu", type=int, default=0)
ap.add_argument("--from", dest="t_from", type=float, default=None)
ap.add_argument("--to", dest="t_to", type=float, default=None)
ap.add_argument("--top", type=int, default=15)
ap.add_argument("--group", action="append", default=[], metavar="NAME=PID[,PID]",
                help="name a process (tgid; its threads need the trace's `tid` field, "
                     "`perf script -F cpu,comm,pid,tid,...`) for the class table; repeatable")
a = ap.parse_args()

rx = re.compile(r"^\s*(.+?)\s+(\d+)(?:/(\d+))?\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
sw = re.compile(r"prev_comm=(.*?) prev_pid=(\d+) .*?==> next_comm=(.*?) next_pid=(\d+)")


def fold(c):
    return re.sub(r"\d+$", "", c)


def cpus_of_mask(s):
    out = set()
    m = re.search(r"cpumask=([0-9a-fx,]+)", s)
    if m:
        v = int(m.group(1).replace(",", ""), 16) if not m.group(1).startswith("0x") else int(m.group(1), 16)
        i = 0
        while v:
            if v & 1:
                out.add(i)
            v >>= 1
            i += 1
    return out


task_ms = collections.Counter()
pid_ms = collections.Counter()
tid_ms = collections.Counter()  # tid -> ms
tid_comm = {}
tgid = {}
work_ms = collections.Counter()
hirq_ms = collections.Counter()
sirq_ms = collections.Counter()
vec_ms = collections.Counter()
queued = collections.Counter()
ipis = collections.Counter()
tlb = collections.Counter()
cur = None  # (comm, since)
open_work = {}
open_h = {}
open_s = {}
open_v = {}


def span_begin(opened, key, label, t):
    """A begin event (work item, handler, vector) at t: remember what runs under key."""
    opened[key] = (label, t)


def span_end(opened, key, t, acc):
    """The end event of key at t: add the span since its begin to acc[label], in ms."""
    if key in opened:
        label, t0 = opened.pop(key)
        acc[label] += (t - t0) * 1e3


# begin/end event pairs: (regex of the begin event: key[, label]; regex of the end event: key;
# the spans open now; ms per label)
SPANS = {
    ("workqueue:workqueue_execute_start", "workqueue:workqueue_execute_end"):
        (r"work struct ([0-9a-fx]+): function (\S+)", r"work struct ([0-9a-fx]+)", open_work, work_ms),
    ("irq:irq_handler_entry", "irq:irq_handler_exit"): (r"irq=(\d+) name=(\S+)", r"irq=(\d+)", open_h, hirq_ms),
    ("irq:softirq_entry", "irq:softirq_exit"): (r"action=(\w+)", r"action=(\w+)", open_s, sirq_ms),
}
SPAN_BEGIN = {begin: v for (begin, _), v in SPANS.items()}
SPAN_END = {end: v for (_, end), v in SPANS.items()}


t_first = t_last = None
C = a.cpu
for line in open(a.trace, errors="replace"):
    m = rx.match(line)
    if not m:
        continue
    comm, pid, tid, cpu, t, ev, rest = m.groups()
    if tid is not None:
        tgid[int(tid)] = int(pid)
    cpu = int(cpu)
    t = float(t)
    if a.t_from is not None and t < a.t_from:
        continue
    if a.t_to is not None and t > a.t_to:
        break
    if ev == "ipi:ipi_send_cpu":
        mm = re.search(r"cpu=(\d+) callsite=(\S+)", rest)
        if mm and int(mm.group(1)) == C:
            ipis[(fold(comm), mm.group(2))] += 1
        continue
    if ev == "ipi:ipi_send_cpumask":
        if C in cpus_of_mask(rest):
            cs = re.search(r"callsite=(\S+)", rest)
            ipis[(fold(comm), cs.group(1) if cs else "?")] += 1
        continue
    if ev == "workqueue:workqueue_queue_work":
        mm = re.search(r"function=(\S+) .*?cpu=(\d+)", rest)
        if mm and int(mm.group(2)) == C:
            queued[(fold(comm), mm.group(1))] += 1
        continue
    if cpu != C:
        continue
    if t_first is None:
        t_first = t
    t_last = t
    if ev == "sched:sched_switch":
        s = sw.search(rest)
        if not s:
            continue
        pc, _, nc, npid = s.groups()
        if cur is not None:
            task_ms[cur[0]] += (t - cur[1]) * 1e3
            pid_ms[cur[2]] += (t - cur[1]) * 1e3
            tid_ms[cur[3]] += (t - cur[1]) * 1e3
        cur = (fold(nc), t, f"{nc}:{npid}", int(npid))
        tid_comm[int(npid)] = nc
    elif ev in SPAN_BEGIN:
        rx_begin, _, opened, _ = SPAN_BEGIN[ev]
        mm = re.search(rx_begin, rest)
        if mm:
            span_begin(opened, mm.group(1), mm.group(mm.lastindex), t)
    elif ev in SPAN_END:
        _, rx_end, opened, acc = SPAN_END[ev]
        mm = re.search(rx_end, rest)
        if mm:
            span_end(opened, mm.group(1), t, acc)
    elif ev.startswith("irq_vectors:") and ev.endswith("_entry"):
        span_begin(open_v, ev[12:-6], ev[12:-6], t)
    elif ev.startswith("irq_vectors:") and ev.endswith("_exit"):
        span_end(open_v, ev[12:-5], t, vec_ms)
    elif ev == "tlb:tlb_flush":
        mm = re.search(r"reason:(.*?) ", rest + " ")
        tlb[mm.group(1) if mm else rest] += 1
if cur is not None and t_last is not None:
    task_ms[cur[0]] += (t_last - cur[1]) * 1e3
    pid_ms[cur[2]] += (t_last - cur[1]) * 1e3
    tid_ms[cur[3]] += (t_last - cur[1]) * 1e3

span = ((t_last or 0) - (t_first or 0)) * 1e3
print(f"CPU {C}: {span:.0f} ms traced ({t_first} .. {t_last})")


def table(title, ctr, unit="ms"):
    print(f"\n## {title}")
    tot = sum(ctr.values())
    print(f"total {tot:.1f} {unit}" + (f" ({100 * tot / span:.1f} % of the CPU)" if unit == "ms" and span else ""))
    for k, v in ctr.most_common(a.top):
        pct = f"  {100 * v / span:5.1f} %" if unit == "ms" and span else ""
        print(f"  {v:10.1f} {unit}{pct}  {k}")


table("tasks (comm, digits folded)", task_ms)
table("threads (comm:tid)", pid_ms)
groups = {}
for g in a.group:
    name, pids = g.split("=", 1)
    for p in pids.split(","):
        groups[int(p)] = name
KERNEL = re.compile(r"^(kworker|ksoftirqd|kswapd|kcompactd|migration|rcu_|cpuhp|kthreadd|"
                    r"khugepaged|kdamond|watchdog|idle_inject|irq/|jbd2|oom_reaper)")
classes = collections.Counter()
for tid, ms in tid_ms.items():
    c = tid_comm.get(tid, "?")
    if tid == 0:
        k = "idle"
    elif tgid.get(tid, tid) in groups:
        k = groups[tgid.get(tid, tid)]
    elif KERNEL.match(c):
        k = "kernel threads"
    elif c.startswith("memcolo-reclaim"):
        k = "reclaim workers (by name)"
    else:
        k = "other processes"
    classes[k] += ms
table("classes (--group processes, kernel threads, idle, the rest); interrupt time is "
      "inside these", classes)
table("workqueue work run on the CPU (function)", work_ms)
table("hard interrupts (handler)", hirq_ms)
table("softirqs (vector)", sirq_ms)
table("x86 vectors", vec_ms)
table("work queued onto the CPU (queuing comm, function)", queued, "n")
table("IPIs sent to the CPU (sender comm, call site)", ipis, "n")
table("TLB flushes on the CPU (reason)", tlb, "n")
