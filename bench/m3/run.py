#!/usr/bin/python3
"""M3 evaluation (EuroSys'21 §7) on a scratch cgroup "node": three elastic jobs,
memcolo against Default settings and against the best static partition (Oracle).

Jobs (bench/m3/jobs, each a fixed amount of work whose speed depends on its memory):

- ``C`` gocache   Go, memcolo's elastic slab cache (sdk/go/cache); M3's Go-Cache
                  benchmark: preload 85 % of the key space, uniform random gets, 1 ms
                  backend lookup on a miss.            Setting: cache size (MiB).
- ``J`` iterjob   Java (G1), an iterative Spark-like job over a block cache; a missing
                  block is read again (modelled read).  Setting: -Xmx (MiB); the cache
                  gets the heap less a tuned headroom.
- ``P`` spill     Python, a shuffle-style job that spills what does not fit in its
                  budget and reads it back (modelled I/O). Setting: budget (MiB).

Configurations of a workload (M3 §7.1.2):

- ``memcolo``  ``memcolo agent --scope cgroup:<node>``; every job elastic through its SDK
               (cache or job layer first, then the runtime), throttled by the allow rate.
- ``default``  no agent; each job with its default setting: a quarter of the node (the
               JVM's default heap, which M3's Default mirrors for Go-Cache), and the
               JVM job's cache at Spark's default share of the heap (0.6).
- ``static-A-B-C``  no agent; the jobs with settings A, B, C MiB. The Oracle is the best
               of the static partitions run for each workload: candidates come from a
               grid of each job's setting, ranked by the solo profiles (``profile``
               runs) under the workload's schedule, the best ``--oracle-k`` are run.

Everything runs inside ``<own memory cgroup>/memcolo-m3-<pid>`` (limit ``--node-mib``),
each job in a child group of its own (for its timeline and peak), no swap: a job that
passes the node's memory is OOM-killed, and that is recorded. The node is removed on
exit. Results accumulate in ``--out`` (default bench/out/m3/<quick|full>/, ignored by git):
``runs.jsonl`` (one JSON object per run), ``timelines/<run>.csv`` (every 250 ms),
``events/<run>.jsonl`` (the agent's event log), ``logs/``. A run already in
``runs.jsonl`` is not run again, so the plan is worked through in locked slices::

    flock /tmp/memcolo-bench.lock /usr/bin/python3 bench/m3/run.py --quick --budget-s 540
    /usr/bin/python3 bench/m3/report.py bench/out/m3/quick

Each invocation stops starting runs once ``--budget-s`` is spent and prints how many
runs of the plan are left (exit status 3 while some are).
"""

import argparse
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
from benchlib import CG_ROOT, cg_int, cg_remove, cg_write, in_cgroup, own_memory_cgroup  # noqa: E402
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MIB = 1 << 20
SDK_JAR = os.path.join(ROOT, "sdk", "java", "target", "memcolo-sdk-0.1.0.jar")
BUILD = os.path.join(HERE, "build")


# ---------------------------------------------------------------------------- jobs

class JobType:
    """One kind of job: how to start it with a static setting or elastic."""

    key = ""
    name = ""
    unit = "MiB"

    def argv(self, setting_mib, node_mib, name):
        raise NotImplementedError

    def default_setting(self, node_mib):
        return node_mib // 4

    def grid(self, node_mib, quick):
        raise NotImplementedError


class GoCache(JobType):
    key, name = "C", "gocache"
    KEYS = 358400  # 1400 MiB of 4 KiB values
    GETS = 400000

    def argv(self, setting_mib, node_mib, name):
        return [os.path.join(BUILD, "gocache"), "-keys", str(self.KEYS), "-value-bytes", "4096",
                "-gets", str(self.GETS), "-workers", "4", "-miss-ms", "1",
                "-max-mib", str(setting_mib or 0), "-name", name, "-report-ms", "250"]

    def grid(self, node_mib, quick):
        return [256, 512, 768, 1024, 1400] if quick else [256, 384, 512, 640, 768, 896, 1024, 1152, 1280, 1400]


class IterJob(JobType):
    key, name = "J", "iterjob"
    PARTITIONS, ITERS = 320, 6  # 1.25 GiB data set; a read costs 8 ms/MiB (125 MiB/s, a disk)
    # Heap left to the JVM besides the cache in static settings (eden for the
    # blocks read and dropped, metadata): tuned so that a smaller one slows the job.
    HEADROOM_MIB = 96
    SPARK_STORAGE_FRACTION = 0.6

    def jvm_flags(self, xmx_mib):
        return ["-XX:+UseG1GC", "-XX:G1HeapRegionSize=2m", "-Xms64m", "-Xmx%dm" % xmx_mib]

    def argv(self, setting_mib, node_mib, name, cache_mib=None, num_epochs=None):
        if setting_mib:
            xmx = setting_mib
            cache = cache_mib if cache_mib is not None else max(16, xmx - self.HEADROOM_MIB)
        else:
            xmx, cache = node_mib, 0  # elastic: the heap may grow to the node
        return (["java"] + self.jvm_flags(xmx)
                + ["-cp", os.path.join(BUILD, "java") + ":" + SDK_JAR, "IterJob",
                   "--partitions", str(self.PARTITIONS), "--partition-mib", "4", "--iters", str(self.ITERS),
                   "--read-ms-per-mib", "8", "--task-ms", "12", "--cache-mib", str(cache), "--name", name, "--report-ms", "250"]
                + (["--num-epochs", str(num_epochs)] if num_epochs else []))

    def grid(self, node_mib, quick):
        # 608: the largest equal third of the node that fits three JVMs (JJJ-0)
        return [384, 608, 640, 896, 1152, 1408] if quick else [384, 512, 608, 768, 896, 1024, 1152, 1280, 1408]


class Spill(JobType):
    key, name = "P", "spill"
    PARTITIONS, ROUNDS = 256, 3  # 1 GiB per round; spill and read back at 8 ms/MiB

    def argv(self, setting_mib, node_mib, name, num_epochs=None):
        return ["/usr/bin/python3", os.path.join(HERE, "jobs", "spill.py"),
                "--partitions", str(self.PARTITIONS), "--partition-mib", "4", "--rounds", str(self.ROUNDS),
                "--passes", "2", "--io-ms-per-mib", "8", "--task-ms", "10", "--budget-mib", str(setting_mib or 0),
                "--name", name, "--report-ms", "250"] + (["--num-epochs", str(num_epochs)] if num_epochs else [])

    def grid(self, node_mib, quick):
        return [128, 320, 512, 768, 1024] if quick else [128, 256, 384, 512, 640, 768, 896, 1024]


JOB_TYPES = {t.key: t for t in (GoCache(), IterJob(), Spill())}

# Workloads: (name, [(job key, start delay s)]). M3 §7 starts jobs 0, 60, 180 s
# apart; scaled to this machine's shorter jobs: 0, 10, 30 s. Identical jobs started
# together are M3's worst case (§7, Fig. 8).
STAGGERED = [0, 10, 30]
WORKLOADS_QUICK = [
    ("CJP", list(zip("CJP", STAGGERED))),
    ("JPC", list(zip("JPC", STAGGERED))),
    ("JJJ-0", [("J", 0)] * 3),
]
WORKLOADS_FULL = WORKLOADS_QUICK + [
    ("PCJ", list(zip("PCJ", STAGGERED))),
    ("JJC", list(zip("JJC", STAGGERED))),
    ("CCC-0", [("C", 0)] * 3),
    ("PPP-0", [("P", 0)] * 3),
]


# Ablations of the memcolo configuration (`--variants rss,e20`), run as extra configs
# "memcolo+<name>": agent settings ([m3] table of its TOML) and the NUM_epochs of the
# allow-rate gates of the J and P jobs (C keeps the Go SDK's default, 5).
VARIANTS = {
    "rss": {"agent_m3": {"sort_order": "largest_rss"}},
    "oldest": {"agent_m3": {"sort_order": "oldest_first"}},
    "e20": {"num_epochs": 20},
    "rss-e20": {"agent_m3": {"sort_order": "largest_rss"}, "num_epochs": 20},
    "fair": {"agent_m3": {"fair_share": True}},
    # System.gc() (the JVM layer's low and high handlers) as a concurrent G1 cycle
    # instead of a stop-the-world full collection (sdk/README.md's flag).
    "cgc": {"jvm_flags": ["-XX:+ExplicitGCInvokesConcurrent"]},
}


def is_identical(spec):
    return len({k for k, _ in spec}) == 1 and all(d == 0 for _, d in spec)


# ---------------------------------------------------------------------- cgroups

def cg_read(cg, name):
    with open(os.path.join(cg, name)) as f:
        return f.read()


def cg_stat(cg):
    out = {}
    try:
        for line in cg_read(cg, "memory.stat").splitlines():
            k, v = line.split()
            out[k] = int(v)
    except (OSError, ValueError):
        pass
    return out


def cg_oom_kills(cg):
    try:
        for line in cg_read(cg, "memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------- the agent

class AgentStatus:
    """One connection to the agent's socket that asks for `status` (docs/protocol.md)."""

    def __init__(self, path):
        self.path = path
        self.sock = None
        self.buf = b""

    def query(self):
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(1.0)
                self.sock.connect(self.path)
            self.sock.sendall(b'{"v":1,"type":"status"}\n')
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise OSError("closed")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            return msg.get("status") if msg.get("type") == "status" else None
        except (OSError, ValueError):
            self.close()
            return None

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""


def agent_summary(events_path):
    s = {"notify": {"low": 0, "high": 0, "top": 0}, "reclaimed_ok": 0, "reclaimed_failed": 0,
         "reclaimed_bytes": 0, "kills": 0, "per_job": {}}
    if not os.path.exists(events_path):
        return s
    names = {}
    with open(events_path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            ev = e.get("event")
            if ev == "registered":
                names[e.get("pid")] = e.get("name")
            elif ev == "notify":
                s["notify"][e.get("level")] = s["notify"].get(e.get("level"), 0) + 1
                j = s["per_job"].setdefault(e.get("name") or str(e.get("pid")), {"low": 0, "high": 0, "top": 0})
                j[e.get("level")] = j.get(e.get("level"), 0) + 1
            elif ev == "reclaimed":
                s["reclaimed_ok" if e.get("ok", True) else "reclaimed_failed"] += 1
                s["reclaimed_bytes"] += e.get("bytes", 0) or 0
            elif ev == "kill":
                s["kills"] += 1
    return s


# -------------------------------------------------------------------- one run

def read_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    total = sum(v[:8])
    idle = v[3] + v[4]
    return total, idle, v[7]


class Job:
    def __init__(self, idx, jt, delay_s, setting_mib, name, argv, cg):
        self.idx, self.jt, self.delay_s, self.setting_mib = idx, jt, delay_s, setting_mib
        self.name, self.argv, self.cg = name, argv, cg
        self.proc = None
        self.started = self.ended = None
        self.last = {}
        self.final = None
        self.rc = None

    def start(self, log_path):
        os.makedirs(self.cg, exist_ok=True)
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            in_cgroup(self.cg, self.argv),
            stdout=subprocess.PIPE, stderr=self.log, start_new_session=True, env=self.env)
        self.started = time.monotonic()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            try:
                v = json.loads(raw)
            except ValueError:
                self.log.write(raw.decode(errors="replace"))
                continue
            self.last = v
            if v.get("done"):
                self.final = v


def run_once(ctx, run_id, kind, workload, config, spec, settings, rep):
    """Runs one workload (list of (job key, delay)) with per-job settings (MiB, 0 =
    elastic; None = default) and returns the run record."""
    a = ctx.args
    node = ctx.node
    mode_memcolo = config.split("+")[0] == "memcolo"
    variant = VARIANTS[config.split("+", 1)[1]] if "+" in config else {}
    for sub in os.listdir(node):
        if os.path.isdir(os.path.join(node, sub)):
            cg_remove(os.path.join(node, sub))
    try:
        cg_write(node, "memory.force_empty", 0)
    except OSError:
        pass
    cg_write(node, "memory.max_usage_in_bytes", 0)
    oom_before = cg_oom_kills(node)
    logdir = os.path.join(ctx.out, "logs", run_id)
    os.makedirs(logdir, exist_ok=True)
    sock = os.path.join(ctx.tmp, "agent-%s.sock" % rep)
    events = os.path.join(ctx.out, "events", run_id + ".jsonl")
    agent = None
    status = None
    env = dict(os.environ, MEMCOLO_SOCKET=sock if mode_memcolo else os.path.join(ctx.tmp, "no-agent.sock"))
    if mode_memcolo:
        if os.path.exists(events):
            os.remove(events)
        state = os.path.join(ctx.tmp, "state")
        shutil.rmtree(state, ignore_errors=True)
        cmd = [ctx.memcolo, "agent", "--scope", "cgroup:" + node, "--socket", sock, "--state-dir", state,
               "--metrics-addr", "off", "--event-log", events, "--poll-ms", str(a.poll_ms)]
        if variant.get("agent_m3"):
            cfg_path = os.path.join(logdir, "agent.toml")  # kept with the run's logs
            with open(cfg_path, "w") as f:
                f.write("[m3]\n" + "".join("%s = %s\n" % (k, json.dumps(v)) for k, v in variant["agent_m3"].items()))
            cmd += ["--config", cfg_path]
        agent = subprocess.Popen(
            cmd,
            stdout=open(os.path.join(logdir, "agent.log"), "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        else:
            agent.kill()
            raise SystemExit("the agent did not start: see %s" % os.path.join(logdir, "agent.log"))
        status = AgentStatus(sock)

    jobs = []
    for i, ((key, delay), setting) in enumerate(zip(spec, settings)):
        jt = JOB_TYPES[key]
        name = "%s%d-%s" % (key, i, jt.name)
        if config == "default":
            s = jt.default_setting(a.node_mib)
            argv = (jt.argv(s, a.node_mib, name, cache_mib=int(s * IterJob.SPARK_STORAGE_FRACTION))
                    if key == "J" else jt.argv(s, a.node_mib, name))
        elif variant.get("num_epochs") and key in "JP":
            s = setting
            argv = jt.argv(s, a.node_mib, name, num_epochs=variant["num_epochs"])
        else:
            s = setting
            argv = jt.argv(s, a.node_mib, name)
        if variant.get("jvm_flags") and key == "J":
            argv = argv[:1] + variant["jvm_flags"] + argv[1:]
        j = Job(i, jt, delay, s, name, argv, os.path.join(node, name))
        j.env = env
        jobs.append(j)

    timeline = []
    cpu0 = read_cpu()
    t0 = time.monotonic()
    deadline = t0 + a.run_timeout_s
    pending = sorted(jobs, key=lambda j: j.delay_s)
    zone_samples = {}
    while True:
        now = time.monotonic()
        while pending and now - t0 >= pending[0].delay_s:
            j = pending.pop(0)
            j.start(os.path.join(logdir, j.name + ".log"))
        for j in jobs:
            if j.proc is not None and j.rc is None and j.proc.poll() is not None:
                j.rc = j.proc.returncode
                j.ended = now
        row = {"t_s": round(now - t0, 3), "usage_bytes": cg_int(node, "memory.usage_in_bytes")}
        st = cg_stat(node)
        row["working_set_bytes"] = max(0, row["usage_bytes"] - st.get("total_inactive_file", 0))
        row["rss_bytes"] = st.get("total_rss", 0)
        row["file_bytes"] = st.get("total_cache", 0)
        if status is not None:
            s = status.query()
            if s:
                th = s.get("thresholds", {})
                row["low_bytes"] = th.get("low_bytes")
                row["high_bytes"] = th.get("high_bytes")
                row["top_bytes"] = th.get("top_bytes")
                row["zone"] = s.get("zone")
                zone_samples[s.get("zone")] = zone_samples.get(s.get("zone"), 0) + 1
        for j in jobs:
            running = j.proc is not None and j.rc is None
            row["j%d_usage_bytes" % j.idx] = cg_int(j.cg, "memory.usage_in_bytes") if running else 0
            row["j%d_useful_bytes" % j.idx] = j.last.get("useful_bytes", 0) if running else 0
            row["j%d_done_frac" % j.idx] = j.last.get("done_frac", 0) if j.proc is not None else 0
        timeline.append(row)
        if not pending and all(j.rc is not None for j in jobs):
            break
        if now > deadline:
            for j in jobs:
                if j.proc is not None and j.rc is None:
                    os.killpg(j.proc.pid, signal.SIGKILL)
            time.sleep(0.5)
            for j in jobs:
                if j.proc is not None and j.rc is None:
                    j.proc.wait()
                    j.rc, j.ended = "timeout", time.monotonic()
            break
        time.sleep(a.sample_ms / 1000.0)
    wall = time.monotonic() - t0
    cpu1 = read_cpu()
    peaks = {j.idx: cg_int(j.cg, "memory.max_usage_in_bytes") for j in jobs}
    node_peak = cg_int(node, "memory.max_usage_in_bytes")
    # cgroup v1 counts an OOM kill in the victim's group (a job's child group), not
    # in the node whose limit was hit: add the children's counters (new each run).
    oom_kills = cg_oom_kills(node) - oom_before + sum(cg_oom_kills(j.cg) for j in jobs)
    if agent is not None:
        status.close()
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    for j in jobs:
        cg_remove(j.cg)

    dt = max(1, cpu1[0] - cpu0[0])
    n = max(1, len(timeline))
    rec = {
        "run_id": run_id, "kind": kind, "workload": workload, "config": config, "rep": rep,
        "node_mib": a.node_mib, "poll_ms": a.poll_ms if mode_memcolo else None,
        "wall_s": round(wall, 3), "oom_kills": oom_kills, "node_peak_bytes": node_peak,
        "mean_usage_bytes": sum(r["usage_bytes"] for r in timeline) / n,
        "mean_working_set_bytes": sum(r["working_set_bytes"] for r in timeline) / n,
        "mean_useful_bytes": sum(sum(r.get("j%d_useful_bytes" % j.idx, 0) for j in jobs) for r in timeline) / n,
        "cpu_busy_pct": round(100.0 * (1 - (cpu1[1] - cpu0[1]) / dt), 1),
        "steal_pct": round(100.0 * (cpu1[2] - cpu0[2]) / dt, 1),
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "jobs": [],
    }
    for j in jobs:
        ok = j.final is not None and j.rc == 0
        rec["jobs"].append({
            "idx": j.idx, "type": j.jt.key, "name": j.name, "delay_s": j.delay_s,
            "setting_mib": j.setting_mib, "rc": j.rc, "ok": ok,
            "elapsed_s": round(j.ended - j.started, 3) if (ok and j.ended) else None,
            "job_elapsed_s": j.final.get("elapsed_s") if j.final else None,
            "peak_bytes": peaks[j.idx], "final": j.final or j.last,
        })
    rec["ok"] = all(x["ok"] for x in rec["jobs"]) and oom_kills == 0
    if mode_memcolo:
        rec["agent"] = agent_summary(events)
        rec["agent"]["zone_samples"] = zone_samples
    os.makedirs(os.path.join(ctx.out, "timelines"), exist_ok=True)
    keys = []
    for r in timeline:
        for k in r:
            if k not in keys:
                keys.append(k)
    with open(os.path.join(ctx.out, "timelines", run_id + ".csv"), "w") as f:
        f.write(",".join(keys) + "\n")
        for r in timeline:
            f.write(",".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + "\n")
    return rec


# --------------------------------------------------------------------- planning

def load_runs(out):
    """The runs of ``OUT/runs.jsonl`` by ``run_id``."""
    return benchlib.RunLog(out, key="run_id").records


def profile_id(key, setting, rep):
    return "profile.%s.%d.r%d" % (key, setting, rep)


def profiles(runs, key):
    """{setting: (mean elapsed s, max peak bytes)} of the completed solo runs of a job."""
    acc = {}
    for r in runs.values():
        if r["kind"] != "profile" or r["jobs"][0]["type"] != key or not r["ok"]:
            continue
        j = r["jobs"][0]
        e = acc.setdefault(j["setting_mib"], [[], 0])
        e[0].append(j["elapsed_s"])
        e[1] = max(e[1], j["peak_bytes"])
    return {s: (sum(v[0]) / len(v[0]), v[1]) for s, v in acc.items()}


# A set of jobs fits in the node when their solo peak footprints, 5 % larger (peaks
# vary from run to run: garbage-collected heaps, Go's map), leave 64 MiB for the page
# cache of their binaries and libraries. Without it, a node filled to its last MiB
# stalls in reclaim of those pages for minutes (seen here with the sum at 99 %).
FIT_FACTOR = 1.05
FIT_RESERVE_MIB = 64


def fits(peaks_bytes, node_mib):
    return sum(peaks_bytes) * FIT_FACTOR + FIT_RESERVE_MIB * MIB <= node_mib * MIB


def combo_peaks_fit(prof, spec, combo, node_mib):
    """True if the solo peak footprints of the settings fit in the node together
    (`fits`): a static *partition* of the node (M3 §7.2: "applications must be
    partitioned such that the combined peak memory usage fits in system memory")."""
    return fits([prof[key][s][1] for (key, _), s in zip(spec, combo)], node_mib)


def oracle_candidates(runs, spec, node_mib, quick, k, schedule=False, margin=1.25):
    """The k static settings of the workload predicted best from the solo profiles.

    Without `schedule`, a combination of settings (one per job from its grid) is
    feasible when the jobs' peak footprints add up to at most the node: a partition,
    M3's Oracle. With `schedule`, it is feasible when, at every moment of the
    workload's schedule (start delays, solo run times stretched by `margin`), the peak
    footprints of the jobs running together fit: a static setting that oversubscribes
    the node where it knows the jobs will not overlap (a stronger, clairvoyant
    baseline). The score is the mean over jobs of predicted run time / the job's best
    solo run time (the per-job slowdown, M3 §7.2's per-job view)."""
    prof = {key: profiles(runs, key) for key, _ in spec}
    grids = []
    for key, _ in spec:
        g = [s for s in JOB_TYPES[key].grid(node_mib, quick) if s in prof[key]]
        if not g:
            return None
        grids.append(g)
    best_solo = {key: min(t for t, _ in prof[key].values()) for key, _ in spec}
    cands = []
    for combo in itertools.product(*grids):
        if is_identical(spec) and list(combo) != sorted(combo):
            continue  # identical jobs: one order of each multiset
        if schedule:
            iv = []
            for (key, delay), s in zip(spec, combo):
                t, peak = prof[key][s]
                iv.append((delay, delay + t * margin, peak))
            ok = all(fits([p for s0, e0, p in iv if s0 <= start < e0], node_mib) for start, _, _ in iv)
        else:
            ok = combo_peaks_fit(prof, spec, combo, node_mib)
        if not ok:
            continue
        score = sum(prof[key][s][0] / best_solo[key] for (key, _), s in zip(spec, combo)) / len(spec)
        cands.append((score, combo))
    cands.sort()
    return [c for _, c in cands[:k]]


def static_id(workload, combo, rep):
    return "%s.static-%s.r%d" % (workload, "-".join(str(s) for s in combo), rep)


def plan(args, runs):
    """The runs of the whole evaluation, in order: (run_id, kind, workload, config,
    spec, settings, rep). Oracle candidates appear once the profiles they need exist."""
    out = []
    quick = args.quick
    keys = sorted({k for _, spec in args.workloads for k, _ in spec})
    for rep in range(args.profile_reps):
        for key in keys:
            for s in JOB_TYPES[key].grid(args.node_mib, quick):
                out.append((profile_id(key, s, rep), "profile", "solo-" + key, "static", [(key, 0)], [s], rep))
    for rep in range(args.reps):
        for wname, spec in args.workloads:
            out.append(("%s.memcolo.r%d" % (wname, rep), "workload", wname, "memcolo", spec, [0] * len(spec), rep))
            out.append(("%s.default.r%d" % (wname, rep), "workload", wname, "default", spec, [None] * len(spec), rep))
            for v in args.variants:
                out.append(("%s.memcolo+%s.r%d" % (wname, v, rep), "workload", wname, "memcolo+" + v, spec,
                            [0] * len(spec), rep))
            cands = oracle_candidates(runs, spec, args.node_mib, quick, args.oracle_k)
            if cands is None:
                out.append(("%s.static-pending.r%d" % (wname, rep), "pending", wname, "static", spec, None, rep))
                continue
            for c in oracle_candidates(runs, spec, args.node_mib, quick, args.oracle_k, schedule=True):
                if c not in cands:
                    cands.append(c)
            for combo in cands:
                out.append((static_id(wname, combo, rep), "workload", wname, "static", spec, list(combo), rep))
    for rep in range(args.reps, max(args.reps, args.memcolo_reps)):
        # Extra repetitions of the memcolo runs only (`--memcolo-reps`).
        for wname, spec in args.workloads:
            out.append(("%s.memcolo.r%d" % (wname, rep), "workload", wname, "memcolo", spec, [0] * len(spec), rep))
    return out


# ------------------------------------------------------------------------ main

class Ctx:
    pass


def build(args):
    os.makedirs(os.path.join(BUILD, "java"), exist_ok=True)
    subprocess.run(["go", "build", "-o", os.path.join(BUILD, "gocache"), "./examples/gocache"],
                   cwd=os.path.join(ROOT, "sdk", "go"), check=True)
    if not os.path.exists(SDK_JAR):
        subprocess.run(["mvn", "-B", "-q", "-f", os.path.join(ROOT, "sdk", "java"), "package", "-DskipTests"],
                       check=True)
    subprocess.run(["javac", "-cp", SDK_JAR, "-d", os.path.join(BUILD, "java"),
                    os.path.join(HERE, "jobs", "IterJob.java")], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="3 workloads, 1 repetition, 5-level grids, 3 Oracle candidates")
    ap.add_argument("--out", help="results directory (default bench/out/m3/<quick|full>)")
    ap.add_argument("--node-mib", type=int, default=2048, help="the node's memory (cgroup limit)")
    ap.add_argument("--poll-ms", type=int, default=200,
                    help="agent poll interval (M3 polls every 1 s; time here is scaled ~6x down)")
    ap.add_argument("--sample-ms", type=int, default=250)
    ap.add_argument("--run-timeout-s", type=float, default=300)
    ap.add_argument("--budget-s", type=float, default=540, help="start no run after this many seconds")
    ap.add_argument("--only", help="comma-separated run ids or prefixes to run (others are skipped)")
    ap.add_argument("--workloads", help="comma-separated workload names (default: all of the mode)")
    ap.add_argument("--memcolo", default=os.path.join(ROOT, "target", "release", "memcolo"))
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    ap.add_argument("--variants", default="", help="memcolo ablations to add: " + ", ".join(VARIANTS))
    ap.add_argument("--rerun", help="comma-separated run ids to run again (replacing their records)")
    ap.add_argument("--memcolo-reps", type=int, default=0,
                    help="repetitions of the memcolo runs (default: as many as the others)")
    args = ap.parse_args()
    args.reps = 1 if args.quick else 3
    args.profile_reps = 1
    args.oracle_k = 3 if args.quick else 5
    wl = WORKLOADS_QUICK if args.quick else WORKLOADS_FULL
    if args.workloads:
        want = args.workloads.split(",")
        wl = [w for w in wl if w[0] in want]
    args.workloads = wl
    args.variants = [v for v in args.variants.split(",") if v]
    for v in args.variants:
        if v not in VARIANTS:
            raise SystemExit("unknown variant %s (%s)" % (v, ", ".join(VARIANTS)))
    out = args.out or os.path.join(ROOT, "bench", "out", "m3", "quick" if args.quick else "full")
    os.makedirs(out, exist_ok=True)
    benchlib.record_machine(out, " ".join(sys.argv))
    log = benchlib.RunLog(out, key="run_id")
    runs = log.records
    rerun = set(args.rerun.split(",")) if args.rerun else set()
    for rid in rerun:
        runs.pop(rid, None)

    def todo():
        p = [x for x in plan(args, runs) if x[0] not in runs]
        if args.only:
            pre = args.only.split(",")
            p = [x for x in p if any(x[0].startswith(q) for q in pre)]
        return p

    if args.dry_run:
        for x in todo():
            print(x[0])
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (cgroups)")
    if not os.path.exists(args.memcolo):
        raise SystemExit("no memcolo binary at %s (cargo build --release -p memcolo)" % args.memcolo)
    build(args)

    ctx = Ctx()
    ctx.args, ctx.out, ctx.memcolo = args, out, args.memcolo
    ctx.tmp = "/tmp/memcolo-m3-%d" % os.getpid()
    os.makedirs(ctx.tmp, exist_ok=True)
    ctx.node = os.path.join(CG_ROOT + own_memory_cgroup(), "memcolo-m3-%d" % os.getpid())
    os.makedirs(ctx.node)

    def cleanup(*_):
        cg_remove(ctx.node)
        shutil.rmtree(ctx.tmp, ignore_errors=True)

    def on_signal(signum, _frame):
        cleanup()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cg_write(ctx.node, "memory.limit_in_bytes", args.node_mib * MIB)
        try:
            cg_write(ctx.node, "memory.swappiness", 0)
        except OSError:
            pass
        budget = benchlib.Budget(args.budget_s)
        while True:
            p = [x for x in todo() if x[1] != "pending"]
            if not p:
                break
            if budget.spent():
                break
            run_id, kind, wname, config, spec, settings, rep = p[0]
            print("== %s" % run_id, flush=True)
            rec = run_once(ctx, run_id, kind, wname, config, spec, settings, rep)
            log.append(rec)
            print("   wall %.1f s, ok %s, oom %d, jobs %s%s" % (
                rec["wall_s"], rec["ok"], rec["oom_kills"],
                ", ".join("%s=%s" % (j["name"], j["elapsed_s"]) for j in rec["jobs"]),
                (", notify %s" % rec["agent"]["notify"]) if "agent" in rec else ""), flush=True)
    finally:
        cleanup()
    left = [x for x in todo()]
    print("%d runs of the plan left%s" % (len(left), "" if left else "; report: /usr/bin/python3 %s %s" % (
        os.path.join(HERE, "report.py"), out)))
    return 3 if left else 0


if __name__ == "__main__":
    sys.exit(main())
