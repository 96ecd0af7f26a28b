/* bursty.c — the three bursty small-object patterns of libmemcolo issue 27, on which
 * the LC reservation's footprint is judged against glibc's peak RSS:
 *   mstress   multi-threaded bursty stress (after mimalloc-bench's mstress): THREADS (4)
 *             threads, ROUNDS rounds; in each a thread allocates a burst of 8,000
 *             objects of 16..512 B (one in 64 of 1..8 KiB), frees three quarters in
 *             random order, hands half of the rest to the next thread through a shared
 *             slot array (frees there are cross-thread) and frees the rest at the end of
 *             the round; ~2 MiB live per thread at the burst's peak
 *   loop      single-threaded malloc/free loop (after glibc-simple): 128 live slots,
 *             each iteration replaces a random one with a new block of 16..512 B
 *   xthread   cross-thread producer/consumer (after xmalloc-test): THREADS/2 producers
 *             allocate batches of 256 blocks of 16..1024 B and queue them; as many
 *             consumers free them; the queue holds at most 64 batches (~8 MiB)
 * usage: bursty MODE [ITERS] [THREADS]   (ITERS: rounds, millions of iterations, or
 * thousands of batches per producer; defaults 40, 20, 40; THREADS default 4)
 * Prints one CSV line:
 *   "<mode>,<threads>,<wall s>,<user s>,<sys s>,<peak RSS KiB>,<peak RSS outside the
 *    reservation KiB>,<reservation at that sample KiB>,<largest reservation KiB>"
 * where peak RSS is VmHWM, and the reservation is libmemcolo's reserved_bytes
 * (memcolo_stats, found with dlsym; 0 under other allocators), sampled with RSS
 * (/proc/self/statm) every millisecond by a thread that allocates nothing. The allocator
 * comes from LD_PRELOAD (bench/alloc/run_patterns.py). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../../alloc/include/memcolo.h"

static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void *xmalloc(size_t n) {
  char *p = malloc(n);
  if (p == NULL) {
    fprintf(stderr, "bursty: malloc(%zu) returned NULL\n", n);
    exit(1);
  }
  p[0] = 1;
  p[n - 1] = 1;
  return p;
}

/* ------------------------------------------------------------ the sampler */
static volatile int sampling = 1;
static int (*stats_fn)(memcolo_stats_t *);
static long page_kib;
static long max_outside_kib, rsv_at_max_kib, max_rsv_kib;

static long rss_kib(int fd) {
  char buf[128];
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return -1;
  buf[n] = 0;
  char *c = strchr(buf, ' '); /* statm: size resident ... (pages) */
  return c ? strtol(c + 1, NULL, 10) * page_kib : -1;
}

static void sample(int fd) {
  long rsv = 0;
  if (stats_fn) {
    memcolo_stats_t st;
    if (stats_fn(&st) == 0 && st.version >= 3) rsv = (long)(st.reserved_bytes >> 10);
  }
  long rss = rss_kib(fd);
  if (rss < 0) return;
  if (rss - rsv > max_outside_kib) { max_outside_kib = rss - rsv; rsv_at_max_kib = rsv; }
  if (rsv > max_rsv_kib) max_rsv_kib = rsv;
}

static void *sampler(void *a) {
  int fd = *(int *)a;
  struct timespec ms = {0, 1000 * 1000};
  while (sampling) {
    sample(fd);
    nanosleep(&ms, NULL);
  }
  return NULL;
}

/* ------------------------------------------------------------ mstress */
enum { BURST = 8000, XFER = 1024 };
static int n_threads = 4;
static long n_iters;
static void *xfer[64][XFER]; /* per thread: objects handed to it by the previous thread */
static pthread_mutex_t xfer_lock[64];
static pthread_barrier_t round_barrier;

static size_t small_size(uint64_t *s) {
  uint64_t r = rnd(s);
  return (r & 63) == 0 ? 1024 + (r >> 8) % 7168 : 16 + (r >> 8) % 497;
}

static void *mstress(void *a) {
  int id = (int)(uintptr_t)a, next = (id + 1) % n_threads;
  uint64_t s = (uint64_t)id * 7919 + 1;
  void **v = xmalloc(BURST * sizeof(void *));
  for (long round = 0; round < n_iters; round++) {
    for (int i = 0; i < BURST; i++) v[i] = xmalloc(small_size(&s));
    for (int i = BURST - 1; i > 0; i--) {
      int j = (int)(rnd(&s) % (uint64_t)(i + 1));
      void *t = v[i];
      v[i] = v[j];
      v[j] = t;
    }
    for (int i = 0; i < BURST * 3 / 4; i++) free(v[i]);
    int keep0 = BURST * 3 / 4, half = (BURST - keep0) / 2;
    if (half > XFER) half = XFER;
    pthread_mutex_lock(&xfer_lock[next]);
    for (int i = 0; i < half; i++) {
      free(xfer[next][i]); /* what the last round left there (NULL the first time) */
      xfer[next][i] = v[keep0 + i];
    }
    pthread_mutex_unlock(&xfer_lock[next]);
    pthread_barrier_wait(&round_barrier);
    for (int i = keep0 + half; i < BURST; i++) free(v[i]);
    pthread_mutex_lock(&xfer_lock[id]); /* the previous thread's objects, freed here */
    for (int i = 0; i < XFER; i++) { free(xfer[id][i]); xfer[id][i] = NULL; }
    pthread_mutex_unlock(&xfer_lock[id]);
    pthread_barrier_wait(&round_barrier);
  }
  free(v);
  return NULL;
}

/* ------------------------------------------------------------ loop */
static void run_loop(long iters) {
  enum { LIVE = 128 };
  void *slot[LIVE] = {0};
  uint64_t s = 5;
  for (long i = 0; i < iters; i++) {
    uint64_t r = rnd(&s);
    unsigned k = (unsigned)(r % LIVE);
    free(slot[k]);
    slot[k] = xmalloc(16 + (r >> 16) % 497);
  }
  for (unsigned k = 0; k < LIVE; k++) free(slot[k]);
}

/* ------------------------------------------------------------ xthread */
enum { BATCH = 256, QUEUE = 64 };
static void **queue[QUEUE];
static unsigned q_head, q_tail, producers_left;
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;

static void *producer(void *a) {
  uint64_t s = (uintptr_t)a * 104729 + 3;
  for (long b = 0; b < n_iters * 1000; b++) {
    void **batch = xmalloc(BATCH * sizeof(void *));
    for (int i = 0; i < BATCH; i++) batch[i] = xmalloc(16 + rnd(&s) % 1009);
    pthread_mutex_lock(&q_lock);
    while (q_head - q_tail >= QUEUE) pthread_cond_wait(&q_cond, &q_lock);
    queue[q_head++ % QUEUE] = batch;
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_lock);
  }
  pthread_mutex_lock(&q_lock);
  producers_left--;
  pthread_cond_broadcast(&q_cond);
  pthread_mutex_unlock(&q_lock);
  return NULL;
}

static void *consumer(void *a) {
  (void)a;
  for (;;) {
    pthread_mutex_lock(&q_lock);
    while (q_head == q_tail && producers_left > 0) pthread_cond_wait(&q_cond, &q_lock);
    if (q_head == q_tail) {
      pthread_mutex_unlock(&q_lock);
      return NULL;
    }
    void **batch = queue[q_tail++ % QUEUE];
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_lock);
    for (int i = 0; i < BATCH; i++) free(batch[i]);
    free(batch);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s mstress|loop|xthread [ITERS] [THREADS]\n", argv[0]);
    return 2;
  }
  const char *mode = argv[1];
  int is_loop = !strcmp(mode, "loop"), is_xthread = !strcmp(mode, "xthread");
  if (!is_loop && !is_xthread && strcmp(mode, "mstress")) {
    fprintf(stderr, "bursty: unknown mode %s\n", mode);
    return 2;
  }
  n_iters = argc > 2 ? atol(argv[2]) : (is_loop ? 20 : 40);
  n_threads = argc > 3 ? atoi(argv[3]) : 4;
  if (n_threads < 2 || n_threads > 64) n_threads = 4;
  if (is_loop) n_threads = 1;
  page_kib = sysconf(_SC_PAGESIZE) / 1024;
  stats_fn = (int (*)(memcolo_stats_t *))dlsym(RTLD_DEFAULT, "memcolo_stats");
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    perror("bursty: /proc/self/statm");
    return 1;
  }
  pthread_t smp, th[64];
  pthread_create(&smp, NULL, sampler, &fd);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (is_loop) {
    run_loop(n_iters * 1000000);
  } else if (is_xthread) {
    int p = n_threads / 2;
    producers_left = (unsigned)p;
    for (int i = 0; i < p; i++) pthread_create(&th[i], NULL, producer, (void *)(uintptr_t)i);
    for (int i = 0; i < n_threads - p; i++) pthread_create(&th[p + i], NULL, consumer, NULL);
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
  } else {
    pthread_barrier_init(&round_barrier, NULL, (unsigned)n_threads);
    for (int i = 0; i < n_threads; i++) pthread_mutex_init(&xfer_lock[i], NULL);
    for (int i = 0; i < n_threads; i++) pthread_create(&th[i], NULL, mstress, (void *)(uintptr_t)i);
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  sampling = 0;
  pthread_join(smp, NULL);
  sample(fd);
  long hwm = -1;
  FILE *st = fopen("/proc/self/status", "r");
  if (st) {
    char line[256];
    while (fgets(line, sizeof(line), st))
      if (sscanf(line, "VmHWM: %ld", &hwm) == 1) break;
    fclose(st);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("%s,%d,%.3f,%.3f,%.3f,%ld,%ld,%ld,%ld\n", mode, n_threads,
         (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
         (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6,
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6, hwm, max_outside_kib,
         rsv_at_max_kib, max_rsv_kib);
  return 0;
}
