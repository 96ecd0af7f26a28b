#!/usr/bin/python3
"""The issue-4 side-by-side run of `memcolo bench reclaim`, in locked chunks of at most
~8 minutes, resumable, into one results directory.

Each chunk is one `memcolo bench reclaim` invocation under the shared benchmark lock
(`flock /tmp/memcolo-bench.lock ...`), writing into `OUT/parts/<chunk>/`; the lock is
released between chunks so that others get a turn. A chunk that finished is marked
`OUT/parts/<chunk>/DONE` and skipped when the script runs again, so an interrupted run
is resumed by running the same command. All chunks share `OUT/solo.csv` (the BE solo
baselines, run once by the `solo` chunk and reused by every Redis and memcached chunk).

The binary is copied once, at the first chunk, to `/var/tmp/memcolo-side-by-side/
<sha256>/memcolo` and recorded in `OUT/side-by-side.json` with the commit it was built
from, so that every chunk runs the same build while the shared target directory moves
on (`--memcolo` names the build to copy; `--rebind` replaces a recorded one).

When every chunk is done (or with `--merge-only`) the script merges the parts into
`OUT/runs.csv` (every LC run, with `chunk`), `OUT/batch.csv` (every batch run), draws
each part's timelines (`bench/reclaim/plot.py`) and writes `OUT/summary.md`: the
issue's "Done when" targets computed from the runs (definitions in the file), then LC
latency, BE progress (weighted speedup, `bench/reclaim/README.md`), batch completion
and reclaim CPU per GiB, per level and mode.

    sudo bench/reclaim/side_by_side.py --out bench/out/reclaim/side-by-side
    sudo bench/reclaim/side_by_side.py --out DIR --list        # the plan and what is done
    sudo bench/reclaim/side_by_side.py --out DIR --max-chunks 2
    sudo bench/reclaim/side_by_side.py --out DIR --merge-only

Needs root and what `memcolo bench reclaim` needs (redis-server, memcached, fio,
stress-ng, python3-numpy, zram). Takes the lock itself; do not run it under flock.
"""
import argparse
import shlex
import csv
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LOCK = "/tmp/memcolo-bench.lock"
BIN_DIR = "/var/tmp/memcolo-side-by-side"



def make_plan(duration_s, reps, solo_reps, batch_args, solo_levels="100,125,150"):
    """(name, arguments after `bench reclaim`, estimated seconds) of every chunk;
    interleaved so that slow drift of the shared machine spreads over every
    configuration. LC chunks run the quick sweep (2 GiB node, 2000 req/s, 50k keys,
    4 s warm-up) with a `duration_s` measured phase."""
    warmup_s = 4
    common = ["--quick", "--duration-s", str(duration_s), "--keep-going", "--no-plot"]
    lc_run = warmup_s + duration_s + 8
    chunks = {
        "redis-100": (["--levels", "0,100", "--modes", "kernel,watermarks,fixed,reclaim"], 8),
        "redis-high": (["--levels", "125,150", "--modes", "kernel,reclaim"], 4),
        "redis-150": (["--levels", "150", "--modes", "kernel,reclaim"], 2),
        "memcached": (["--lc", "memcached", "--levels", "0,100", "--modes", "kernel,reclaim"], 4),
        # With the reference "same BE CPU load, no memory pressure" (mode no-pressure:
        # the 100 % row's BE jobs in a node whose limit holds them all).
        "redis-np": (["--levels", "0,100", "--modes", "kernel,reclaim,no-pressure"], 6),
        "memcached-np": (["--lc", "memcached", "--levels", "0,100", "--modes",
                          "kernel,reclaim,no-pressure"], 6),
    }
    plan = [("solo", common + ["--levels", solo_levels, "--solo-only", "--solo-repeats",
                               str(solo_reps)],
             2 * len(solo_levels.split(",")) * solo_reps * (warmup_s + duration_s + 2))]
    for r in range(1, max(reps.values()) + 1):
        for name, (args, runs) in chunks.items():
            if r <= reps.get(name, 0):
                plan.append((f"{name}-r{r}", common + args, runs * lc_run))
        if r <= reps.get("batch", 0):
            plan.append((f"batch-r{r}", ["--batch", "--levels", "70", "--modes", "kernel,reclaim",
                                         "--keep-going", "--no-plot"] + batch_args, 150))
    return plan


PLANS = {
    # The issue's side-by-side run: Redis 0/100 % x 4 modes three times, 125/150 % x
    # kernel/reclaim twice, memcached 0/100 % twice, k-means at 70 % 2 x 2 runs.
    "full": make_plan(15, {"redis-100": 3, "redis-high": 2, "memcached": 2, "batch": 2}, 2,
                      ["--repeats", "2", "--batch-iters", "6"]),
    # The Redis 100 % row alone, four times (the verdict's spread), when the reclaim code
    # has not changed since a full run: BE solo baselines at 100 % only.
    "redis-100": make_plan(15, {"redis-100": 4, "redis-high": 0, "memcached": 0, "batch": 0},
                           2, [], solo_levels="100"),
    # After a reclaim change that the 150 % row motivates: the 150 % row three times (kernel,
    # reclaim), the Redis 100 % row three times and memcached's 100 % row once (the LC
    # rows the change must not cost); BE solo baselines at 100 and 150 % (~20 min).
    "reclaim-change": make_plan(15, {"redis-100": 3, "redis-150": 3, "memcached": 1}, 2, [],
                                solo_levels="100,150"),
    # The LC 100 % rows with the CPU-share reference beside them: Redis three times,
    # memcached twice, each with 0 % and 100 % x kernel, reclaim, no-pressure; BE solo
    # baselines at 100 % (~17 min).
    "lc-100-np": make_plan(15, {"redis-np": 3, "memcached-np": 2}, 2, [], solo_levels="100"),
    # A check of the machinery (minutes): every kind of chunk once, short phases.
    "smoke": make_plan(3, {"redis-100": 1, "redis-high": 0, "memcached": 0, "batch": 1}, 1,
                       ["--repeats", "1", "--batch-iters", "2", "--batch-bytes", "256MiB"]),
}
PLAN = PLANS["full"]
CHUNK_LIMIT_S = 8 * 60


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, rows, first=()):
    fields = list(first)
    for r in rows:
        for k in r:
            if k not in fields:
                fields.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def bind_binary(out, source, rebind, bin_dir=BIN_DIR):
    """The recorded copy of the memcolo binary, made from `source` on first use."""
    state_path = os.path.join(out, "side-by-side.json")
    if os.path.exists(state_path) and not rebind:
        with open(state_path) as f:
            state = json.load(f)
        if os.path.exists(state["binary"]) and sha256(state["binary"]) == state["sha256"]:
            return state
        sys.exit(f"{state['binary']} is gone or changed; run with --rebind --memcolo PATH")
    if not os.path.exists(source):
        sys.exit(f"{source} does not exist; build it (cargo build --release) or pass --memcolo")
    digest = sha256(source)
    dest_dir = os.path.join(bin_dir, digest[:16])
    os.makedirs(dest_dir, exist_ok=True)
    dest = os.path.join(dest_dir, "memcolo")
    if not os.path.exists(dest) or sha256(dest) != digest:
        shutil.copy2(source, dest)
    state = {
        "binary": dest,
        "sha256": digest,
        "source": os.path.abspath(source),
        "commit": git("rev-parse", "HEAD"),
        "dirty_paths": git("status", "--porcelain", "--untracked-files=no").splitlines(),
        "bound_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with open(state_path, "w") as f:
        json.dump(state, f, indent=2)
    log(f"binary {dest} (sha256 {digest[:16]}, commit {state['commit'][:12]})")
    return state


def chunk_dir(out, name):
    return os.path.join(out, "parts", name)


def is_done(out, name):
    return os.path.exists(os.path.join(chunk_dir(out, name), "DONE"))


def probe_wrap(d, inner):
    """`inner` (a shell command) with SCHED_FIFO wake-latency probes on CPU 0 and 1
    (`wake_probe.c`, 1 ms sleeps, overshoots over 1 ms in `d/probe-cpu<N>.csv`) and
    `host_mm_sampler.py` (`d/host-mm.csv`) running beside it, all started once the lock
    is held; `probe_attr.py d` matches them with the LC's slow seconds."""
    wp = os.path.join(d, "wake_probe")
    subprocess.run(["cc", "-O2", "-Wall", "-o", wp, os.path.join(HERE, "wake_probe.c")],
                   check=True)
    q = shlex.quote
    probes = " ".join(
        f"{q(wp)} --cpu {c} --fifo 50 --duration-s 3600 --events "
        f"{q(os.path.join(d, f'probe-cpu{c}.csv'))} > {q(os.path.join(d, f'probe-cpu{c}.json'))} & "
        f"P{c}=$!;" for c in (0, 1))
    return (f"python3 {q(os.path.join(HERE, 'host_mm_sampler.py'))} "
            f"{q(os.path.join(d, 'host-mm.csv'))} & S=$!; {probes} {inner}; rc=$?; "
            f"kill -TERM $P0 $P1 $S; wait $P0 $P1 $S; exit $rc")


def run_chunk(out, name, args, binary, dry_run, probe=False):
    d = chunk_dir(out, name)
    os.makedirs(d, exist_ok=True)
    cmd = ["flock", LOCK, binary, "bench", "reclaim", *args, "--out", d]
    if "--batch" not in args:
        cmd += ["--solo-csv", os.path.join(out, "solo.csv")]
    if "--batch" not in args and "--solo-only" not in args:
        # Open the chunk with a discarded warm-up run under the same lock: the first
        # run after the lock changes hands met other sessions' work (every 0 % kernel
        # baseline of the 2026-11-24 run, 15-42 % foreign time on the LC CPU).
        lc = args[args.index("--lc"):args.index("--lc") + 2] if "--lc" in args else []
        warm = [binary, "bench", "reclaim", "--quick", "--duration-s", "5", *lc,
                "--levels", "0", "--modes", "kernel", "--no-solo", "--no-plot",
                "--out", os.path.join(d, "warmup-discarded")]
        inner = (f"{shlex.join(warm)} > {shlex.quote(os.path.join(d, 'warmup.log'))} 2>&1; "
                 f"{'' if probe else 'exec '}{shlex.join(cmd[2:])}")
        cmd = ["flock", LOCK, "sh", "-c", probe_wrap(d, inner) if probe else inner]
    log(f"{name}: {' '.join(cmd)}")
    if dry_run:
        return True
    t0 = time.monotonic()
    with open(os.path.join(d, "driver.log"), "a") as logf:
        logf.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {' '.join(cmd)}\n")
        logf.flush()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=ROOT)
        for line in p.stdout:
            logf.write(line)
            logf.flush()
            if line.startswith("["):
                sys.stdout.write(f"  {name} {line}")
                sys.stdout.flush()
        rc = p.wait()
    took = time.monotonic() - t0
    meta = {"chunk": name, "command": cmd, "rc": rc, "wall_s_with_lock_wait": round(took, 1),
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    if rc != 0:
        log(f"{name}: FAILED (rc {rc}); see {d}/driver.log; run again to retry it")
        return False
    with open(os.path.join(d, "DONE"), "w") as f:
        f.write(meta["finished_utc"] + "\n")
    log(f"{name}: done in {took:.0f} s (lock wait included)")
    return True


# ---------------------------------------------------------------- merge and summary


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec=".0f", none="-"):
    return none if v is None else format(v, spec)


def pct(v):
    return "-" if v is None else f"{v * 100:.0f} %"


def merge(out):
    runs, batch = [], []
    for name, _, _ in PLAN:
        d = chunk_dir(out, name)
        for r in read_csv(os.path.join(d, "runs.csv")):
            runs.append({"chunk": name, **r})
        for r in read_csv(os.path.join(d, "batch.csv")):
            batch.append({"chunk": name, **r})
        if os.path.exists(os.path.join(d, "runs.csv")) and shutil.which("python3"):
            subprocess.run([sys.executable, os.path.join(HERE, "plot.py"), d],
                           capture_output=True)
    if runs:
        write_csv(os.path.join(out, "runs.csv"), runs, first=["chunk"])
    if batch:
        write_csv(os.path.join(out, "batch.csv"), batch, first=["chunk"])
    return runs, batch


def groups(rows, keys):
    g = {}
    for r in rows:
        g.setdefault(tuple(r[k] for k in keys), []).append(r)
    return g


def summary(out, runs, batch):
    ok = [r for r in runs if r["status"] == "ok"]
    failed = [r for r in runs if r["status"] != "ok"] + [
        r for r in batch if r["status"] != "ok"]
    by = groups(ok, ["lc_service", "level_pct", "mode"])

    def fig(lc, level, mode, col, agg=med):
        return agg([num(r.get(col)) for r in by.get((lc, str(level), mode), [])])

    s = ["# Side-by-side run: summary computed from the raw runs\n"]
    s.append("Generated by `bench/reclaim/side_by_side.py` from `runs.csv`, `batch.csv` and "
             "`solo.csv`. Medians over the runs of each (service, level, mode); the "
             "number of runs is in each table.\n")
    # --- targets
    s.append("## Done-when targets\n")
    s.append("| target | service | measured | threshold | verdict |\n|---|---|---|---|---|")
    for lc in sorted({r["lc_service"] for r in ok}):
        base = fig(lc, 0, "kernel", "p99_us")
        base_tp = fig(lc, 0, "kernel", "throughput_rps")
        for mode in ("reclaim", "kernel"):
            p99 = fig(lc, 100, mode, "p99_us")
            worst = fig(lc, 100, mode, "p99_us", agg=lambda v: max(
                [x for x in v if x is not None], default=None))
            n = len(by.get((lc, "100", mode), []))
            if p99 is None or not base:
                continue
            ratio = p99 / base
            s.append(f"| LC p99 at 100 % ≤ 2x no-pressure p99 ({mode}) | {lc} | "
                     f"{p99:.0f} / {base:.0f} µs = **{ratio:.1f}x** (worst of {n}: "
                     f"{worst / base:.1f}x) | 2.0x | "
                     f"{'met' if ratio <= 2 else 'missed'}"
                     f"{'' if mode == 'reclaim' else ' (kernel alone, for scale)'} |")
            # Beside the verdict (all requests): the p99 over the seconds without host
            # steal on the LC CPU, against the 0 % baseline's own steal-free p99.
            sf = fig(lc, 100, mode, "p99_steal_free_us")
            sf0 = fig(lc, 0, "kernel", "p99_steal_free_us")
            if mode == "reclaim" and sf is not None and sf0:
                rs_ = by.get((lc, "100", mode), [])
                st = [f"{r.get('lc_steal_seconds')}/{r.get('lc_measured_seconds')}" for r in rs_]
                s.append(f"| (beside it, not the verdict) LC p99 over seconds without LC-CPU "
                         f"steal | {lc} | {sf:.0f} / {sf0:.0f} µs = {sf / sf0:.1f}x (seconds with "
                         f"steal per run: {', '.join(st)}) | - | - |")
            # Beside the verdict: the same BE jobs (the same BE CPU load) in a node that
            # holds them all: the part of the 100 % tail that is the machine's CPU share.
            np_ = fig(lc, 100, "no-pressure", "p99_us")
            if mode == "reclaim" and np_ is not None:
                each = ", ".join(fmt(num(r["p99_us"]))
                                 for r in by.get((lc, "100", "no-pressure"), []))
                s.append(f"| (beside it, not the verdict) LC p99 with the same BE CPU load and "
                         f"no memory pressure | {lc} | no-pressure {np_:.0f} / {base:.0f} µs = "
                         f"{np_ / base:.1f}x (runs: {each} µs); reclaim / no-pressure "
                         f"{p99:.0f} / {np_:.0f} µs = {p99 / np_:.1f}x | - | - |")
        tp = fig(lc, 100, "reclaim", "throughput_rps")
        if tp is not None and base_tp:
            s.append(f"| LC throughput at 100 % within 5 % | {lc} | {tp:.0f} / {base_tp:.0f} "
                     f"req/s = **{tp / base_tp * 100:.1f} %** | ≥ 95 % | "
                     f"{'met' if tp / base_tp >= 0.95 else 'missed'} |")
        for level in (100, 125, 150):
            ws_m = fig(lc, level, "reclaim", "be_weighted_speedup")
            ws_k = fig(lc, level, "kernel", "be_weighted_speedup")
            if ws_m is None or not ws_k:
                continue
            r = ws_m / ws_k
            s.append(f"| BE progress ≥ 90 % of kernel-alone (weighted speedup) at {level} % | "
                     f"{lc} | {ws_m:.2f} / {ws_k:.2f} = **{r * 100:.0f} %** | ≥ 90 % | "
                     f"{'met' if r >= 0.9 else 'missed'} |")
    bok = [r for r in batch if r["status"] == "ok" and r["level_pct"] == "70"]
    bk = med([num(r["total_s"]) for r in bok if r["mode"] == "kernel"])
    bm = med([num(r["total_s"]) for r in bok if r["mode"] == "reclaim"])
    if bk and bm:
        n = sum(1 for r in bok if r["mode"] == "reclaim")
        s.append(f"| batch at 70 % ≥ 1.2x faster than kernel alone | k-means | {bk:.1f} / "
                 f"{bm:.1f} s = **{bk / bm:.2f}x** ({n} runs each) | 1.2x | "
                 f"{'met' if bk / bm >= 1.2 else 'missed'} |")
    gib = [num(r["reclaim_cpu_s_per_gib"]) for r in ok + bok if r.get("reclaim_cpu_s_per_gib")]
    gib = [g for g in gib if g is not None]
    if gib:
        s.append(f"| CPU spent reclaiming reported per GiB | all | median "
                 f"{med(gib):.2f} CPU s/GiB over {len(gib)} runs (range {min(gib):.2f}–"
                 f"{max(gib):.2f}) | reported | met |")
    s.append("")
    # --- LC
    s.append("## LC latency and throughput\n")
    s.append("| service | level | mode | runs | p50 µs | p99 µs (min–max) | p99.9 µs | req/s | "
             "p99 / 0 % kernel | LC majflt | node limit hits | LC run delay ms | reclaim MiB | "
             "reclaim CPU s/GiB |")
    s.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (lc, level, mode), rs in sorted(by.items(), key=lambda kv: (
            kv[0][0], int(kv[0][1]), kv[0][2])):
        p99s = [num(r["p99_us"]) for r in rs]
        base = fig(lc, 0, "kernel", "p99_us")
        p99 = med(p99s)
        rb = med([num(r["reclaim_bytes"]) for r in rs])
        s.append(f"| {lc} | {level} % | {mode} | {len(rs)} | "
                 f"{fmt(med([num(r['p50_us']) for r in rs]))} | {fmt(p99)} "
                 f"({fmt(min(p99s))}–{fmt(max(p99s))}) | "
                 f"{fmt(med([num(r['p999_us']) for r in rs]))} | "
                 f"{fmt(med([num(r['throughput_rps']) for r in rs]))} | "
                 f"{fmt(p99 / base if base else None, '.1f')}{'x' if base else ''} | "
                 f"{fmt(med([num(r['redis_major_faults']) for r in rs]))} | "
                 f"{fmt(med([num(r.get('node_limit_hits')) for r in rs]))} | "
                 f"{fmt(med([num(r.get('lc_run_delay_ms')) for r in rs]))} | "
                 f"{fmt(rb / (1 << 20) if rb is not None else None)} | "
                 f"{fmt(med([num(r['reclaim_cpu_s_per_gib']) for r in rs]), '.2f')} |")
    s.append("")
    # --- BE progress
    s.append("## BE progress (weighted speedup; definition in bench/reclaim/README.md)\n")
    s.append("| service | level | mode | runs | file MiB/min | file hits | anon ops/min | "
             "file / solo | anon / solo | WS | file vs kernel | anon vs kernel | WS vs kernel |")
    s.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    below = []
    for (lc, level, mode), rs in sorted(by.items(), key=lambda kv: (
            kv[0][0], int(kv[0][1]), kv[0][2])):
        if level == "0":
            continue
        f, a, w = (fig(lc, level, mode, c) for c in (
            "be_file_progress", "be_anon_progress", "be_weighted_speedup"))
        kf, ka, kw = (fig(lc, level, "kernel", c) for c in (
            "be_file_progress", "be_anon_progress", "be_weighted_speedup"))
        rel = [x / k if x is not None and k else None for x, k in ((f, kf), (a, ka), (w, kw))]
        if mode != "kernel":
            for what, v in zip(("file streamer", "anon holder", "weighted speedup"), rel):
                if v is not None and v < 0.9:
                    below.append(f"{lc} {level} % {mode}: {what} {v * 100:.0f} % of kernel-alone")
        s.append(f"| {lc} | {level} % | {mode} | {len(rs)} | "
                 f"{fmt(fig(lc, level, mode, 'be_file_mib_per_min'))} | "
                 f"{pct(fig(lc, level, mode, 'be_file_hit_ratio'))} | "
                 f"{fmt(fig(lc, level, mode, 'be_anon_ops_per_min'))} | {pct(f)} | {pct(a)} | "
                 f"{fmt(w, '.2f')} | {pct(rel[0])} | {pct(rel[1])} | {pct(rel[2])} |")
    s.append("")
    s.append("Figures below 90 % of the kernel alone's: " + (
        "none." if not below else "\n\n" + "\n".join(f"- {b}" for b in below)))
    s.append("")
    solo = read_csv(os.path.join(out, "solo.csv"))
    if solo:
        s.append("Solo baselines (`solo.csv`, each job alone on the BE CPUs, no pressure):\n")
        s.append("| job | level | runs | rate/min (each) | CPU s (each) | limit hits |")
        s.append("|---|---:|---:|---|---|---|")
        for (job, level), rs in sorted(groups([r for r in solo if r["status"] == "ok"],
                                              ["job", "level_pct"]).items()):
            s.append(f"| {job} | {level} % | {len(rs)} | "
                     f"{', '.join(fmt(num(r['rate_per_min'])) for r in rs)} | "
                     f"{', '.join(fmt(num(r['cpu_s']), '.1f') for r in rs)} | "
                     f"{', '.join(r['node_limit_hits'] for r in rs)} |")
        s.append("")
    # --- batch
    if batch:
        s.append("## Batch (k-means) at 70 % local memory\n")
        s.append("| mode | runs | total s (each) | median s | speedup | job sys s | "
                 "limit hits | reclaim CPU s/GiB |")
        s.append("|---|---:|---|---:|---:|---:|---:|---:|")
        for mode, rs in sorted(groups(bok, ["mode"]).items()):
            m = med([num(r["total_s"]) for r in rs])
            s.append(f"| {mode[0]} | {len(rs)} | "
                     f"{', '.join(fmt(num(r['total_s']), '.1f') for r in rs)} | "
                     f"{fmt(m, '.1f')} | {fmt(bk / m if bk and m else None, '.2f')}x | "
                     f"{fmt(med([num(r['job_sys_s']) for r in rs]), '.1f')} | "
                     f"{fmt(med([num(r['node_limit_hits']) for r in rs]))} | "
                     f"{fmt(med([num(r['reclaim_cpu_s_per_gib']) for r in rs]), '.2f')} |")
        s.append("")
    # --- machine noise, per run: what the lock cannot keep out
    if ok:
        s.append("## Machine busy share per run\n")
        s.append("CPU busy % of the whole machine and the share of the LC CPUs' time other "
                 "work took (their busy time less the LC service's and the load generator's; "
                 "the agent stays off them), in the measured phase. `--redo CHUNK` a chunk "
                 "whose runs show other work.\n")
        s.append("| chunk | service | level | mode | load 1 min | machine busy % | "
                 "LC CPUs foreign % | LC run delay ms | LC-CPU steal ms (seconds with steal / "
                 "measured) | p99 µs | p99 µs over steal-free seconds (share of requests) |")
        s.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in ok:
            s.append(f"| {r['chunk']} | {r.get('lc_service', '')} | {r['level_pct']} % | "
                     f"{r['mode']} | {fmt(num(r.get('loadavg_1m')), '.2f')} | "
                     f"{fmt(num(r.get('cpu_busy_pct')), '.0f')} | "
                     f"{fmt(num(r.get('lc_cpus_foreign_pct')), '.1f')} | "
                     f"{fmt(num(r.get('lc_run_delay_ms')), '.0f')} | "
                     f"{fmt(num(r.get('lc_cpus_steal_ms')), '.0f')} ({r.get('lc_steal_seconds') or '-'}"
                     f"/{r.get('lc_measured_seconds') or '-'}) | {fmt(num(r['p99_us']))} | "
                     f"{fmt(num(r.get('p99_steal_free_us')))} "
                     f"({pct(num(r.get('steal_free_request_share')))}) |")
        s.append("")
    if failed:
        s.append("## Failed runs\n")
        for r in failed:
            s.append(f"- {r['chunk']}: {r.get('lc_service', 'batch')} {r['level_pct']} % "
                     f"{r['mode']}: {r['status']}")
        s.append("")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(s) + "\n")
    return "\n".join(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="results directory (created)")
    ap.add_argument("--memcolo", default=os.path.join(ROOT, "target/release/memcolo"),
                    help="the build to copy and use for every chunk")
    ap.add_argument("--bin-dir", default=BIN_DIR,
                    help="where the copy goes (<dir>/<sha256 prefix>/memcolo); somewhere that "
                         "outlives the run, not /tmp")
    ap.add_argument("--rebind", action="store_true",
                    help="copy --memcolo again even if a binary is recorded")
    ap.add_argument("--list", action="store_true", help="print the plan and what is done")
    ap.add_argument("--only", help="comma-separated chunk names to run (still skips done ones)")
    ap.add_argument("--redo", help="comma-separated chunk names to run again even if done")
    ap.add_argument("--max-chunks", type=int, default=0,
                    help="stop after this many chunks (0: all)")
    ap.add_argument("--merge-only", action="store_true", help="merge and summarise only")
    ap.add_argument("--keep-going", action="store_true",
                    help="go on with the next chunk after a failed one")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument("--probe", action="store_true",
                    help="LC chunks: SCHED_FIFO wake-latency probes on both CPUs and the host "
                         "memory sampler beside the runs (probe_attr.py PART reads them)")
    ap.add_argument("--plan", choices=sorted(PLANS), default="full",
                    help="full: the side-by-side run; smoke: a short check of the machinery")
    a = ap.parse_args()
    global PLAN
    PLAN = PLANS[a.plan]
    out = os.path.abspath(a.out)
    for name, _, est in PLAN:
        assert est <= CHUNK_LIMIT_S, f"chunk {name} estimated at {est} s"
    if a.list:
        for name, args, est in PLAN:
            state = "done" if is_done(out, name) else "todo"
            print(f"{state:4}  {name:14} ~{est / 60:.1f} min  bench reclaim {' '.join(args)}")
        return 0
    if os.geteuid() != 0 and not (a.merge_only or a.dry_run):
        sys.exit("needs root (cgroups, zram)")
    os.makedirs(out, exist_ok=True)
    redo = set(a.redo.split(",")) if a.redo else set()
    only = set(a.only.split(",")) | redo if a.only else None
    names = {n for n, _, _ in PLAN}
    for n in (only or set()) | redo:
        if n not in names:
            sys.exit(f"no chunk {n}; see --list")
    ran, failed = 0, 0
    if not a.merge_only:
        benchlib.record_machine(out, " ".join(sys.argv))
        state = None if a.dry_run else bind_binary(out, a.memcolo, a.rebind, a.bin_dir)
        binary = state["binary"] if state else a.memcolo
        for name, args, _ in PLAN:
            if only is not None and name not in only:
                continue
            if is_done(out, name) and name not in redo:
                continue
            if a.max_chunks and ran >= a.max_chunks:
                break
            if name in redo and os.path.exists(os.path.join(chunk_dir(out, name), "DONE")):
                os.remove(os.path.join(chunk_dir(out, name), "DONE"))
            ran += 1
            if not run_chunk(out, name, args, binary, a.dry_run, a.probe):
                failed += 1
                if not a.keep_going:
                    log("stopping at the failed chunk (--keep-going goes on with the next)")
                    break
            if os.path.exists("/tmp/memcolo-wrapup"):
                log("/tmp/memcolo-wrapup exists: stopping after this chunk")
                break
    todo = [n for n, _, _ in PLAN if not is_done(out, n)]
    if a.dry_run:
        return 0
    runs, batch = merge(out)
    print(summary(out, runs, batch))
    if not todo:
        benchlib.publish(HERE, "side-by-side", out, report="summary.md",
                         command="sudo bench/reclaim/side_by_side.py --out %s --merge-only" % os.path.relpath(out, benchlib.REPO))
    if todo:
        log(f"not done yet: {', '.join(todo)}; run the same command again to resume")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
