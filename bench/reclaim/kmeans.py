#!/usr/bin/python3
"""A batch job for `memcolo bench reclaim --batch`: Lloyd's k-means with numpy.

Usage: kmeans.py --bytes N [--dims D] [--k K] [--iters I] [--chunk-bytes C] [--seed S]
                 [--wait-stdin]

Builds N bytes of float32 points (N / (4 D) points of D dimensions, drawn around K
centres), then runs I iterations of Lloyd's algorithm over them in chunks of C bytes,
so that the points array is the working set and the temporaries stay small. Every
iteration reads every point once: under a memory limit below the working set each
iteration pages the part that does not fit back in (Hermit, NSDI'23, batch
throughput experiment: Spark / XGBoost k-means-like jobs with 50-100 % of their
working set in local memory).

With --wait-stdin it starts (and starts its clock) only when a line arrives on
stdin, so that a benchmark can register it with the agent first.

Prints one JSON line on stdout: {"points", "bytes", "gen_s", "iter_s": [...],
"total_s", "inertia", "maxrss_bytes", "user_s", "sys_s", "major_faults"}. Times are
wall-clock seconds (monotonic) except user_s / sys_s (CPU time of the job, getrusage).
One thread: OpenBLAS / OpenMP threads are pinned to 1 by the caller's environment
(OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1) so the job uses one CPU.
"""
import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, required=True, help="bytes of points")
    ap.add_argument("--dims", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--chunk-bytes", type=int, default=4 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--wait-stdin", action="store_true")
    a = ap.parse_args()
    if a.bytes <= 0 or a.dims <= 0 or a.k <= 0 or a.iters <= 0 or a.chunk_bytes <= 0:
        sys.exit("kmeans.py: sizes must be positive")
    if a.wait_stdin:
        sys.stdin.readline()

    t0 = time.monotonic()
    n = a.bytes // (4 * a.dims)
    rows = max(1, a.chunk_bytes // (4 * a.dims))
    rng = np.random.default_rng(a.seed)
    centres = rng.uniform(-10.0, 10.0, size=(a.k, a.dims)).astype(np.float32)
    # One chunk of noise, reused with fresh labels per chunk: generating the points
    # costs about what one iteration does, so the run is dominated by the iterations.
    noise = rng.standard_normal((rows, a.dims), dtype=np.float32)
    x = np.empty((n, a.dims), dtype=np.float32)
    for s in range(0, n, rows):
        e = min(n, s + rows)
        lab = rng.integers(0, a.k, size=e - s)
        np.add(centres[lab], noise[: e - s], out=x[s:e])
    gen_s = time.monotonic() - t0

    # Initial centres: K points spread over the array (deterministic).
    c = x[np.linspace(0, n - 1, a.k).astype(np.int64)].copy()
    iter_s = []
    inertia = 0.0
    for _ in range(a.iters):
        ti = time.monotonic()
        sums = np.zeros((a.k, a.dims), dtype=np.float64)
        counts = np.zeros(a.k, dtype=np.int64)
        inertia = 0.0
        cc = (c * c).sum(axis=1)
        for s in range(0, n, rows):
            xs = x[s : min(n, s + rows)]
            # ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2; ||x||^2 is constant per row.
            d = cc[None, :] - 2.0 * (xs @ c.T)
            lab = d.argmin(axis=1)
            inertia += float((xs * xs).sum()) + float(d[np.arange(len(lab)), lab].sum())
            counts += np.bincount(lab, minlength=a.k)
            onehot = np.zeros((len(lab), a.k), dtype=np.float32)
            onehot[np.arange(len(lab)), lab] = 1.0
            sums += onehot.T @ xs
        nz = counts > 0
        c[nz] = (sums[nz] / counts[nz, None]).astype(np.float32)
        iter_s.append(time.monotonic() - ti)
    total_s = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "points": n,
                "bytes": int(x.nbytes),
                "gen_s": gen_s,
                "iter_s": iter_s,
                "total_s": total_s,
                "inertia": inertia,
                "maxrss_bytes": ru.ru_maxrss * 1024,
                "user_s": ru.ru_utime,
                "sys_s": ru.ru_stime,
                "major_faults": ru.ru_majflt,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
