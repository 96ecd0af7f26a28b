#!/usr/bin/python3
"""Unmodified LC allocations under anonymous pressure, with and without memcolo's
asynchronous reclaim keeping headroom (issue 4, "Measure": the Hermes micro benchmark).

The Hermes micro benchmark (Middleware'21 §5.2; `bench/alloc/hermes_bench.c`, built
from that source into the output directory) allocates blocks of 1 KiB and 256 KiB with
glibc's malloc and writes the first byte of every 4 KiB page of each, paced (one block
every INTERVAL: by default 256 MiB/s), and reports the latency of each malloc + first
touch. It runs in `lc/` of a scratch memory cgroup v1 node (default 1.5 GiB, Hermes'
anonymous-pressure condition) that a BE memory hog in `be/` (stress-ng --vm-keep, as
large as the node) holds at its limit, with zram swap on /dev/zram0: every page the
benchmark touches must first be taken from the hog.

- kernel:  nothing else. The benchmark's page faults hit the node's limit and reclaim
  (swap a hog page out to zram) on the benchmark's own thread.
- reclaim: `memcolo agent` with the node as its scope and `[reclaim] enabled = true`
  (M3 kills and Hermes advice off), the hog registered BE, an LC placeholder pinned to
  the benchmark's CPU registered LC (so the agent and its workers keep off that CPU
  from the start, as beside a long-running LC service). The workers keep free headroom
  by reclaiming the hog, so the benchmark's faults find free pages.

The benchmark runs on CPU 0, the hog (and the agent, in `reclaim`) on the other CPUs.
Conditions alternate order each repetition. Per run: the benchmark's percentiles, the
node's `memory.failcnt` increase (charges that hit the limit and reclaimed on the
charging thread, the hog's included), swap, and the agent's reclaimed bytes and CPU.

Outputs in --out: runs.csv (one row per run), summary.csv (medians over repetitions per
condition and block size), report.md (the table), hermes_bench (the binary), cdf/.

Needs root, cgroup v1's memory controller, zram, stress-ng, a C compiler and the
memcolo binary (--memcolo, default target/release/memcolo). Uses /dev/zram0: run it
under the benchmark lock, which it does not take itself:

    sudo flock /tmp/memcolo-bench.lock bench/reclaim/hermes_reclaim.py --out DIR
"""
import argparse
import csv
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
from benchlib import zram_off, zram_on  # noqa: E402
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MiB = 1 << 20
FIELDS = ["n", "mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "min_us"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class Node:
    """A v1 memory cgroup below our own group with `lc` and `be` children; removed
    (after killing what is left in it) on close."""

    def __init__(self, limit):
        self.path = benchlib.scratch_cgroup("memcolo-hermes-reclaim-%d" % os.getpid(), limit)
        self.limit = limit
        for c in ("lc", "be"):
            os.mkdir(f"{self.path}/{c}")

    def usage(self):
        return int(read(f"{self.path}/memory.usage_in_bytes"))

    def failcnt(self):
        return int(read(f"{self.path}/memory.failcnt"))

    def swap(self):
        for line in read(f"{self.path}/memory.stat").splitlines():
            k, v = line.split()
            if k == "total_swap":
                return int(v)
        return 0

    def joiner(self, child):
        procs = f"{self.path}/{child}/cgroup.procs"

        def join():
            benchlib.cg_add(os.path.dirname(procs), os.getpid())
        return join

    def close(self):
        benchlib.cg_remove(self.path)


class Agent:
    """`memcolo agent` on the node with asynchronous reclaim, in a temp dir."""

    def __init__(self, memcolo, node, work, extra_reclaim):
        self.memcolo = memcolo
        self.dir = tempfile.mkdtemp(prefix="agent-", dir=work)
        self.sock = os.path.join(self.dir, "agent.sock")
        cfg = os.path.join(self.dir, "agent.toml")
        write(cfg, "[hermes]\nenabled = false\n[m3]\nkill_after_s = 86400\n[reclaim]\nenabled = true\n"
              + "".join(line + "\n" for line in extra_reclaim))
        self.log = open(os.path.join(work, "agent.log"), "a")
        self.proc = subprocess.Popen(
            [memcolo, "agent", "--config", cfg, "--scope", f"cgroup:{node.path}", "--socket", self.sock,
             "--state-dir", os.path.join(self.dir, "state"), "--metrics-addr", "off", "--event-log", "off"],
            stdout=self.log, stderr=self.log)
        for _ in range(150):
            if os.path.exists(self.sock):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited: {self.proc.returncode} (see {self.log.name})")
            time.sleep(0.1)
        raise RuntimeError("agent socket did not appear")

    def register(self, pid, cls):
        subprocess.run([self.memcolo, "register", "--socket", self.sock, "--pid", str(pid), "--class", cls],
                       check=True, capture_output=True)

    def reclaim_status(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(self.sock)
        s.sendall(b'{"v":1,"type":"status"}\n')
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        s.close()
        return json.loads(buf)["status"].get("reclaim", {})

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def settle(node, margin, timeout_s):
    """Waits until the hog has the node at its limit again (usage within `margin`)."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if node.usage() >= node.limit - margin:
            return True
        time.sleep(0.1)
    return False


def run_condition(cond, a, binary, out, work, rep):
    """One condition: node, hog, (agent), then every block size; returns rows."""
    rows = []
    node = Node(a.node_mib * MiB)
    agent = None
    procs = []
    try:
        hog = subprocess.Popen(["taskset", "-c", a.be_cpus, "stress-ng", "--vm", "1", "--vm-bytes",
                                f"{a.node_mib}M", "--vm-keep", "--timeout", "3600"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=node.joiner("be"))
        procs.append(hog)
        if cond == "reclaim":
            agent = Agent(a.memcolo, node, work, a.reclaim_set)
            placeholder = subprocess.Popen(["taskset", "-c", a.lc_cpu, "sleep", "3600"],
                                           preexec_fn=node.joiner("lc"))
            procs.append(placeholder)
            agent.register(placeholder.pid, "lc")
            # A registered pid stands for its tree: stress-ng's vm workers included.
            agent.register(hog.pid, "be")
        if not settle(node, 64 * MiB, 30):
            log(f"warning: {cond}: the hog did not fill the node")
        time.sleep(a.hold_s)
        for block, interval in a.cases:
            settle(node, 96 * MiB, 20)
            st0 = agent.reclaim_status() if agent else {}
            f0, s0 = node.failcnt(), node.swap()
            cdf = os.path.join(out, "cdf", f"{cond}-{block}-r{rep}.csv")
            cmd = ["taskset", "-c", a.lc_cpu, binary, str(block), str(a.total_mib * MiB), "paced", str(interval),
                   cdf, "0"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, preexec_fn=node.joiner("lc"))
            f1, s1 = node.failcnt(), node.swap()
            st1 = agent.reclaim_status() if agent else {}
            if r.returncode != 0:
                log(f"  {cond} {block} B: failed: {r.stderr.strip()[:200]}")
                continue
            vals = r.stdout.strip().split(",")
            row = {"rep": rep, "condition": cond, "block_bytes": block, "interval_ns": interval,
                   "total_bytes": a.total_mib * MiB, "node_bytes": node.limit}
            row.update(dict(zip(FIELDS, vals)))
            row["node_failcnt"] = f1 - f0
            row["swap_delta_bytes"] = s1 - s0
            if agent:
                row["reclaimed_bytes"] = st1.get("reclaimed_bytes_total", 0) - st0.get("reclaimed_bytes_total", 0)
                row["reclaim_cpu_s"] = round(st1.get("cpu_seconds_total", 0) - st0.get("cpu_seconds_total", 0), 4)
            rows.append(row)
            log(f"  {cond:8} {block:6} B  p50 {float(row['p50_us']):8.2f}  p99 {float(row['p99_us']):9.2f}"
                f"  p99.9 {float(row['p999_us']):9.2f}  max {float(row['max_us']):10.1f} us"
                f"  failcnt +{row['node_failcnt']}")
    finally:
        if agent:
            agent.close()
        for p in procs:
            p.kill()
            p.wait()
        node.close()
    return rows


def med(rows, key):
    v = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(v) if v else None


def report(out, rows, a, started):
    keys = ["p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us", "node_failcnt", "reclaimed_bytes",
            "reclaim_cpu_s"]
    summary = []
    for block, interval in a.cases:
        for cond in ("kernel", "reclaim"):
            rs = [r for r in rows if r["condition"] == cond and r["block_bytes"] == block]
            if not rs:
                continue
            s = {"condition": cond, "block_bytes": block, "interval_ns": interval, "runs": len(rs)}
            s.update({k: med(rs, k) for k in keys})
            summary.append(s)
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["condition", "block_bytes", "interval_ns", "runs"] + keys)
        w.writeheader()
        w.writerows(summary)
    lines = [
        "# Hermes micro benchmark under anonymous pressure, with and without asynchronous reclaim\n",
        f"{started} on `{socket.gethostname()}`: Linux {os.uname().release}, {os.cpu_count()} CPUs.\n",
        "```sh", "sudo flock /tmp/memcolo-bench.lock " + " ".join(sys.argv), "```\n",
        f"Node {a.node_mib} MiB held at its limit by a BE hog (stress-ng --vm-keep, {a.node_mib} MiB), zram swap; "
        f"glibc malloc + first touch of every 4 KiB page, {a.total_mib} MiB per run, paced "
        f"({', '.join(f'{b} B every {i} ns' for b, i in a.cases)}); benchmark on CPU {a.lc_cpu}, hog "
        f"(and agent) on CPUs {a.be_cpus}; medians of {a.reps} interleaved repetitions (raw: runs.csv).\n",
        "| block | condition | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | node failcnt | reclaimed MiB | "
        "reclaim CPU s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(v, p=2):
        return "-" if v is None else f"{v:.{p}f}"
    for s in summary:
        rec = s["reclaimed_bytes"]
        lines.append(f"| {s['block_bytes']} B | {s['condition']} | {f(s['p50_us'])} | {f(s['p90_us'])} | "
                     f"{f(s['p99_us'])} | {f(s['p999_us'])} | {f(s['max_us'], 0)} | {f(s['node_failcnt'], 0)} | "
                     f"{'-' if rec is None else f'{rec / MiB:.0f}'} | {f(s['reclaim_cpu_s'])} |")
    lines.append("")
    lines.append("node failcnt: charges in the node that hit its limit during the run (the hog's included); "
                 "each reclaimed on the charging thread.")
    write(os.path.join(out, "report.md"), "\n".join(lines) + "\n")
    benchlib.publish(HERE, "hermes", out)
    print("\n".join(lines[7:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(
        ROOT, "bench", "out", "reclaim", datetime.date.today().isoformat() + "-" + socket.gethostname() + "-hermes"))
    ap.add_argument("--memcolo", default=os.path.join(ROOT, "target", "release", "memcolo"))
    ap.add_argument("--quick", action="store_true", help="one repetition of 256 MiB")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3; 1 with --quick)")
    ap.add_argument("--node-mib", type=int, default=1536)
    ap.add_argument("--total-mib", type=int, default=None, help="allocated per run (default 512; 256 with --quick)")
    ap.add_argument("--rate-mib-s", type=float, default=256.0, help="allocation rate of the paced benchmark")
    ap.add_argument("--hold-s", type=float, default=3.0, help="pressure before the first run of a condition")
    ap.add_argument("--lc-cpu", default="0")
    ap.add_argument("--be-cpus", default=None, help="default: every CPU but --lc-cpu")
    ap.add_argument("--conditions", default="kernel,reclaim")
    ap.add_argument("--reclaim-set", action="append", default=[],
                    help="extra `key = value` line for the agent's [reclaim] section")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (cgroups, zram)")
    a.reps = a.reps or (1 if a.quick else 3)
    a.total_mib = a.total_mib or (256 if a.quick else 512)
    if a.be_cpus is None:
        a.be_cpus = ",".join(str(c) for c in range(os.cpu_count()) if str(c) != a.lc_cpu) or a.lc_cpu
    per_s = a.rate_mib_s * MiB
    a.cases = [(262144, int(262144 / per_s * 1e9)), (1024, int(1024 / per_s * 1e9))]
    conds = [c for c in a.conditions.split(",") if c]
    for c in conds:
        if c not in ("kernel", "reclaim"):
            sys.exit(f"unknown condition {c}")
    for tool in ("stress-ng", "taskset", "cc", "mkswap"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is needed")
    if "reclaim" in conds and not os.access(a.memcolo, os.X_OK):
        sys.exit(f"{a.memcolo}: not found (cargo build --release)")
    out = a.out
    os.makedirs(os.path.join(out, "cdf"), exist_ok=True)
    benchlib.record_machine(out, " ".join(sys.argv))
    binary = os.path.join(out, "hermes_bench")
    subprocess.run(["cc", "-O2", "-o", binary, os.path.join(ROOT, "bench", "alloc", "hermes_bench.c")], check=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    work = tempfile.mkdtemp(prefix="memcolo-hermes-reclaim-")
    rows = []
    zram_on(4096)
    try:
        for rep in range(a.reps):
            order = conds if rep % 2 == 0 else conds[::-1]
            for cond in order:
                log(f"rep {rep}: {cond}")
                rows += run_condition(cond, a, binary, out, work, rep)
    finally:
        zram_off()
        if os.path.exists(os.path.join(work, "agent.log")):
            shutil.copy(os.path.join(work, "agent.log"), os.path.join(out, "agent.log"))
        shutil.rmtree(work, ignore_errors=True)
    fields = ["rep", "condition", "block_bytes", "interval_ns", "total_bytes", "node_bytes"] + FIELDS + [
        "node_failcnt", "swap_delta_bytes", "reclaimed_bytes", "reclaim_cpu_s"]
    with open(os.path.join(out, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    report(out, rows, a, started)


if __name__ == "__main__":
    main()
