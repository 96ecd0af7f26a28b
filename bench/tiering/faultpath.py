#!/usr/bin/python3
"""Where a userfaultfd fault's time goes, from a system-wide perf trace of scheduler
events (``kv.py --trace-s``, or ``faultpath.py PERF_DATA PID`` on any trace recorded
with ``EVENTS``).

For each fault of the store's client thread (the thread of PID with the most user page
faults) that blocks, the trace gives, in ns:

- ``entry``: the fault's entry (``exceptions:page_fault_user``) to the client's switch-out
  (the kernel's fault path up to ``handle_userfault``'s sleep);
- ``fault_wake``: the fault thread's ``sched_waking`` (the client queued the message) to
  the fault thread running (``sched_switch`` in): the wake-up across CPUs or processes;
- ``serve``: the fault thread running to its ``sched_waking`` of the client (reading the
  message, loading the page, ``UFFDIO_COPY``/``CONTINUE`` up to the wake);
- ``client_wake``: that waking to the client running again;
- ``total``: the fault's entry to the client running again.

Also counted: whether each wake-up targeted the waker's own CPU and whether the target
CPU was idle (running the idle task: on a VM, a halted vCPU the host must schedule
again), and faults where the fault thread was already awake (no waking seen: it was
serving another fault or polling).
"""

import json
import re
import statistics
import subprocess
import sys

EVENTS = ["sched:sched_switch", "sched:sched_waking", "exceptions:page_fault_user"]
LINE = re.compile(r"^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+(\S+):\s*(.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")


def events(data):
    p = subprocess.Popen(["perf", "script", "--ns", "-i", data], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        m = LINE.match(line)
        if not m:
            continue
        comm, tid, cpu, s, ns, ev, rest = m.groups()
        t = int(s) * 1_000_000_000 + int(ns.ljust(9, "0")[:9])
        yield comm, int(tid), int(cpu), t, ev, rest
    p.wait()


def switch_fields(rest):
    prev, _, nxt = rest.partition(" ==> ")
    a = dict(FIELD.findall(prev))
    b = dict(FIELD.findall(nxt))
    return int(a.get("prev_pid", -1)), a.get("prev_state", "?"), int(b.get("next_pid", -1)), b.get("next_comm", "")


def tids_of(pid):
    import os
    try:
        return {int(t) for t in os.listdir("/proc/%d/task" % pid)}
    except OSError:
        return set()


def analyse(data, pid, tids=None):
    """The breakdown of the faults of PID's busiest faulting thread in the trace DATA."""
    tids = tids if tids is not None else tids_of(pid)
    evs = list(events(data))
    faults = {}
    for comm, tid, cpu, t, ev, rest in evs:
        if ev.endswith("page_fault_user") and tid in tids and not comm.startswith("tier-"):
            faults[tid] = faults.get(tid, 0) + 1
    if not faults:
        return {"error": "no faults of pid %d in the trace" % pid}
    client = max(faults, key=faults.get)
    curr = {}  # cpu -> pid running
    done = []
    f = None  # the fault in progress
    woken_by_client, client_wakers = {}, {}
    span = [evs[0][3], evs[-1][3]] if evs else [0, 0]
    for comm, tid, cpu, t, ev, rest in evs:
        if ev == "sched:sched_switch":
            prev, state, nxt, ncomm = switch_fields(rest)
            curr[cpu] = nxt
            if f is not None:
                if prev == client and state not in ("R", "R+") and "out" not in f:
                    f["out"] = t
                    f["cpu"] = cpu
                if f.get("ft") is not None and nxt == f["ft"] and "ft_in" not in f and "ft_wake" in f:
                    f["ft_in"] = t
                    f["ft_cpu"] = cpu
                elif nxt == client and "out" in f:
                    f["in"] = t
                    f["in_cpu"] = cpu
                    done.append(f)
                    f = None
        elif ev == "sched:sched_waking":
            d = dict(FIELD.findall(rest))
            wpid, tcpu = int(d.get("pid", -1)), int(d.get("target_cpu", -1))
            if f is None:
                continue
            if tid == client and "out" not in f:
                woken_by_client[d.get("comm", "?")] = woken_by_client.get(d.get("comm", "?"), 0) + 1
            if wpid == client and "out" in f and "c_wake" not in f:
                client_wakers[comm] = client_wakers.get(comm, 0) + 1
            if tid == client and d.get("comm", "").startswith("tier-fault") and "ft_wake" not in f:
                f["ft"] = wpid
                f["ft_wake"] = t
                f["ft_wake_same_cpu"] = tcpu == cpu
                f["ft_wake_idle"] = curr.get(tcpu, -1) == 0
            elif wpid == client and "out" in f and "c_wake" not in f:
                f["c_wake"] = t
                f["server"] = comm
                f["c_wake_same_cpu"] = tcpu == cpu
                f["c_wake_idle"] = curr.get(tcpu, -1) == 0 and tcpu != cpu
                f["c_wake_from_cpu"] = cpu
        elif ev.endswith("page_fault_user") and tid == client:
            if f is None or "out" not in f:
                f = {"t0": t}
    seg = {"entry": [], "fault_wake": [], "serve": [], "client_wake": [], "total": []}
    n_awake = n_ft_same = n_ft_idle = n_c_same = n_c_idle = n_ft_other_cpu = 0
    for f in done:
        seg["entry"].append(f["out"] - f["t0"])
        seg["total"].append(f["in"] - f["t0"])
        if "c_wake" in f:
            seg["client_wake"].append(f["in"] - f["c_wake"])
            n_c_same += f["c_wake_same_cpu"]
            n_c_idle += f["c_wake_idle"]
        if "ft_in" in f:
            seg["fault_wake"].append(f["ft_in"] - f["ft_wake"])
            n_ft_same += f["ft_wake_same_cpu"]
            n_ft_idle += f["ft_wake_idle"]
            n_ft_other_cpu += f["ft_cpu"] != f["cpu"]
            if "c_wake" in f:
                seg["serve"].append(f["c_wake"] - f["ft_in"])
        else:
            n_awake += 1

    def st(v):
        return {"n": len(v), "mean_us": round(statistics.mean(v) / 1e3, 2) if v else None,
                "median_us": round(statistics.median(v) / 1e3, 2) if v else None,
                "p90_us": round(sorted(v)[int(0.9 * (len(v) - 1))] / 1e3, 2) if v else None}

    n = len(done)
    return {"pid": pid, "client_tid": client, "trace_s": round((span[1] - span[0]) / 1e9, 2),
            "blocking_faults": n, "faults_per_s": round(n / max(1e-9, (span[1] - span[0]) / 1e9), 1),
            "segments": {k: st(v) for k, v in seg.items()},
            "fault_thread_already_awake": n_awake,
            "fault_thread_woken_on_clients_cpu": n_ft_same, "fault_thread_woken_on_idle_cpu": n_ft_idle,
            "fault_thread_ran_on_other_cpu": n_ft_other_cpu,
            "client_woken_on_servers_cpu": n_c_same, "client_woken_on_idle_other_cpu": n_c_idle,
            "woken_by_client_in_fault": woken_by_client, "client_wakers": client_wakers}


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit("usage: faultpath.py PERF_DATA PID [TID...]")
    tids = {int(x) for x in sys.argv[3:]} or None
    print(json.dumps(analyse(sys.argv[1], int(sys.argv[2]), tids), indent=1))
