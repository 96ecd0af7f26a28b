#!/usr/bin/env python3
"""Sample the VM's own memory management every 250 ms, for stall attribution.

This machine's host-facing memory management is not memcolo's: free page reporting
(virtio balloon, order 5: free 128 KiB blocks are reported to the host, which drops
their backing and faults it back in on the next touch) and a DAMON `paddr` pageout
scheme (kdamond.0: with swap on it swaps out idle anonymous memory of every process).
Both can cost a process first-touch time that no policy of ours makes. One CSV row per
sample:

  mono_s          CLOCK_MONOTONIC, seconds (the clock of `perf record -k mono`)
  reported_kib    /sys/module/page_reporting/parameters/reported_kib (cumulative KiB)
  passes          .../passes (cumulative reporting passes)
  kdamond_cpu_ms  utime + stime of kdamond.* threads, ms (cumulative)
  steal_ms_cpuN   steal ticks of CPU N in /proc/stat, ms (cumulative)
  pswpin, pswpout /proc/vmstat (cumulative pages)
  pgmajfault      /proc/vmstat (cumulative)

(DAMON's own scheme stats refresh only on a write to the kdamond's state file, which
is the host's to make; kdamond's CPU time is read instead.)

Runs until SIGINT/SIGTERM:  host_mm_sampler.py OUT.csv [interval_s]
"""
import glob, os, signal, sys, time

PR = '/sys/module/page_reporting/parameters/'
HZ = os.sysconf('SC_CLK_TCK')


def read(path, default=0):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def kdamond_pids():
    out = []
    for d in glob.glob('/proc/[0-9]*/comm'):
        try:
            if open(d).read().startswith('kdamond'):
                out.append(d.split('/')[2])
        except OSError:
            pass
    return out


def kdamond_cpu_ms(pids):
    ms = 0
    for p in pids:
        try:
            f = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()
            ms += (int(f[11]) + int(f[12])) * 1000 // HZ
        except (OSError, IndexError, ValueError):
            pass
    return ms


def steal_ms():
    out = {}
    for line in open('/proc/stat'):
        if line.startswith('cpu') and line[3].isdigit():
            f = line.split()
            out[f[0]] = int(f[8]) * 1000 // HZ
    return out


def vmstat(keys):
    v = {}
    for line in open('/proc/vmstat'):
        k, n = line.split()
        if k in keys:
            v[k] = int(n)
    return [v.get(k, 0) for k in keys]


def main():
    out = open(sys.argv[1], 'w', buffering=1)
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.25
    stop = []
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    pids = kdamond_pids()
    cpus = sorted(steal_ms(), key=lambda c: int(c[3:]))
    keys = ['pswpin', 'pswpout', 'pgmajfault']
    out.write(','.join(['mono_s', 'reported_kib', 'passes', 'kdamond_cpu_ms']
                       + [f'steal_ms_{c}' for c in cpus] + keys) + '\n')
    while not stop:
        st = steal_ms()
        row = [f'{time.clock_gettime(time.CLOCK_MONOTONIC):.6f}',
               read(PR + 'reported_kib'), read(PR + 'passes'), kdamond_cpu_ms(pids)]
        row += [st.get(c, 0) for c in cpus] + vmstat(keys)
        out.write(','.join(map(str, row)) + '\n')
        time.sleep(interval)


if __name__ == '__main__':
    main()
