/* test_stress.c — deterministic multi-threaded stress of the public malloc surface:
 * sizes 1 B .. 64 MiB, alignments, realloc chains, calloc, cross-thread frees
 * (producer/consumer), thread exit with a full cache, and fork. Every block carries a
 * pattern derived from its address and size that is verified before it is freed. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memcolo.h"
#include "test.h"

static void fill(unsigned char *p, size_t n, unsigned seed) {
  /* first, last and a sample of bytes: enough to catch overlap without O(n) cost */
  if (n == 0) return;
  size_t step = n > 4096 ? 4093 : 1;
  for (size_t i = 0; i < n; i += step) p[i] = (unsigned char)(seed + i * 31);
  p[n - 1] = (unsigned char)(seed ^ 0x5a);
}

static int verify(const unsigned char *p, size_t n, unsigned seed) {
  if (n == 0) return 1;
  size_t step = n > 4096 ? 4093 : 1;
  for (size_t i = 0; i < n - 1; i += step) {
    if (p[i] != (unsigned char)(seed + i * 31)) return 0;
  }
  return p[n - 1] == (unsigned char)(seed ^ 0x5a);
}

static size_t pick_size(unsigned long long *rng) {
  unsigned long long r = mc_t_rand(rng);
  switch (r % 16) {
    case 0: return 1 + (r >> 8) % 16;
    case 1: case 2: case 3: case 4: case 5: return 1 + (r >> 8) % 256;
    case 6: case 7: case 8: return 1 + (r >> 8) % 4096;
    case 9: case 10: return 1 + (r >> 8) % 32768;
    case 11: return 32769 + (r >> 8) % (256 << 10);
    case 12: return 1 + (r >> 8) % (1 << 20);
    case 13: return (r >> 8) % 3 == 0 ? (1 << 20) + (r >> 8) % (4 << 20) : 1 + (r >> 8) % 2048;
    case 14: return (r >> 8) % 64 == 0 ? (64u << 20) : 1 + (r >> 8) % 512;
    default: return 24;
  }
}

typedef struct { void *p; size_t n; unsigned seed; } blk_t;

typedef struct { unsigned long long seed; int iters; int errors; } worker_arg_t;

static void *worker(void *argp) {
  worker_arg_t *a = (worker_arg_t *)argp;
  unsigned long long rng = a->seed;
  enum { SLOTS = 512 };
  blk_t *slots = (blk_t *)MC_API(calloc)(SLOTS, sizeof(blk_t));
  if (!slots) { a->errors++; return NULL; }
  for (int it = 0; it < a->iters; it++) {
    unsigned long long r = mc_t_rand(&rng);
    blk_t *b = &slots[r % SLOTS];
    if (b->p) {
      if (!verify((unsigned char *)b->p, b->n, b->seed)) { a->errors++; fprintf(stderr, "verify fail n=%zu\n", b->n); }
      if ((r >> 20) % 4 == 0) {
        /* realloc chain step */
        size_t nn = pick_size(&rng);
        void *q = MC_API(realloc)(b->p, nn);
        if (!q) { a->errors++; fprintf(stderr, "realloc fail\n"); continue; }
        size_t keep = nn < b->n ? nn : b->n;
        /* the kept prefix must be intact; re-fill the whole block */
        if (keep > 1 && b->n > 1 && ((unsigned char *)q)[0] != (unsigned char)(b->seed)) a->errors++;
        b->p = q; b->n = nn; b->seed = (unsigned)r;
        fill((unsigned char *)q, nn, b->seed);
        continue;
      }
      MC_API(free)(b->p);
      b->p = NULL;
      continue;
    }
    size_t n = pick_size(&rng);
    void *p;
    unsigned kind = (unsigned)(r >> 40) % 8;
    if (kind == 0) {
      size_t al = (size_t)1 << (4 + (r >> 44) % 14); /* 16 B .. 128 KiB */
      if (MC_API(posix_memalign)(&p, al, n) != 0) { a->errors++; continue; }
      if ((uintptr_t)p % al) a->errors++;
    } else if (kind == 1) {
      p = MC_API(calloc)(1, n);
      if (p) {
        const unsigned char *c = (const unsigned char *)p;
        size_t step = n > 4096 ? 4093 : 1;
        for (size_t i = 0; i < n; i += step) if (c[i]) { a->errors++; fprintf(stderr, "calloc nonzero n=%zu i=%zu\n", n, i); break; }
      }
    } else {
      p = MC_API(malloc)(n);
    }
    if (!p) { a->errors++; fprintf(stderr, "alloc fail n=%zu kind=%u\n", n, kind); continue; }
    if ((uintptr_t)p % 16) a->errors++;
    if (MC_API(malloc_usable_size)(p) < n) { a->errors++; fprintf(stderr, "usable fail n=%zu kind=%u us=%zu\n", n, kind, MC_API(malloc_usable_size)(p)); }
    b->p = p; b->n = n; b->seed = (unsigned)r;
    fill((unsigned char *)p, n, b->seed);
  }
  for (int i = 0; i < SLOTS; i++) {
    if (slots[i].p) {
      if (!verify((unsigned char *)slots[i].p, slots[i].n, slots[i].seed)) a->errors++;
      MC_API(free)(slots[i].p);
    }
  }
  MC_API(free)(slots);
  return NULL;
}

TEST(test_single_thread_sizes) {
  for (size_t n = 0; n <= 70000; n += (n < 1100 ? 1 : 97)) {
    unsigned char *p = (unsigned char *)MC_API(malloc)(n);
    CHECK(p != NULL);
    if (!p) return;
    CHECK(((uintptr_t)p & 15) == 0);
    CHECK(MC_API(malloc_usable_size)(p) >= n);
    fill(p, n, (unsigned)n);
    CHECK(verify(p, n, (unsigned)n));
    MC_API(free)(p);
  }
  void *big = MC_API(malloc)(64u << 20);
  CHECK(big != NULL);
  memset(big, 0xab, 64u << 20);
  CHECK(MC_API(malloc_usable_size)(big) >= (64u << 20));
  MC_API(free)(big);
}

TEST(test_calloc_overflow_and_zero) {
  errno = 0;
  volatile size_t huge = SIZE_MAX / 2;
  CHECK(MC_API(calloc)(huge, 3) == NULL);
  CHECK(errno == ENOMEM);
  CHECK(MC_API(reallocarray)(NULL, huge, 3) == NULL);
  /* reused memory must come back zeroed from calloc */
  for (size_t n = 16; n <= (8u << 20); n *= 4) {
    unsigned char *p = (unsigned char *)MC_API(malloc)(n);
    memset(p, 0xff, n);
    MC_API(free)(p);
    unsigned char *q = (unsigned char *)MC_API(calloc)(n, 1);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += q[i] != 0;
    CHECK(bad == 0);
    MC_API(free)(q);
  }
  CHECK(MC_API(malloc)(huge * 2 - 4096) == NULL);
}

TEST(test_realloc_in_place) {
  /* large blocks: shrink in place keeps the address, growth keeps the content */
  unsigned char *p = (unsigned char *)MC_API(malloc)(200 << 10);
  fill(p, 100 << 10, 7);
  unsigned char *q = (unsigned char *)MC_API(realloc)(p, 100 << 10);
  CHECK(q == p);
  CHECK(verify(q, 100 << 10, 7));
  unsigned char *r = (unsigned char *)MC_API(realloc)(q, 300 << 10);
  CHECK(r != NULL);
  CHECK(verify(r, 100 << 10, 7));
  /* a growth chain of a region to 64 MiB */
  size_t n = 2 << 20;
  unsigned char *g = (unsigned char *)MC_API(malloc)(n);
  memset(g, 3, n);
  for (; n < (64u << 20); n += n / 2) {
    g = (unsigned char *)MC_API(realloc)(g, n + n / 2);
    CHECK(g != NULL);
    CHECK(g[0] == 3 && g[n - 1] == 3);
    memset(g + n, 3, n / 2);
  }
  MC_API(free)(g);
  MC_API(free)(r);
  /* small: same class keeps the pointer (112-byte objects, also with the debug
   * build's 8 bytes of padding) */
  void *s = MC_API(malloc)(100);
  void *s2 = MC_API(realloc)(s, 104);
  CHECK(s2 == s);
  s = s2;
  void *t = MC_API(realloc)(s, 0);
  CHECK(t == NULL);
}

TEST(test_alignment) {
  for (size_t al = 16; al <= (4u << 20); al *= 2) {
    for (size_t n = 1; n <= (3u << 20); n = n * 7 + 3) {
      void *p = NULL;
      CHECK(MC_API(posix_memalign)(&p, al, n) == 0);
      CHECK(((uintptr_t)p & (al - 1)) == 0);
      CHECK(MC_API(malloc_usable_size)(p) >= n);
      memset(p, 1, n);
      MC_API(free)(p);
    }
  }
  void *p = NULL;
  CHECK(MC_API(posix_memalign)(&p, 24, 10) == EINVAL);
  CHECK(MC_API(aligned_alloc)(3, 10) == NULL);
  void *v = MC_API(valloc)(10);
  CHECK(((uintptr_t)v & 4095) == 0);
  void *pv = MC_API(pvalloc)(5000);
  CHECK(((uintptr_t)pv & 4095) == 0 && MC_API(malloc_usable_size)(pv) >= 8192);
  void *m = MC_API(memalign)(256, 1000);
  CHECK(((uintptr_t)m & 255) == 0);
  MC_API(free)(v);
  MC_API(free)(pv);
  MC_API(free)(m);
}

TEST(test_threads_random) {
  int T = getenv("MC_T_THREADS") ? atoi(getenv("MC_T_THREADS")) : 4;
  pthread_t th[16];
  worker_arg_t args[16];
  for (int i = 0; i < T; i++) {
    args[i].seed = 1000 + (unsigned long long)i;
    args[i].iters = 60000;
    args[i].errors = 0;
    pthread_create(&th[i], NULL, worker, &args[i]);
  }
  int errors = 0;
  for (int i = 0; i < T; i++) { pthread_join(th[i], NULL); errors += args[i].errors; }
  CHECK(errors == 0);
}

/* producer/consumer: every object is freed by another thread */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  void *ring[1024];
  size_t head, tail;
  int done;
} queue_t;

static queue_t q;

static void *producer(void *arg) {
  unsigned long long rng = (unsigned long long)(uintptr_t)arg;
  for (int i = 0; i < 200000; i++) {
    size_t n = 16 + mc_t_rand(&rng) % 2000; /* room for p[0] and the 8 bytes of n */
    unsigned char *p = (unsigned char *)MC_API(malloc)(n);
    p[0] = (unsigned char)n;
    memcpy(p + 1, &n, sizeof(n) < n - 1 ? sizeof(n) : n - 1);
    pthread_mutex_lock(&q.lock);
    while (q.head - q.tail == 1024) pthread_cond_wait(&q.cond, &q.lock);
    q.ring[q.head++ % 1024] = p;
    pthread_cond_broadcast(&q.cond);
    pthread_mutex_unlock(&q.lock);
  }
  return NULL;
}

static int consumer_errors;
static void *consumer(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&q.lock);
    while (q.head == q.tail && !q.done) pthread_cond_wait(&q.cond, &q.lock);
    if (q.head == q.tail && q.done) { pthread_mutex_unlock(&q.lock); return NULL; }
    unsigned char *p = (unsigned char *)q.ring[q.tail++ % 1024];
    pthread_cond_broadcast(&q.cond);
    pthread_mutex_unlock(&q.lock);
    size_t n;
    memcpy(&n, p + 1, sizeof(n));
    if (p[0] != (unsigned char)n || MC_API(malloc_usable_size)(p) < n) consumer_errors++;
    MC_API(free)(p);
  }
}

TEST(test_cross_thread_free) {
  pthread_mutex_init(&q.lock, NULL);
  pthread_cond_init(&q.cond, NULL);
  pthread_t pr[2], co[2];
  for (int i = 0; i < 2; i++) pthread_create(&pr[i], NULL, producer, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < 2; i++) pthread_create(&co[i], NULL, consumer, NULL);
  for (int i = 0; i < 2; i++) pthread_join(pr[i], NULL);
  pthread_mutex_lock(&q.lock);
  q.done = 1;
  pthread_cond_broadcast(&q.cond);
  pthread_mutex_unlock(&q.lock);
  for (int i = 0; i < 2; i++) pthread_join(co[i], NULL);
  CHECK(consumer_errors == 0);
}

static void *short_lived(void *arg) {
  /* fill the thread cache, keep some blocks for the parent, and exit */
  void **keep = (void **)arg;
  void *tmp[256];
  for (int i = 0; i < 256; i++) tmp[i] = MC_API(malloc)((size_t)(16 + i * 8));
  for (int i = 0; i < 256; i++) MC_API(free)(tmp[i]);
  for (int i = 0; i < 16; i++) { keep[i] = MC_API(malloc)(64); memset(keep[i], i, 64); }
  return NULL;
}

TEST(test_thread_exit) {
  for (int round = 0; round < 200; round++) {
    void *keep[16];
    pthread_t t;
    pthread_create(&t, NULL, short_lived, keep);
    pthread_join(t, NULL);
    int ok = 1;
    for (int i = 0; i < 16; i++) {
      unsigned char *c = (unsigned char *)keep[i];
      if (c[0] != i || c[63] != i) ok = 0;
      MC_API(free)(keep[i]);
    }
    if (!ok) { CHECK(ok); return; }
  }
  CHECK(1);
}

static void *fork_noise(void *arg) {
  volatile int *stop = (volatile int *)arg;
  unsigned long long rng = 77;
  while (!*stop) {
    void *p = MC_API(malloc)(1 + mc_t_rand(&rng) % 100000);
    MC_API(free)(p);
  }
  return NULL;
}

TEST(test_fork) {
  volatile int stop = 0;
  pthread_t t;
  pthread_create(&t, NULL, fork_noise, (void *)&stop);
  int bad = 0;
  for (int i = 0; i < 20; i++) {
    void *mine = MC_API(malloc)(1000);
    memset(mine, 9, 1000);
    pid_t pid = fork();
    if (pid == 0) {
      /* the child allocates, frees the parent's block, and starts a thread */
      unsigned char *c = (unsigned char *)mine;
      int ok = c[999] == 9;
      MC_API(free)(mine);
      for (int k = 0; k < 1000; k++) MC_API(free)(MC_API(malloc)((size_t)(k * 37 % 70000 + 1)));
      pthread_t ct;
      void *keep[16];
      pthread_create(&ct, NULL, short_lived, keep);
      pthread_join(ct, NULL);
      _exit(ok ? 0 : 3);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
    MC_API(free)(mine);
  }
  stop = 1;
  pthread_join(t, NULL);
  CHECK(bad == 0);
}

TEST(test_trim) {
  void *ps[64];
  for (int i = 0; i < 64; i++) { ps[i] = MC_API(malloc)(100 << 10); memset(ps[i], 1, 100 << 10); }
  for (int i = 0; i < 64; i++) MC_API(free)(ps[i]);
  CHECK(MC_API(malloc_trim)(0) == 1);
}

/* Large blocks under the Delta rule (pageheap.c, region_free_locked): buffers of 5-25
 * MiB replaced at random are served by the freed ones, not by new mappings; calloc
 * still gives zeros on reused memory; malloc_trim gives the kept ones back. */
TEST(test_large_reuse) {
  enum { SLOTS = 10, ITERS = 300 };
  unsigned char *slot[SLOTS] = {0};
  size_t len[SLOTS] = {0};
  unsigned long long seed = 7;
  memcolo_stats_t a, b, c;
  CHECK(memcolo_stats(&a) == 0);
  int bad = 0;
  for (int it = 0; it < ITERS; it++) {
    unsigned i = (unsigned)(mc_t_rand(&seed) % SLOTS);
    if (slot[i] && (slot[i][0] != 7 || slot[i][len[i] - 1] != 7)) bad++;
    MC_API(free)(slot[i]);
    size_t n = (size_t)((5u << 8) + mc_t_rand(&seed) % (20u << 8)) << 12;
    unsigned char *p = MC_API(calloc)(1, n);
    if (p == NULL) { bad++; slot[i] = NULL; continue; }
    for (size_t k = 0; k < n; k += 65536) if (p[k]) { bad++; break; }
    if (p[n - 1]) bad++;
    memset(p, 7, n < 65536 ? n : 65536);
    p[n - 1] = 7;
    slot[i] = p;
    len[i] = n;
  }
  CHECK(bad == 0);
  CHECK(memcolo_stats(&b) == 0);
  /* a new mapping for at most the first buffers and a few more, the rest reused */
  CHECK(b.os_mmap_calls - a.os_mmap_calls < ITERS / 4);
  CHECK(b.reserve_hits - a.reserve_hits > ITERS / 2);
  CHECK(b.skipped_subrelease_bytes > a.skipped_subrelease_bytes);
  for (unsigned i = 0; i < SLOTS; i++) MC_API(free)(slot[i]);
  MC_API(malloc_trim)(0);
  CHECK(memcolo_stats(&c) == 0);
  CHECK(c.free_backed_bytes < ((uint64_t)64 << 20));
}

int main(void) {
  RUN(test_single_thread_sizes);
  RUN(test_calloc_overflow_and_zero);
  RUN(test_realloc_in_place);
  RUN(test_alignment);
  RUN(test_threads_random);
  RUN(test_cross_thread_free);
  RUN(test_thread_exit);
  RUN(test_fork);
  RUN(test_trim);
  RUN(test_large_reuse);
  TEST_END();
}
