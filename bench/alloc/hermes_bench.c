/* hermes_bench.c — the Hermes micro benchmark (Middleware'21 §5.2).
 * Allocates blocks of BLOCK bytes until TOTAL bytes (never freed), measuring for each
 * allocation the latency of malloc + the first write to every 4 KiB page of the block.
 * Modes: "b2b" (back to back, as in the paper); "paced": one allocation every
 * INTERVAL_NS, as a service's requests arrive, the thread sleeping until the next
 * absolute deadline (clock_nanosleep TIMER_ABSTIME, timer slack 1 ns) as a service waits
 * in epoll for its next request, leaving the CPU free; a deadline already past is served
 * at once (a queued request), so the average rate is kept even when the interval is
 * shorter than a sleep; "paced-spin": the same deadlines, busy-waiting between them
 * (the thread holds its CPU all the time). The allocator is whatever malloc the
 * process has (LD_PRELOAD selects it).
 * Before measuring, WARM_MB of memory is touched and unmapped, so that the VM's memory
 * is backed by the host (memory idle for a while costs several times more).
 * Resolution: on this VM both clock_gettime and the TSC advance in steps of 10 ns (two
 * readings back to back differ by 20 or 30 ns, rdtsc by 52 or 78 cycles at 2.6 GHz), so
 * a 1 KiB allocation reads 20, 30 or 40 ns and its p50 can only be one of those. The
 * step is not in phase with the loop, so a reading is the true duration rounded up or
 * down with the odds of its fraction (dithered): the interquartile mean (the mean of the
 * readings between p25 and p75) estimates the central latency to well below a step.
 * The timer's own cost is in every figure alike; its p50 and interquartile mean over
 * 100000 empty measurements are printed last.
 * Output: one CSV line on stdout, in us with 4 decimals (0.1 ns): n, mean, p50, p90,
 * p99, p99.9, max, min, interquartile mean, timer p50, timer interquartile mean; and
 * with a CDF path, rows "quantile,latency_us" for the plot.
 * With the environment variable HERMES_RAW=PATH, also every allocation in order:
 * "i,start_us,latency_ns" (start relative to the first allocation), for finding what
 * the slow ones coincide with; the first allocation's start on CLOCK_MONOTONIC goes to
 * stderr as "hermes_begin_mono_us,US" (libmemcolo's MEMCOLO_RSV_TRACE prints its origin
 * on the same clock, so the two line up).
 * usage: hermes_bench BLOCK TOTAL b2b|paced|paced-spin INTERVAL_NS [CDF_PATH] [WARM_MB] */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct(const uint64_t *v, size_t n, double q) {
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  if (i >= n) i = n - 1;
  return (double)v[i] / 1000.0;
}

/* mean of the sorted v[] between p25 and p75, in us */
static double iqm(const uint64_t *v, size_t n) {
  size_t a = n / 4, b = n - n / 4;
  if (b <= a) { a = 0; b = n; }
  double s = 0;
  for (size_t i = a; i < b; i++) s += (double)v[i];
  return s / (double)(b - a) / 1000.0;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s BLOCK TOTAL b2b|paced|paced-spin INTERVAL_NS [CDF_PATH] [WARM_MB]\n", argv[0]);
    return 2;
  }
  size_t block = strtoull(argv[1], NULL, 0), total = strtoull(argv[2], NULL, 0);
  int spin = strcmp(argv[3], "paced-spin") == 0;
  int paced = spin || strcmp(argv[3], "paced") == 0;
  if (!paced && strcmp(argv[3], "b2b") != 0) { fprintf(stderr, "mode must be b2b, paced or paced-spin\n"); return 2; }
  uint64_t interval = strtoull(argv[4], NULL, 0);
  const char *cdf = argc > 5 && argv[5][0] ? argv[5] : NULL;
  size_t warm_mb = argc > 6 ? strtoull(argv[6], NULL, 0) : 1536;
  if (block == 0 || total < block) { fprintf(stderr, "bad sizes\n"); return 2; }
  size_t n = total / block;
  uint64_t *lat = (uint64_t *)mmap(NULL, n * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  const char *raw = getenv("HERMES_RAW");
  uint64_t *start = raw && raw[0] ? (uint64_t *)mmap(NULL, n * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0)
                                  : NULL;
  if (lat == MAP_FAILED || start == MAP_FAILED) { perror("mmap"); return 1; }
  if (paced && !spin) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  if (warm_mb) {
    size_t w = warm_mb << 20;
    char *m = (char *)mmap(NULL, w, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      for (size_t i = 0; i < w; i += 4096) m[i] = 1;
      munmap(m, w);
    }
  }
  /* the timer's own cost: empty measurements (in lat[], sorted) */
  size_t nt = n < 100000 ? n : 100000;
  for (size_t i = 0; i < nt; i++) {
    uint64_t a = now_ns();
    lat[i] = now_ns() - a;
  }
  qsort(lat, nt, sizeof(uint64_t), cmp_u64);
  double timer_p50 = pct(lat, nt, 0.5), timer_iqm = iqm(lat, nt);
  /* let a management thread (if any) see the process start */
  void *first = malloc(16);
  free(first);
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  uint64_t next = now_ns(), begin = next;
  for (size_t i = 0; i < n; i++) {
    if (paced) {
      next += interval;
      if (spin) {
        while (now_ns() < next) { }
      } else if (now_ns() < next) {
        struct timespec dl = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &dl, NULL) != 0) { }
      }
    }
    uint64_t t0 = now_ns();
    if (start) start[i] = t0 - begin;
    char *p = (char *)malloc(block);
    if (p == NULL) { fprintf(stderr, "malloc failed at %zu\n", i); return 1; }
    for (size_t off = 0; off < block; off += 4096) p[off] = (char)i;
    p[block - 1] = (char)i;
    lat[i] = now_ns() - t0;
  }
  if (start) {
    fprintf(stderr, "hermes_begin_mono_us,%llu\n", (unsigned long long)(begin / 1000));
    FILE *f = fopen(raw, "w");
    if (f) {
      fprintf(f, "i,start_us,latency_ns\n");
      for (size_t i = 0; i < n; i++) fprintf(f, "%zu,%.1f,%llu\n", i, (double)start[i] / 1000.0, (unsigned long long)lat[i]);
      fclose(f);
    }
  }
  qsort(lat, n, sizeof(uint64_t), cmp_u64);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += (double)lat[i];
  printf("%zu,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n", n, sum / (double)n / 1000.0, pct(lat, n, 0.5),
         pct(lat, n, 0.9), pct(lat, n, 0.99), pct(lat, n, 0.999), (double)lat[n - 1] / 1000.0, (double)lat[0] / 1000.0,
         iqm(lat, n), timer_p50, timer_iqm);
  if (cdf) {
    FILE *f = fopen(cdf, "w");
    if (f) {
      fprintf(f, "quantile,latency_us\n");
      for (int k = 0; k <= 1000; k++) {
        double q = k / 1000.0;
        fprintf(f, "%.4f,%.3f\n", q, pct(lat, n, q));
      }
      /* the tail in more detail */
      for (int k = 1; k <= 100; k++) {
        double q = 0.999 + k * 0.00001;
        if (q > 1) q = 1;
        fprintf(f, "%.5f,%.3f\n", q, pct(lat, n, q));
      }
      fclose(f);
    }
  }
  return 0;
}
