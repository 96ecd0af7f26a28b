/* fault_prog.c — the workload of the fault-injection tests (test/faults.sh), run with
 * libmemcolo (and test/faultshim.c) preloaded. Plain libc calls only: it links no
 * allocator itself.
 *   fault_prog work [SECONDS]  two threads allocate small objects (16 B .. 32 KiB),
 *                              large blocks (64 KiB .. 1 MiB), dedicated regions (2 ..
 *                              24 MiB), calloc (checked zero) and realloc chains for
 *                              about SECONDS (default 0.5), writing and checking
 *                              every block; any NULL is a failure.
 *   fault_prog hold [SECONDS]  holds 24 MiB of 128-byte objects (dense huge pages: the
 *                              management thread collapses them into THPs) while
 *                              taking and freeing 256 KiB blocks every 2 ms (the
 *                              Hermes pool, mlocked) for the first 40 % of SECONDS
 *                              (default 3), then idle (collapses wait for a quiet
 *                              second in class lc), frees it all and calls
 *                              malloc_trim (MADV_DONTNEED of every free page).
 *   fault_prog oneclass        a fresh process allocates 40000 blocks of 288 bytes (the
 *                              size of the DTV that pthread_create callocs) and checks
 *                              them: the heap's 4th huge page is taken inside a refill of
 *                              that class, where the management thread is started
 *                              (pthread_create, which allocates from the same class).
 *   fault_prog refuse          the system refuses every mapping: malloc of 100 B and
 *                              of 64 MiB must return NULL with errno ENOMEM (no
 *                              crash, no abort).
 * Prints "N passed, N failed" on stdout (written with write(2): stdio may find no
 * memory in `refuse`). */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double seconds = 0.5;

static void say(const char *s) { if (write(2, s, strlen(s)) < 0) _exit(3); }

static void check(int ok, const char *what) {
  pthread_mutex_lock(&mu);
  if (ok) passed++;
  else {
    failed++;
    if (failed <= 10) { say("FAIL fault_prog: "); say(what); say("\n"); }
  }
  pthread_mutex_unlock(&mu);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

#define SLOTS 512
static void *worker(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg * 7919 + 1;
  void *slot[SLOTS] = {0};
  size_t len[SLOTS] = {0};
  unsigned char tag[SLOTS] = {0};
  int nulls = 0;
  double end = now_s() + seconds;
  for (unsigned long it = 0; now_s() < end || it < 2000; it++) {
    unsigned i = (unsigned)(rnd(&seed) % SLOTS);
    if (slot[i]) {
      /* the block still holds what was written into it */
      const unsigned char *p = slot[i];
      if (p[0] != tag[i] || p[len[i] - 1] != tag[i] || p[len[i] / 2] != tag[i]) check(0, "block content changed");
      free(slot[i]);
      slot[i] = NULL;
    }
    uint64_t r = rnd(&seed);
    size_t n;
    unsigned kind = (unsigned)(r % 100);
    if (kind < 80) n = 16 + (size_t)(r >> 8) % 32768;                      /* small */
    else if (kind < 95) n = ((size_t)64 << 10) + (size_t)(r >> 8) % (1u << 20); /* large */
    else n = ((size_t)2 << 20) + (size_t)(r >> 8) % ((size_t)22 << 20);    /* region */
    void *p;
    if ((r >> 40) % 4 == 0) {
      p = calloc(1, n);
      if (p) {
        const unsigned char *c = p;
        int zero = c[0] == 0 && c[n - 1] == 0 && c[n / 2] == 0;
        for (size_t k = 0; zero && k < n; k += 4096) zero = c[k] == 0;
        check(zero, "calloc memory is not zero");
      }
    } else if ((r >> 40) % 4 == 1) {
      /* a realloc chain from 100 bytes */
      p = malloc(100);
      for (size_t m = 100; p && m < n;) {
        m = m * 3 < n ? m * 3 : n;
        memset(p, 0x5a, 16);
        void *q = realloc(p, m);
        if (q == NULL) { free(p); p = NULL; break; }
        p = q;
        if (((unsigned char *)p)[15] != 0x5a) check(0, "realloc lost the block's content");
      }
    } else {
      p = malloc(n);
    }
    if (p == NULL) { nulls++; continue; }
    tag[i] = (unsigned char)(r >> 56) | 1;
    len[i] = n;
    memset(p, tag[i], n < 4096 ? n : 4096);
    ((unsigned char *)p)[n / 2] = tag[i];
    ((unsigned char *)p)[n - 1] = tag[i];
    slot[i] = p;
  }
  for (unsigned i = 0; i < SLOTS; i++) free(slot[i]);
  check(nulls == 0, "malloc/calloc/realloc returned NULL while memory was available");
  return NULL;
}

static void result(void) {
  char buf[64];
  int n = snprintf(buf, sizeof buf, "%d passed, %d failed\n", passed, failed);
  if (write(1, buf, (size_t)n) < 0) _exit(3);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "work";
  if (strcmp(mode, "refuse") == 0) {
    errno = 0;
    void *a = malloc(100);
    check(a == NULL && errno == ENOMEM, "malloc(100) with every mapping refused: NULL, ENOMEM");
    errno = 0;
    void *b = malloc((size_t)64 << 20);
    check(b == NULL && errno == ENOMEM, "malloc(64 MiB) with every mapping refused: NULL, ENOMEM");
    void *c = calloc(1000, 1000);
    check(c == NULL, "calloc with every mapping refused: NULL");
    result();
    return failed ? 1 : 0;
  }
  if (argc > 2) seconds = atof(argv[2]);
  if (strcmp(mode, "oneclass") == 0) {
    enum { N = 40000 };
    static unsigned *obj[N];
    int nulls = 0, bad = 0;
    for (int i = 0; i < N; i++) {
      obj[i] = malloc(288);
      if (obj[i] == NULL) { nulls++; continue; }
      obj[i][0] = (unsigned)i;
      obj[i][71] = (unsigned)i;
    }
    for (int i = 0; i < N; i++)
      if (obj[i] && (obj[i][0] != (unsigned)i || obj[i][71] != (unsigned)i)) bad++;
    for (int i = 0; i < N; i++) free(obj[i]);
    check(nulls == 0, "malloc returned NULL while memory was available");
    check(bad == 0, "a block was handed out twice");
    result();
    return failed ? 1 : 0;
  }
  if (strcmp(mode, "hold") == 0) {
    if (argc <= 2) seconds = 3;
    enum { N = 196608 };
    static unsigned char *obj[N];
    int nulls = 0;
    for (int i = 0; i < N; i++) {
      obj[i] = malloc(128);
      if (obj[i] == NULL) { nulls++; continue; }
      memset(obj[i], i & 0xff, 128);
    }
    double t0 = now_s(), end = t0 + seconds;
    while (now_s() < end) {
      struct timespec ts = {0, 2000000};
      if (now_s() > t0 + 0.4 * seconds) { nanosleep(&ts, NULL); continue; }
      unsigned char *b = malloc((size_t)256 << 10);
      if (b == NULL) { nulls++; continue; }
      memset(b, 1, (size_t)256 << 10);
      free(b);
      nanosleep(&ts, NULL);
    }
    int intact = 1;
    for (int i = 0; i < N; i++) {
      if (obj[i] && (obj[i][0] != (i & 0xff) || obj[i][127] != (i & 0xff))) intact = 0;
      free(obj[i]);
    }
    check(intact, "held objects changed");
    malloc_trim(0); /* every free page back to the OS (MADV_DONTNEED) */
    check(nulls == 0, "malloc returned NULL while memory was available");
    result();
    return failed ? 1 : 0;
  }
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    check(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1)) == 0, "pthread_create (its TLS comes from calloc)");
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  result();
  return failed ? 1 : 0;
}
