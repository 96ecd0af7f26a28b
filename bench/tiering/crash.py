#!/usr/bin/python3
"""A process's tiered memory across a crash of the agent, with the slow tier on a
memory server: how long the process stops, how long the new agent takes to recover
its region, what it finds, and whether every update survives.

Each run starts ``memcolo memserver`` (on 127.0.0.1, a free port), agent A
(``[tier] slow = "remote:ADDR"``, ``MEMCOLO_LOG=info``) and ``target/release/gups``
with libmemcolo's ``tier.c`` preloaded (``MEMCOLO_TIER=1``): its table (``--footprint-mib``,
1 GiB) is one region handed to the agent, with ``--fast-mib`` (256 MiB) of fast
memory, so that most of its pages live on the memory server. GUPS runs with
``--verify`` (after the run it replays its updates; every word must be back at its
initial value: ``verify_errors`` 0) and a per-second timeline.

Configurations (interleaved, the order rotated each repetition):

- ``crash``    ``--kill-at-s`` into GUPS's measure phase agent A is SIGKILLed;
               ``--restart-delay-s`` later (a supervisor's restart) agent B starts
               with the same configuration, socket and state directory. GUPS's faults
               wait on its userfaultfd meanwhile; libmemcolo hands the region to B
               (``tier_recover``), and B adopts its pages from the memfd, the shadow
               and the memory server.
- ``control``  the same run without the kill.

Recorded per run (``runs.jsonl``, one JSON object per run): GUPS's summary (MUPS,
per-second MUPS, verify_errors); wall-clock times of the kill, of B's start, of B's
"tiering: serving" and of its "tier: region recovered after its agent died" (with its
counts: resident, probation, stored, freed, journal) from the agent's log; the
library's stderr lines with the time each was first seen; the agent's ``tier
status`` once a second; GUPS's updater thread's CPU time every ~20 ms (its stall:
the stretch after the kill without CPU time, blocked on its fault); and derived from GUPS's timeline (``timelines/<run>.csv``):
the seconds with no progress around the kill, the updates lost over the outage in
seconds of the throughput before it, and the throughput in the 10 s before the kill
and the 10 s after the recovery (control runs: after the nominal kill time plus the
restart delay). Logs of every process are in ``logs/``; ``report.md`` and
``plots/timeline.png`` are written from ``runs.jsonl``. A run already in
``runs.jsonl`` is not run again (exit status 3 while runs are left)::

    cargo build --release -p memcolo -p memcolo-tiering-bench
    flock /tmp/memcolo-bench.lock /usr/bin/python3 bench/tiering/crash.py --reps 2
    /usr/bin/python3 bench/tiering/crash.py --report-only

Everything (memory server, agents, GUPS) runs in a scratch memory cgroup
``<own group>/memcolo-tiering-crash-<pid>``, removed after each run, Ctrl-C included.
Only agent A (the agent under test) is killed on purpose; at cleanup GUPS, the agent
and the memory server are stopped (SIGTERM, SIGKILL after 30 s).
"""

import argparse
import calendar
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402

CONFIGS = ("crash", "control")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z\s+(\w+)\s+(.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")
# A second of the timeline with "no progress": under this share of the throughput
# before the kill.
STALL_SHARE = 0.05
WINDOW_S = 10.0


def log_lines(path):
    """The agent log's lines as (wall-clock seconds, level, message and fields),
    ANSI colour codes stripped; lines without a timestamp are skipped."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = LOG_TIME.match(ANSI.sub("", line).strip())
                if not m:
                    continue
                t = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
                t += float("0." + m.group(2)) if m.group(2) else 0.0
                out.append((t, m.group(3), m.group(4)))
    except OSError:
        pass
    return out


def log_event(lines, text):
    """The first line whose message contains ``text``: (time, {field: value}) or None."""
    for t, _, msg in lines:
        if text in msg:
            fields = {}
            for k, v in FIELD.findall(msg):
                try:
                    fields[k] = int(v)
                except ValueError:
                    fields[k] = v
            return t, fields
    return None


def listening(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Tail:
    """New complete lines of a file that another process appends to, each with the
    wall-clock time it was first seen."""

    def __init__(self, path):
        self.path, self.f, self.buf = path, None, ""

    def poll(self):
        if self.f is None:
            try:
                self.f = open(self.path, errors="replace")
            except OSError:
                return []
        self.buf += self.f.read()
        now = time.time()
        *lines, self.buf = self.buf.split("\n")
        return [(now, line) for line in lines]

    def close(self):
        if self.f:
            self.f.close()


def stop(p, sig=signal.SIGTERM, wait_s=30):
    """Stops our child ``p``: ``sig``, then SIGKILL if it has not exited in ``wait_s``."""
    if p is None or p.poll() is not None:
        return
    try:
        p.send_signal(sig)
        p.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    except OSError:
        pass


def start_agent(inc, memcolo, cfg, sock, state, log):
    return subprocess.Popen(inc + [memcolo, "agent", "--config", cfg, "--socket", sock, "--state-dir", state],
                            env=dict(os.environ, MEMCOLO_LOG="info"), stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"))


def write_secret(path):
    """A shared secret for the memory server and the agents: 32 random bytes, mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    return path


def start_memserver(inc, memcolo, capacity_mib, secret, log):
    """``memcolo memserver`` on a free port: (process, address)."""
    p = subprocess.Popen(inc + [memcolo, "memserver", "--listen", "127.0.0.1:0", "--capacity-mib", str(capacity_mib),
                                "--secret-file", secret],
                         env=dict(os.environ, MEMCOLO_LOG="warn"), stdout=subprocess.PIPE,
                         stderr=open(log, "w"), text=True)
    got = []
    th = threading.Thread(target=lambda: got.append(p.stdout.readline()), daemon=True)
    th.start()
    th.join(20)
    line = got[0].strip() if got else ""
    if not line.startswith("listening on "):
        stop(p)
        raise RuntimeError("memserver said %r" % line)
    return p, line[len("listening on "):]


def status_sample(memcolo, sock, pid):
    """The agent's view of process ``pid`` (None while no agent answers or it has no
    region of ``pid``)."""
    o = subprocess.run([memcolo, "tier", "status", "--json", "--socket", sock], capture_output=True, text=True)
    if o.returncode != 0:
        return None
    try:
        st = json.loads(o.stdout)
    except ValueError:
        return None
    for p in st.get("processes", []):
        if p["pid"] != pid:
            continue
        row = {k: p[k] for k in ("a_miss", "alloc_bytes", "fast_bytes", "slow_bytes")}
        for k in ("resident_pages", "stored_pages", "probation_pages", "slow_faults", "adopted_pages",
                  "recovered_stored_pages", "evictions"):
            row[k] = sum(r.get(k, 0) for r in p["regions"])
        row["durable"] = all(r.get("durable") for r in p["regions"])
        return row
    return None


def one(config, rep, args, bins, cg):
    memcolo, gups, lib = bins
    out = args.out
    name = "%s-r%d" % (config, rep)
    tmp = tempfile.mkdtemp(prefix="memcolo-crash-")
    inc = benchlib.in_cgroup(cg, [])
    logs = os.path.join(out, "logs")
    tl_path = os.path.join(out, "timelines", name + ".csv")
    sock = os.path.join(tmp, "agent.sock")
    tier_sock = os.path.join(tmp, "tier.sock")
    state = os.path.join(tmp, "state")
    cfg = os.path.join(tmp, "agent.toml")
    server = agent = gups_p = None
    samples = []
    stop_sampler = threading.Event()
    sampler = None
    ev = {}
    lib_lines = []
    rec = {"run": name, "config": config, "rep": rep, "library_retry": library_retry()}
    try:
        secret = write_secret(os.path.join(tmp, "memserver.secret"))
        server, addr = start_memserver(inc, memcolo, args.server_capacity_mib, secret,
                                       os.path.join(logs, name + "-memserver.err"))
        with open(cfg, "w") as f:
            f.write('metrics_addr = "off"\n[tier]\nenabled = true\nfast_bytes = %d\nmigration_cap_bytes = %d\n'
                    'slow = "remote:%s"\nslow_secret_file = "%s"\n' % (args.fast_mib << 20, args.cap_mib << 20, addr, secret))
        agent = start_agent(inc, memcolo, cfg, sock, state, os.path.join(logs, name + "-agentA.log"))
        ev["agent_a_start"] = time.time()
        deadline = time.monotonic() + 30
        while not listening(tier_sock):
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("agent A did not listen on %s (exit %s)" % (tier_sock, agent.poll()))
            time.sleep(0.05)
        env = dict(os.environ, MEMCOLO_SOCKET=sock, MEMCOLO_TIER="1", MEMCOLO_TIER_THRESHOLD=args.threshold,
                   MEMCOLO_T_MISS=str(args.t_miss), LD_PRELOAD=lib)
        gargs = ["--footprint-mib", str(args.footprint_mib), "--threads", "1", "--warmup-s", str(args.warmup_s),
                 "--measure-s", str(args.measure_s), "--seed", str(rep + 1), "--verify", "--timeline", tl_path,
                 "--label", config]
        rec["gups_args"] = gargs
        gups_out = os.path.join(logs, name + "-gups.json")
        gups_err = os.path.join(logs, name + "-gups.err")
        if os.path.exists(tl_path):
            os.unlink(tl_path)  # (a Tail must not read an older run's rows)
        ev["gups_start"] = time.time()
        gups_p = subprocess.Popen(inc + [gups] + gargs, env=env, stdout=open(gups_out, "w"),
                                  stderr=open(gups_err, "w"))

        def sample():
            while not stop_sampler.wait(1.0):
                row = status_sample(memcolo, sock, gups_p.pid)
                samples.append(dict(row or {}, t=round(time.time() - ev["gups_start"], 2), up=row is not None))

        sampler = threading.Thread(target=sample)
        sampler.start()
        tl, err = Tail(tl_path), Tail(gups_err)
        # The updater thread's CPU time (schedstat, ns) every loop (~20 ms): a stretch
        # without progress is a stall, timed far finer than the timeline's rows.
        upd, cpu = None, []
        offset = None  # wall clock = gups's clock + offset (the least seen lag of a row)
        kill_at = restart_at = None
        limit = time.monotonic() + 3 * (args.warmup_s + args.measure_s) + args.footprint_mib / 4 + 300
        while True:
            for seen, line in tl.poll():
                parts = line.split(",")
                if parts[0] == "t_s" or len(parts) < 3:
                    continue
                t_s = float(parts[0])
                offset = seen - t_s if offset is None else min(offset, seen - t_s)
                if kill_at is None:
                    # The first row closes the first second of the warm-up.
                    ev["measure_start_nominal"] = offset + t_s - 1.0 + args.warmup_s
                    kill_at = ev["measure_start_nominal"] + args.kill_at_s
            for seen, line in err.poll():
                if line.startswith("memcolo:"):
                    lib_lines.append({"t": seen, "line": line})
            if upd is None:
                upd = updater_schedstat(gups_p.pid)
            if upd:
                try:
                    with open(upd) as f:
                        cpu.append((time.time(), int(f.read().split()[0])))
                except (OSError, ValueError, IndexError):
                    upd = False  # the updater has exited (verification runs on the main thread)
            now = time.time()
            if kill_at is not None and "kill" not in ev and now >= kill_at:
                ev["kill"] = now
                if config == "crash":
                    agent.send_signal(signal.SIGKILL)  # the agent under test
                    agent.wait()
                    ev["agent_a_exit"] = time.time()
                    restart_at = ev["kill"] + args.restart_delay_s
            if restart_at is not None and now >= restart_at and "agent_b_start" not in ev:
                agent = start_agent(inc, memcolo, cfg, sock, state, os.path.join(logs, name + "-agentB.log"))
                ev["agent_b_start"] = time.time()
            if "agent_b_start" in ev and "agent_b_listening" not in ev and listening(tier_sock):
                ev["agent_b_listening"] = time.time()
            if gups_p.poll() is not None:
                for seen, line in err.poll():
                    if line.startswith("memcolo:"):
                        lib_lines.append({"t": seen, "line": line})
                break
            if time.monotonic() > limit:
                rec["timed_out"] = True
                gups_p.kill()  # our child
                gups_p.wait()
                break
            time.sleep(0.02)
        tl.close()
        err.close()
        ev["gups_exit"] = time.time()
        rec["rc"] = gups_p.returncode
        rec["timeline_offset_s"] = offset
        rec["updater_pauses"] = pauses(cpu)
        k = ev.get("kill")
        if k is not None:
            rec["updater_cpu_near_kill"] = [(round(t - k, 3), c) for t, c in cpu if k - 1 <= t <= k + 6]
        try:
            rec.update(json.loads(open(gups_out).read().strip().splitlines()[-1]))
        except (OSError, ValueError, IndexError):
            pass
        # The agent's view once the region is back (or now, for a control run).
        rec["status_after"] = next((s for s in samples if s.get("up") and ev.get("kill") and
                                    s["t"] + ev["gups_start"] > ev["kill"] + args.restart_delay_s), None)
    finally:
        stop_sampler.set()
        if sampler:
            sampler.join()
        if gups_p is not None and gups_p.poll() is None:
            gups_p.kill()  # our child, left running by an error
            gups_p.wait()
        if agent is not None and agent.poll() is None:
            # The workload has exited: let the agent see its connection close and drop
            # the region, then stop it.
            for _ in range(50):
                if status_sample(memcolo, sock, gups_p.pid if gups_p else -1) is None:
                    break
                time.sleep(0.1)
            stop(agent)
        stop(server)
        shutil.rmtree(tmp, ignore_errors=True)
    rec["events"] = ev
    rec["lib_lines"] = lib_lines
    rec["samples"] = samples
    a_log = log_lines(os.path.join(logs, name + "-agentA.log"))
    b_log = log_lines(os.path.join(logs, name + "-agentB.log")) if config == "crash" else []
    for key, lines, text in (("agent_a_serving", a_log, "tiering: serving"),
                             ("agent_b_serving", b_log, "tiering: serving"),
                             ("recovered_log", b_log, "tier: region recovered after its agent died")):
        e = log_event(lines, text)
        if e:
            ev[key] = e[0]
            if key == "recovered_log":
                rec["recovered"] = e[1]
    rec["agent_errors"] = [m for _, lvl, m in a_log + b_log if lvl in ("ERROR", "WARN")][:20]
    for line in lib_lines:
        if "recovered by the new agent" in line["line"] and "recovered_lib" not in ev:
            ev["recovered_lib"] = line["t"]
        if "agent is gone" in line["line"] and "gone_lib" not in ev:
            ev["gone_lib"] = line["t"]
    derive(rec, args)
    rec["loadavg"] = open("/proc/loadavg").read().split()[:3]
    return rec


def updater_schedstat(pid):
    """The schedstat path of gups's updater thread (``gups-0``) of process ``pid``,
    None while it has not started."""
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().strip() == "gups-0":
                    return "/proc/%d/task/%s/schedstat" % (pid, tid)
    except OSError:
        pass
    return None


def pauses(cpu, least_s=0.1):
    """Stretches of at least ``least_s`` in which the updater's CPU time did not move:
    [(first sample with the value, first sample after it with another)], wall clock.
    Each is short of the true pause by less than a sampling interval."""
    out, i = [], 0
    while i < len(cpu):
        j = i
        while j + 1 < len(cpu) and cpu[j + 1][1] == cpu[i][1]:
            j += 1
        if j + 1 < len(cpu) and cpu[j + 1][0] - cpu[i][0] >= least_s:
            out.append((cpu[i][0], cpu[j + 1][0]))
        i = j + 1
    return out


def read_timeline(path):
    """[(t0, t1, phase, mups)]: each row's interval on gups's clock."""
    rows, last = [], None
    try:
        with open(path) as f:
            for line in f:
                p = line.strip().split(",")
                if p[0] == "t_s" or len(p) < 3:
                    continue
                t = float(p[0])
                if last is not None:
                    rows.append((last, t, p[1], float(p[2])))
                else:
                    rows.append((t - 1.0, t, p[1], float(p[2])))
                last = t
    except OSError:
        pass
    return rows


def mean_in(rows, a, b):
    """Mean MUPS of the rows lying wholly in [a, b] (time-weighted), or None."""
    sel = [(t1 - t0, m) for t0, t1, _, m in rows if t0 >= a - 1e-6 and t1 <= b + 1e-6 and t1 > t0]
    w = sum(d for d, _ in sel)
    return sum(d * m for d, m in sel) / w if w > 0 else None


def derive(rec, args):
    """The run's outage figures, from its events (wall clock) and its timeline."""
    ev = rec["events"]
    rows = read_timeline(os.path.join(args.out, "timelines", rec["run"] + ".csv"))
    off = rec.get("timeline_offset_s")
    d = {}
    warm = [r for r in rows if r[2] == "warmup"]
    if warm:
        d["measure_start_g"] = warm[-1][1]
    if off is None or "kill" not in ev or not rows:
        rec["derived"] = d
        return
    kill_g = ev["kill"] - off
    d["kill_g"] = kill_g
    if rec["config"] == "crash":
        rec_wall = ev.get("recovered_lib") or ev.get("recovered_log")
    else:
        rec_wall = ev["kill"] + args.restart_delay_s
    before = mean_in(rows, kill_g - WINDOW_S, kill_g)
    d["mups_before"] = before
    if rec_wall is not None:
        rec_g = rec_wall - off
        d["recovered_g"] = rec_g
        d["mups_after"] = mean_in(rows, rec_g, rec_g + WINDOW_S + 1.0)
        end_g = max(t1 for _, t1, ph, _ in rows if ph == "measure") if any(r[2] == "measure" for r in rows) else None
        if end_g:
            d["mups_after_to_end"] = mean_in(rows, rec_g, end_g)
        if before:
            # Seconds with no progress: the run of near-zero rows from the kill on.
            stall = 0.0
            for t0, t1, _, m in rows:
                if t1 <= kill_g:
                    continue
                if m < STALL_SHARE * before:
                    stall += t1 - t0
                elif stall > 0 or t0 > rec_g + 1:
                    break
            d["stall_rows_s"] = stall
            # Updates lost from the kill to a second after the recovery, in seconds
            # of the throughput before the kill.
            lost = 0.0
            for t0, t1, _, m in rows:
                a, b = max(t0, kill_g), min(t1, rec_g + 1.0)
                if b > a:
                    lost += (b - a) * max(0.0, 1.0 - m / before)
            d["lost_s"] = lost
    # The updater's pauses (no CPU time for >= 0.1 s): the one the crash caused,
    # and the longest other one in the measure phase (control runs: all of them).
    ps = rec.get("updater_pauses") or []
    end_wall = rec_wall + 1.0 if rec_wall is not None else ev["kill"] + args.restart_delay_s
    crash_ps = [p for p in ps if p[1] > ev["kill"] and p[0] < end_wall] if rec["config"] == "crash" else []
    if crash_ps:
        p = max(crash_ps, key=lambda p: p[1] - p[0])
        d["updater_stall_s"] = p[1] - p[0]
        d["updater_stall_from_kill_s"] = [p[0] - ev["kill"], p[1] - ev["kill"]]
    m0 = (d["measure_start_g"] + off) if "measure_start_g" in d else None
    other = [p[1] - p[0] for p in ps if p not in crash_ps and (m0 is None or p[0] >= m0)]
    d["updater_other_pauses"] = len(other)
    d["updater_longest_other_pause_s"] = max(other) if other else 0.0
    if rec["config"] == "crash":
        for k, a, b in (("outage_s", "kill", "recovered_lib"),
                        ("b_listening_to_recovered_log_s", "agent_b_listening", "recovered_log"),
                        ("outage_log_s", "kill", "recovered_log"),
                        ("b_start_to_serving_s", "agent_b_start", "agent_b_serving"),
                        ("b_start_to_listening_s", "agent_b_start", "agent_b_listening"),
                        ("b_start_to_recovered_log_s", "agent_b_start", "recovered_log"),
                        ("b_start_to_recovered_lib_s", "agent_b_start", "recovered_lib"),
                        ("serving_to_recovered_log_s", "agent_b_serving", "recovered_log"),
                        ("kill_to_gone_lib_s", "kill", "gone_lib")):
            if ev.get(a) is not None and ev.get(b) is not None:
                d[k] = ev[b] - ev[a]
        # libmemcolo tries tier_recover after it finds the connection gone (about when
        # agent A exited) every 50 ms, or (before e.g. RESULTS.md earlier/crash-50ms) at 0, 0.1,
        # 0.3, 0.7, 1.5, 3.1 s, then every 2 s: the try expected to find agent B
        # listening.
        if ev.get("agent_a_exit") is not None and ev.get("agent_b_listening") is not None:
            fixed = rec.get("library_retry") == "every-50ms"
            t, delay, need = 0.0, 0.05 if fixed else 0.1, ev["agent_b_listening"] - ev["agent_a_exit"]
            while t < need:
                t += delay
                delay = delay if fixed else min(2 * delay, 2.0)
            d["library_retry_after_exit_s"] = t
            if ev.get("recovered_log") is not None:
                d["recovered_log_after_retry_s"] = ev["recovered_log"] - ev["agent_a_exit"] - t
    rec["derived"] = d


def library_retry():
    """libmemcolo's schedule of tier_recover tries, read from the tier.c the runs preload."""
    with open(os.path.join(ROOT, "alloc", "src", "tier.c")) as f:
        return "every-50ms" if "struct timespec ts = {0, 50 * 1000000L};" in f.read() else "backoff"


# ----------------------------------------------------------------------- report

def fmt(v, f="%.2f"):
    return "—" if v is None else f % v


def mean(rs, get):
    vals = [get(r) for r in rs]
    vals = [v for v in vals if v is not None]
    return statistics.mean(vals) if vals else None


def report(out):
    path = os.path.join(out, "runs.jsonl")
    runs = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    if not runs:
        print("no runs in %s" % path)
        return
    setup = runs[-1].get("setup", {})
    D = lambda k: (lambda r: r.get("derived", {}).get(k))  # noqa: E731
    R = lambda k: (lambda r: (r.get("recovered") or {}).get(k))  # noqa: E731
    S = lambda k: (lambda r: (r.get("status_after") or {}).get(k))  # noqa: E731
    cols = [
        ("rc", lambda r: r.get("rc"), "%s"),
        ("verify errors", lambda r: r.get("verify_errors"), "%s"),
        ("MUPS (measure)", lambda r: r.get("mups"), "%.3f"),
        ("MUPS 10 s before", D("mups_before"), "%.3f"),
        ("MUPS 10 s after", D("mups_after"), "%.3f"),
        ("MUPS after → end", D("mups_after_to_end"), "%.3f"),
        ("no-progress s (rows)", D("stall_rows_s"), "%.2f"),
        ("lost s", D("lost_s"), "%.2f"),
        ("updater stall s", D("updater_stall_s"), "%.3f"),
        ("longest other pause s", D("updater_longest_other_pause_s"), "%.3f"),
        ("kill → recovered s", D("outage_s"), "%.3f"),
        ("B start → serving s", D("b_start_to_serving_s"), "%.3f"),
        ("B start → recovered (log) s", D("b_start_to_recovered_log_s"), "%.3f"),
        ("B start → recovered (app) s", D("b_start_to_recovered_lib_s"), "%.3f"),
        ("library retry (expected) s", D("library_retry_after_exit_s"), "%.2f"),
        ("retry → recovered (log) s", D("recovered_log_after_retry_s"), "%.3f"),
        ("resident", R("resident"), "%s"),
        ("probation", R("probation"), "%s"),
        ("stored", R("stored"), "%s"),
        ("freed", R("freed"), "%s"),
        ("journal", R("journal"), "%s"),
        ("adopted (status)", S("adopted_pages"), "%s"),
        ("recovered stored (status)", S("recovered_stored_pages"), "%s"),
    ]
    lines = ["# A process's tiered memory across an agent crash (slow tier: memory server)", "",
             "GUPS (`--footprint-mib %s`, one thread, `--verify`) with libmemcolo's `tier.c` preloaded "
             "(`MEMCOLO_TIER=1`, threshold %s, t_miss %s): its table is one region of the agent, "
             "which has %s MiB of fast memory (`migration_cap_bytes` %s MiB) and a `memcolo memserver` "
             "on 127.0.0.1 as its slow tier. Warm-up %s s, measure %s s; `crash`: agent A SIGKILLed %s s into "
             "the measure phase, agent B (same configuration, socket and state directory) started %s s later; "
             "`control`: no kill. Pages are 4 KiB." % (
                 setup.get("footprint_mib"), setup.get("threshold"), setup.get("t_miss"), setup.get("fast_mib"),
                 setup.get("cap_mib"), setup.get("warmup_s"), setup.get("measure_s"), setup.get("kill_at_s"),
                 setup.get("restart_delay_s")), "",
             "Reproduce:", "", "```sh", "cargo build --release -p memcolo -p memcolo-tiering-bench",
             setup.get("command", "?"), "/usr/bin/python3 bench/tiering/crash.py --report-only --out %s" %
             (os.path.relpath(out, ROOT) if out.startswith(ROOT + os.sep) else out), "```", "",
             "Columns: *MUPS 10 s before* the kill and *10 s after* the recovery (the library's \"recovered by "
             "the new agent\" line; control runs: the nominal kill time and that time plus the restart delay); "
             "*MUPS after → end* from the recovery to the end of the measure phase; *no-progress s*: the "
             "timeline's seconds (rows of ~1 s) under %d %% of the throughput before the kill, from the kill on; "
             "*lost s*: the updates missing from the kill to 1 s after the recovery, in seconds of the throughput "
             "before the kill (GUPS counts updates in batches of 4096, so at a few thousand updates a second "
             "these two are coarse); *updater stall*: the longest stretch after the kill in which GUPS's updater "
             "thread got no CPU time (its `schedstat`, read every ~20 ms: blocked on its fault), and *longest "
             "other pause* the longest other stretch of at least 0.1 s in the measure phase; *kill → recovered*: the kill to the library's line; *B start → serving / recovered*: "
             "agent B's log lines (\"tiering: serving\", \"tier: region recovered after its agent died\", whose "
             "page counts follow) and the library's line. *library retry (expected)*: libmemcolo tries "
             "tier_recover every 50 ms after it finds its connection gone (runs recorded with `library_retry` "
             "`backoff`, before that change: 0, 0.1, 0.3, 0.7, 1.5, 3.1 s, then every 2 s); the "
             "first try after agent B listened, in s after agent A exited, and *retry → recovered (log)* the time "
             "from that try to B's log line (B's own work, estimated). *adopted / recovered stored (status)*: `memcolo tier "
             "status` of agent B, first sample after the restart." % int(100 * STALL_SHARE), ""]
    lines += ["| run | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for r in runs:
        lines.append("| %s | " % r["run"] + " | ".join(fmt(g(r), f) for _, g, f in cols) + " |")
    lines += ["", "Means per configuration:", "",
              "| configuration | runs | " + " | ".join(c[0] for c in cols[1:]) + " |",
              "|---|---|" + "---|" * (len(cols) - 1)]
    by = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    for c in CONFIGS:
        rs = by.get(c, [])
        if not rs:
            continue
        cells = []
        for title, g, f in cols[1:]:
            if title == "verify errors":
                vals = [g(r) for r in rs if g(r) is not None]
                cells.append(str(sum(vals)) + " (total)" if vals else "—")
            else:
                cells.append(fmt(mean(rs, g), "%.0f" if f == "%s" else f))
        lines.append("| %s | %d | " % (c, len(rs)) + " | ".join(cells) + " |")
    if by.get("crash") and by.get("control"):
        pairs = []
        for r in by["crash"]:
            c = next((x for x in by["control"] if x["rep"] == r["rep"]), None)
            if c and r.get("mups") and c.get("mups"):
                pairs.append((r["rep"], r["mups"] / c["mups"]))
        if pairs:
            lines += ["", "MUPS over the whole measure phase, crash / control (paired by repetition): " +
                      ", ".join("r%d %.3f" % p for p in pairs) + "; mean %.3f." % statistics.mean(p[1] for p in pairs)]
    ve = [r.get("verify_errors") for r in runs]
    bad = [r["run"] for r in runs if r.get("rc") != 0 or r.get("verify_errors") != 0]
    lines += ["", "verify_errors: %s; runs failed or with errors: %s." % (
        ", ".join("%s %s" % (r["run"], v) for r, v in zip(runs, ve)), ", ".join(bad) or "none")]
    lines += ["", "Library lines (seconds after the kill) and agent B's events:", ""]
    for r in by.get("crash", []):
        ev = r["events"]
        k = ev.get("kill")
        if k is None:
            continue
        parts = ["%+.3f s %s" % (x["t"] - k, x["line"]) for x in r.get("lib_lines", [])]
        for key in ("agent_a_exit", "agent_b_start", "agent_b_listening", "agent_b_serving", "recovered_log"):
            if ev.get(key) is not None:
                parts.append("%+.3f s %s" % (ev[key] - k, key))
        parts.sort(key=lambda s: float(s.split(" ")[0]))
        lines.append("- `%s`: " % r["run"] + "; ".join("`%s`" % p for p in parts))
        if r.get("agent_errors"):
            lines.append("  agent warnings/errors: " + "; ".join("`%s`" % m[:200] for m in r["agent_errors"]))
    lines += ["", "![per-second MUPS of a crash run and a control run; below, the crash run's updater CPU time around the kill](plots/timeline.png)", ""]
    plot(out, by)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    benchlib.publish(HERE, "crash", out, command="/usr/bin/python3 bench/tiering/crash.py --report-only")


def plot(out, by):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots (use /usr/bin/python3)")
        return
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 7), gridspec_kw={"height_ratios": [3, 2]})
    for c, color in (("control", "tab:blue"), ("crash", "tab:red")):
        rs = [r for r in by.get(c, []) if r.get("derived", {}).get("measure_start_g") is not None]
        if not rs:
            continue
        r = rs[0]
        d = r["derived"]
        m0 = d["measure_start_g"]
        rows = read_timeline(os.path.join(out, "timelines", r["run"] + ".csv"))
        xs, ys = [], []
        for t0, t1, _, m in rows:
            xs += [t0 - m0, t1 - m0]
            ys += [m, m]
        ax.plot(xs, ys, color=color, lw=1.2, label=r["run"])
        if c == "crash" and d.get("kill_g") is not None:
            off = r["timeline_offset_s"]
            ev = r["events"]
            ax.axvline(d["kill_g"] - m0, color="k", ls="--", lw=1, label="agent A killed")
            if ev.get("agent_b_start"):
                ax.axvline(ev["agent_b_start"] - off - m0, color="tab:orange", ls=":", lw=1.2, label="agent B started")
            if d.get("recovered_g") is not None:
                ax.axvline(d["recovered_g"] - m0, color="tab:green", ls="-.", lw=1.2, label="region recovered")
            near = r.get("updater_cpu_near_kill") or []
            if near:
                c0 = near[0][1]
                ax2.step([t for t, _ in near], [(c - c0) / 1e6 for _, c in near], where="post", color=color,
                         label="%s: updater CPU time" % r["run"])
                for key, ls, col, lab in (("agent_a_exit", "--", "k", "agent A exited"),
                                          ("agent_b_start", ":", "tab:orange", "agent B started"),
                                          ("agent_b_listening", ":", "tab:purple", "agent B listening"),
                                          ("recovered_log", "-.", "tab:green", "B's recovery log line"),
                                          ("recovered_lib", "-", "tab:green", "library: recovered")):
                    if ev.get(key) is not None:
                        ax2.axvline(ev[key] - ev["kill"], color=col, ls=ls, lw=1, label=lab)
    ax.axvline(0, color="grey", lw=0.6)
    ax.set_xlabel("s since the measure phase began (warm-up before 0)")
    ax.set_ylabel("GUPS, million updates/s (per second)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax2.set_xlabel("s since agent A was killed")
    ax2.set_ylabel("updater CPU time, ms")
    ax2.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plots", "timeline.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "out", "tiering", "crash"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--footprint-mib", type=int, default=1024, help="GUPS's table: the region")
    ap.add_argument("--fast-mib", type=int, default=256, help="the agent's fast memory (tier.fast_bytes)")
    ap.add_argument("--cap-mib", type=int, default=64, help="tier.migration_cap_bytes, MiB per epoch")
    ap.add_argument("--t-miss", type=float, default=0.1, help="GUPS's MEMCOLO_T_MISS")
    ap.add_argument("--threshold", default="64m", help="MEMCOLO_TIER_THRESHOLD")
    ap.add_argument("--server-capacity-mib", type=int, default=2048, help="memserver --capacity-mib")
    ap.add_argument("--cg-limit-mib", type=int, default=4096, help="the scratch cgroup's limit (a safety net)")
    ap.add_argument("--warmup-s", type=float, default=15)
    ap.add_argument("--measure-s", type=float, default=40)
    ap.add_argument("--kill-at-s", type=float, default=15, help="seconds into the measure phase")
    ap.add_argument("--restart-delay-s", type=float, default=1.0, help="from the kill to agent B's start")
    ap.add_argument("--budget-s", type=float, default=900, help="start no run after this many seconds")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    out = args.out = os.path.abspath(args.out)
    if args.report_only:
        report(out)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (cgroups, userfaultfd)")
    if args.warmup_s < 2 or args.kill_at_s < WINDOW_S or args.kill_at_s >= args.measure_s:
        ap.error("want --warmup-s >= 2 and %g <= --kill-at-s < --measure-s" % WINDOW_S)
    rel = os.path.join(ROOT, "target", "release")
    for b in ("memcolo", "gups"):
        if not os.access(os.path.join(rel, b), os.X_OK):
            raise SystemExit("%s missing: cargo build --release -p memcolo -p memcolo-tiering-bench" % b)
    for d in ("timelines", "logs"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    benchlib.record_machine(out, " ".join(sys.argv))
    tmp = tempfile.mkdtemp(prefix="memcolo-crashbin-")
    lib = os.path.join(tmp, "libtier.so")
    subprocess.run(["cc", "-std=gnu11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread",
                    os.path.join(ROOT, "alloc", "src", "tier.c"), "-o", lib], check=True)
    # Copies: the target directory is shared, and a rebuild must not swap a binary out
    # from under a run.
    bins = []
    for b in ("memcolo", "gups"):
        shutil.copy2(os.path.join(rel, b), os.path.join(tmp, b))
        bins.append(os.path.join(tmp, b))
    bins = tuple(bins) + (lib,)
    log = benchlib.RunLog(out)
    cg = os.path.join(benchlib.CG_ROOT + benchlib.own_memory_cgroup(), "memcolo-tiering-crash-%d" % os.getpid())
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    argv = [a for a in sys.argv[1:]]
    setup = {k: getattr(args, k) for k in ("footprint_mib", "fast_mib", "cap_mib", "t_miss", "threshold",
                                           "server_capacity_mib", "warmup_s", "measure_s", "kill_at_s",
                                           "restart_delay_s")}
    setup["command"] = "flock /tmp/memcolo-bench.lock /usr/bin/python3 bench/tiering/crash.py " + " ".join(
        shlex.quote(a) for a in argv)

    def cleanup(*_):
        benchlib.cg_remove(cg)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(130)

    signal.signal(signal.SIGTERM, cleanup)
    signal.signal(signal.SIGINT, cleanup)
    budget = benchlib.Budget(args.budget_s)
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            ap.error("unknown configuration %r" % c)
    runs, left = benchlib.pending(configs, args.reps, log, budget)
    try:
        for c, rep, rid in runs:
            os.makedirs(cg, exist_ok=True)
            benchlib.cg_write(cg, "memory.limit_in_bytes", args.cg_limit_mib << 20)
            print("run", rid, flush=True)
            t0 = time.monotonic()
            try:
                rec = one(c, rep, args, bins, cg)
            except RuntimeError as e:
                rec = {"run": rid, "config": c, "rep": rep, "rc": None, "error": str(e), "events": {}}
            rec.update(setup=setup, commit=commit, wall_s=time.monotonic() - t0)
            log.append(rec)
            d = rec.get("derived", {})
            print("  -> rc %s, %s MUPS, verify_errors %s, outage %s s, stall rows %s s" % (
                rec.get("rc"), fmt(rec.get("mups"), "%.3f"), rec.get("verify_errors"),
                fmt(d.get("outage_s")), fmt(d.get("stall_rows_s"))), flush=True)
            benchlib.cg_remove(cg)
    finally:
        benchlib.cg_remove(cg)
        shutil.rmtree(tmp, ignore_errors=True)
    report(out)
    if left():
        print("%d runs left: run again" % left())
        return 3
    print("all runs done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
