"""Helpers the Python benchmarks share: the zram swap device, scratch cgroup v1
memory groups below this process's own (``scratch_cgroup``, ``in_cgroup``,
``cg_remove``) and their files, the machine's CPU time (for its busy share), plans
of interleaved runs worked through in locked slices (``interleaved``, ``RunLog``,
``Budget``), and where results go: raw output under ``bench/out/<experiment>/<run>/`` (ignored by git) with
the machine and commit of each invocation (``record_machine``), and the committed
summary ``bench/<experiment>/RESULTS.md`` written from a run's report (``publish``).

The zram and cgroup functions need root. A script in ``bench/<name>/`` imports this
module after ``sys.path.insert(0, <bench dir>)``. From the shell, a report already
written can be published into an experiment's summary::

    python3 bench/benchlib.py publish bench/agent-cost latest bench/out/agent-cost/latest
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ZRAM = "/dev/zram0"


def zram_on(mib):
    """Makes ``/dev/zram0`` a swap device of ``mib`` MiB, reset first.

    Raises ``subprocess.CalledProcessError`` if mkswap or swapon fails and
    ``OSError`` if the zram sysfs files cannot be written."""
    subprocess.run(["swapoff", ZRAM], capture_output=True)
    with open("/sys/block/zram0/reset", "w") as f:
        f.write("1")
    with open("/sys/block/zram0/disksize", "w") as f:
        f.write(str(mib << 20))
    subprocess.run(["mkswap", ZRAM], check=True, capture_output=True)
    subprocess.run(["swapon", ZRAM], check=True, capture_output=True)


def zram_off():
    """Turns ``/dev/zram0`` swap off and resets the device. swapoff can fail while
    swapped pages are being read back; it is retried for up to 10 s. A reset
    that fails is reported on stderr, never raised (this runs in cleanup)."""
    for _ in range(10):
        if subprocess.run(["swapoff", ZRAM], capture_output=True).returncode == 0:
            break
        time.sleep(1)
    try:
        with open("/sys/block/zram0/reset", "w") as f:
            f.write("1")
    except OSError as e:
        print(f"warning: zram reset: {e}", file=sys.stderr)


def own_memory_cgroup():
    """This process's cgroup v1 memory path (relative to the controller's mount),
    from ``/proc/self/cgroup``; exits with a message where there is none."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctrls.split(","):
                return path
    raise SystemExit("no cgroup v1 memory controller in /proc/self/cgroup")


def cg_write(cg, name, value):
    """Writes ``value`` to the file ``name`` of cgroup directory ``cg``; raises
    ``OSError`` as the kernel answers (e.g. EBUSY for a limit below usage)."""
    with open(os.path.join(cg, name), "w") as f:
        f.write(str(value))


def cg_int(cg, name):
    """The first number in the file ``name`` of ``cg``; 0 where the file is missing
    or holds no number (a group removed under the benchmark)."""
    try:
        with open(os.path.join(cg, name)) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


CG_ROOT = "/sys/fs/cgroup/memory"


def scratch_cgroup(name, limit_bytes=None):
    """Creates (or reuses) the scratch memory group ``<own group>/<name>`` below this
    process's own cgroup v1 memory group and returns its directory; sets
    ``memory.limit_in_bytes`` when ``limit_bytes`` is given. Remove it with
    ``cg_remove``. Raises ``SystemExit`` without a v1 memory controller and
    ``OSError`` as the kernel answers."""
    if not os.path.isdir(CG_ROOT):
        raise SystemExit("no cgroup v1 memory controller at " + CG_ROOT)
    cg = CG_ROOT + own_memory_cgroup().rstrip("/") + "/" + name
    os.makedirs(cg, exist_ok=True)
    if limit_bytes is not None:
        cg_write(cg, "memory.limit_in_bytes", limit_bytes)
    return cg


def cg_add(cg, pid):
    """Moves process ``pid`` into ``cg`` (``cgroup.procs``); raises ``OSError``."""
    cg_write(cg, "cgroup.procs", pid)


def in_cgroup(cg, argv):
    """``argv`` wrapped so that the process joins ``cg`` before it execs: the command
    starts inside the group, so every page it charges is the group's."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg] + list(argv)


def cg_pids(cg):
    """The pids in ``cg`` (``cgroup.procs``); [] where the group is gone."""
    try:
        with open(os.path.join(cg, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def cg_remove(cg):
    """Removes the scratch group ``cg`` and its children: kills what is left in them
    (only the benchmark's own processes can be there), drops their page cache
    (``memory.force_empty``) and removes the directories, retrying for ~5 s each.
    Never raises (this runs in cleanup); a group that stays is reported on stderr."""
    if not os.path.isdir(cg):
        return
    for sub in sorted(os.listdir(cg)):
        p = os.path.join(cg, sub)
        if os.path.isdir(p):
            cg_remove(p)
    for _ in range(50):
        pids = cg_pids(cg)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    try:
        cg_write(cg, "memory.force_empty", 0)
    except OSError:
        pass
    for _ in range(50):
        try:
            os.rmdir(cg)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    print("warning: scratch cgroup %s not removed" % cg, file=sys.stderr)


def cpu_times():
    """(idle + iowait, total) jiffies over all CPUs, from the ``cpu`` line of /proc/stat;
    the busy share over an interval is 1 - d(idle) / d(total)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return v[3] + v[4], sum(v)


# ---------------------------------------------------------------------------
# Interleaved runs worked through in locked slices
#
# A plan is a list of runs, each with an id. Repetitions interleave the
# configurations, the order rotated by one each repetition, so drift of the shared
# machine falls on every configuration alike. Each invocation (under
# ``flock /tmp/memcolo-bench.lock``, taken by the caller's command line) runs what
# ``runs.jsonl`` does not hold yet until its time budget is spent, so a long plan is
# done in slices of a few minutes and the lock changes hands between them.

LOCK = "/tmp/memcolo-bench.lock"


def interleaved(configs, reps):
    """``(config, rep)`` pairs: ``reps`` rounds of every element of ``configs``, round
    ``r`` starting at element ``r mod len(configs)``."""
    configs = list(configs)
    out = []
    for r in range(reps):
        k = r % len(configs) if configs else 0
        out += [(c, r) for c in configs[k:] + configs[:k]]
    return out


class RunLog:
    """The journal ``OUT/runs.jsonl`` of a plan: one JSON object per finished run,
    identified by its field ``key``. Lines that do not parse (a run killed while
    writing) are skipped."""

    def __init__(self, out, key="run"):
        self.path = os.path.join(out, "runs.jsonl")
        self.key = key
        self.records = {}
        try:
            with open(self.path) as f:
                for line in f:
                    try:
                        r = json.loads(line)
                        self.records[r[key]] = r
                    except (ValueError, KeyError, TypeError):
                        pass
        except FileNotFoundError:
            pass

    def __contains__(self, run_id):
        return run_id in self.records

    def append(self, rec):
        """Appends ``rec`` (a dict with the key field) and flushes it to disk."""
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records[rec[self.key]] = rec


class Budget:
    """``spent()`` once ``seconds`` have passed since it was made: a slice starts no
    run after that (a run started is finished)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.start = time.monotonic()

    def spent(self):
        return time.monotonic() - self.start > self.seconds



def pending(configs, reps, log, budget):
    """The runs of ``configs`` x ``reps`` (in ``interleaved`` order) that ``log`` (a
    ``RunLog``) does not hold yet, as ``(config, rep, run_id)`` with run_id
    ``"<config>-r<rep>"``, while ``budget`` is not spent. Returns ``(runs, left)``:
    ``runs`` a generator, ``left()`` the number of runs not started for the budget."""
    skipped = [0]

    def runs():
        for c, rep in interleaved(configs, reps):
            rid = "%s-r%d" % (c, rep)
            if rid in log:
                continue
            if budget.spent():
                skipped[0] += 1
                continue
            yield c, rep, rid

    return runs(), lambda: skipped[0]

# ---------------------------------------------------------------------------
# Output folders and committed summaries
#
# Raw output of every experiment goes to ``bench/out/<experiment>/<run>/`` (ignored
# by git). What is committed is the experiment's ``RESULTS.md``: one section per
# plan, regenerated from the run's ``report.md`` by ``publish`` (the report
# scripts call it), and at most a few PNGs under ``<experiment>/figures/``.

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)


def out_dir(experiment, run):
    """The default raw-output folder of one run of ``experiment``:
    ``bench/out/<experiment>/<run>`` (not created here)."""
    return os.path.join(BENCH, "out", experiment, run)


def _git(*args):
    try:
        r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    except OSError:
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def machine():
    """This machine and checkout as a dict: ``date`` (UTC, ISO 8601), ``commit``
    (short hash, ``+dirty`` when the tree has changes), ``host``, ``kernel``,
    ``cpus`` and ``mem_gib`` (MemTotal of /proc/meminfo)."""
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    commit = _git("rev-parse", "--short", "HEAD") or "?"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    u = os.uname()
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "host": u.nodename,
        "kernel": u.release,
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kib / (1 << 20), 1),
    }


def record_machine(out, command=None):
    """Adds this machine and checkout (``machine()``, with ``command``) to
    ``OUT/machine.json``, a list with one entry per invocation of a runner, so a
    run worked through in several locked slices keeps every slice's commit."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "machine.json")
    entries = read_machine(out)
    m = machine()
    if command is not None:
        m["command"] = command
    entries.append(m)
    with open(path, "w") as f:
        json.dump(entries, f, indent=1)
        f.write("\n")


def read_machine(out):
    """The entries of ``OUT/machine.json`` (``record_machine``); [] where it is
    missing or unreadable."""
    try:
        with open(os.path.join(out, "machine.json")) as f:
            v = json.load(f)
    except (OSError, ValueError):
        return []
    return v if isinstance(v, list) else [v]


def _provenance(out, command):
    entries = read_machine(out)
    if not entries:
        return "Run: `%s` (no `machine.json`: date, commit and machine unknown)." % out
    dates = sorted(e.get("date", "?") for e in entries)
    commits = []
    for e in entries:
        if e.get("commit") not in commits:
            commits.append(e.get("commit"))
    first = entries[0]
    when = dates[0][:10] if dates[0][:10] == dates[-1][:10] else "%s to %s" % (dates[0][:10], dates[-1][:10])
    s = "Run of %s at commit %s on %s (%s CPUs, %s GiB, Linux %s)." % (
        when, ", ".join(str(c) for c in commits), first.get("host", "?"),
        first.get("cpus", "?"), first.get("mem_gib", "?"), first.get("kernel", "?"))
    if command:
        s += " Regenerate this section with `%s`." % command
    return s


def _demote(heading):
    """A markdown heading moved below the section's own ``##`` (at least ``###``)."""
    return "##" + heading if heading.startswith("# ") else "#" + heading


def publish(experiment_dir, section, out, command=None, figures=(), notes="notes.md", report="report.md"):
    """Writes section ``section`` of ``EXPERIMENT_DIR/RESULTS.md`` from
    ``OUT/<report>`` (default ``report.md``): its date, commit and machine (``OUT/machine.json``), the
    report with its title dropped and headings one level down, and ``OUT/<notes>``
    (a hand-written reading of the run, default ``notes.md``) when present. Images named in
    ``figures`` (paths relative to ``OUT``) are copied to
    ``EXPERIMENT_DIR/figures/<section>-<name>`` and linked; other images are
    dropped. Text outside the section's ``<!-- section: NAME -->`` ...
    ``<!-- end: NAME -->`` markers is kept as it is. Only runs under ``bench/out/``
    are published (a run elsewhere, e.g. a smoke test in /tmp, leaves RESULTS.md
    alone); returns whether the section was written. Raises ``OSError`` where the
    report cannot be read."""
    outs = os.path.join(BENCH, "out")
    if os.path.commonpath([os.path.abspath(out), outs]) != outs:
        print("%s is not under bench/out: %s/RESULTS.md left as it is" % (out, experiment_dir), file=sys.stderr)
        return False
    with open(os.path.join(out, report)) as f:
        lines = f.read().splitlines()
    figdir = os.path.join(experiment_dir, "figures")
    body = []
    for line in lines:
        if line.startswith("# ") and not body:
            continue
        img = re.match(r"!\[[^]]*\]\(([^)]+)\)\s*$", line)
        if img:
            src = img.group(1)
            if src not in figures:
                continue
            os.makedirs(figdir, exist_ok=True)
            name = "%s-%s" % (section, os.path.basename(src))
            shutil.copyfile(os.path.join(out, src), os.path.join(figdir, name))
            line = "![%s](figures/%s)" % (name, name)
        elif line.startswith("#"):
            line = _demote(line)
        body.append(line)
    if notes and os.path.exists(os.path.join(out, notes)):
        with open(os.path.join(out, notes)) as f:
            n = f.read().splitlines()
        body += ["", "### Notes on this run", ""]
        body += [_demote(l) if l.startswith("#") else l for l in n[1 if n and n[0].startswith("# ") else 0:]]
    while body and not body[0].strip():
        body.pop(0)
    begin, end = "<!-- section: %s -->" % section, "<!-- end: %s -->" % section
    text = [begin, "## %s" % section, "", _provenance(out, command), ""] + body + [end]
    path = os.path.join(experiment_dir, "RESULTS.md")
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = "# Results of bench/%s\n\n" % os.path.basename(os.path.normpath(experiment_dir))
    new = "\n".join(text)
    if begin in old and end in old:
        old = old[:old.index(begin)] + new + old[old.index(end) + len(end):]
    else:
        old = old.rstrip("\n") + "\n\n" + new + "\n"
    with open(path, "w") as f:
        f.write(old)
    return True


if __name__ == "__main__":
    # python3 bench/benchlib.py publish EXPERIMENT_DIR SECTION OUT [FIGURE...]
    if len(sys.argv) >= 5 and sys.argv[1] == "publish":
        publish(sys.argv[2], sys.argv[3], sys.argv[4], figures=sys.argv[5:])
    else:
        raise SystemExit("usage: benchlib.py publish EXPERIMENT_DIR SECTION OUT [FIGURE...]")
