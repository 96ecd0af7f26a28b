/* test_errors.c — bad input is reported with a clear message and aborts: double free
 * (small and large, back to back or not, from another thread, after the object left the
 * thread cache, as a thread's first calls), free of a pointer memcolo never returned
 * (static storage, the first page, past 48 bits), interior pointers, realloc of
 * a freed object, a corrupted thread-cache free list and (debug builds) a write past the
 * size asked for. Each case runs in a child process whose stderr and exit signal are
 * checked; a misuse that is not caught at the free goes on to allocate and says whether
 * the block was handed out twice. Legitimate patterns (cross-thread frees, realloc,
 * aligned allocation, frees in any order, large blocks, every usable byte written) run
 * in a child that must exit cleanly with nothing on stderr. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

typedef void (*bad_fn)(void);

static void run_bad(const char *name, bad_fn fn, const char *expect) {
  int fds[2];
  if (pipe(fds) != 0) { CHECK(0); return; }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);
  }
  close(fds[1]);
  char buf[2048] = {0};
  size_t off = 0;
  ssize_t n;
  while (off < sizeof(buf) - 1 && (n = read(fds[0], buf + off, sizeof(buf) - 1 - off)) > 0) off += (size_t)n;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  mc_t_current = name;
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  CHECK(strstr(buf, expect) != NULL);
  CHECK(strstr(buf, "address 0x") != NULL);
  if (!strstr(buf, expect) || !WIFSIGNALED(st)) fprintf(stderr, "  %s: status %d, got: %s\n", name, st, buf);
}

/* a legitimate pattern: the child must exit 0 with nothing on stderr */
static void run_ok(const char *name, bad_fn fn) {
  int fds[2];
  if (pipe(fds) != 0) { CHECK(0); return; }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);
  }
  close(fds[1]);
  char buf[2048] = {0};
  size_t off = 0;
  ssize_t n;
  while (off < sizeof(buf) - 1 && (n = read(fds[0], buf + off, sizeof(buf) - 1 - off)) > 0) off += (size_t)n;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  mc_t_current = name;
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(off == 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || off != 0) fprintf(stderr, "  %s: status %d, got: %s\n", name, st, buf);
}

static int by_address(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)*(char *const *)x, b = (uintptr_t)*(char *const *)y;
  return a < b ? -1 : a > b;
}

/* After a misuse that should have aborted: allocates N blocks of `size` and reports on
 * stderr (the test then fails on the exit status and the missing message) whether two
 * of them, or one and `live`, overlap: the block handed out twice. */
static void probe(size_t size, const char *live) {
  enum { N = 2048 };
  static char *b[N];
  for (int i = 0; i < N; i++) b[i] = (char *)MC_API(malloc)(size);
  qsort(b, N, sizeof(b[0]), by_address);
  for (int i = 0; i < N; i++) {
    if ((i + 1 < N && b[i] + size > b[i + 1]) || (live && b[i] < live + size && live < b[i] + size)) {
      fprintf(stderr, "not caught: a block handed out twice (%p)\n", (void *)b[i]);
      _exit(0);
    }
  }
  fprintf(stderr, "not caught\n");
  _exit(0);
}

static void *volatile sink;

static void double_free_small(void) {
  void *p = MC_API(malloc)(48);
  MC_API(free)(p);
  MC_API(free)(p);
}

static void double_free_large(void) {
  void *p = MC_API(malloc)(100000);
  MC_API(free)(p);
  MC_API(free)(p);
}

static void double_free_after_trim(void) {
  /* the object has gone back to its span (trim): the second free is caught at the free,
   * its live bit being clear */
  void *keep = MC_API(malloc)(48);
  void *p = MC_API(malloc)(48);
  MC_API(free)(p);
  MC_API(malloc_trim)(0);
  MC_API(free)(p);
  MC_API(malloc_trim)(0);
  sink = keep;
}

static void double_free_interleaved(void) {
  /* not back to back: caught at the second free (its live bit is clear) */
  void *p = MC_API(malloc)(64), *q = MC_API(malloc)(64);
  MC_API(free)(p);
  MC_API(free)(q);
  MC_API(free)(p);
  MC_API(malloc_trim)(0);
}

static void double_free_nonadjacent(void) {
  /* free(a); free(b); free(a): a sits twice in the thread cache's list unless caught */
  void *a = MC_API(malloc)(64), *b = MC_API(malloc)(64);
  MC_API(free)(a);
  MC_API(free)(b);
  MC_API(free)(a);
  probe(64, NULL);
}

static void double_free_nonadjacent_16(void) {
  /* the smallest class: an object of 16 bytes */
  void *a = MC_API(malloc)(8), *b = MC_API(malloc)(8);
  MC_API(free)(a);
  MC_API(free)(b);
  MC_API(free)(a);
  probe(8, NULL);
}

static void double_free_transfer_cache(void) {
  /* a goes from the thread cache to its shard's transfer cache (the list overflows),
   * then is freed again: caught at that free, before any malloc */
  void *a = MC_API(malloc)(64);
  enum { N = 1500 };
  static void *more[N];
  for (int i = 0; i < N; i++) more[i] = MC_API(malloc)(64);
  MC_API(free)(a);
  for (int i = 0; i < N; i++) MC_API(free)(more[i]);
  MC_API(free)(a);
  probe(64, NULL);
}

static pthread_mutex_t hold = PTHREAD_MUTEX_INITIALIZER;
static int freed_in_thread;
static void *free_and_stay(void *p) {
  MC_API(free)(p);
  __atomic_store_n(&freed_in_thread, 1, __ATOMIC_RELEASE);
  pthread_mutex_lock(&hold); /* the thread, and its cache holding p, stay alive */
  pthread_mutex_unlock(&hold);
  return NULL;
}

static void double_free_cross_thread(void) {
  /* a is freed by a thread that keeps it in its cache, then by the main thread */
  void *a = MC_API(malloc)(64);
  pthread_t t;
  pthread_mutex_lock(&hold);
  pthread_create(&t, NULL, free_and_stay, a);
  while (!__atomic_load_n(&freed_in_thread, __ATOMIC_ACQUIRE)) usleep(1000);
  MC_API(free)(a);
  pthread_mutex_unlock(&hold);
  pthread_join(t, NULL);
  probe(64, NULL);
}

/* the double free is the thread's first two calls: the first free finds no cache (the
 * fast path's empty stand-in) and makes one, the second must still be refused */
static void *free_twice(void *p) {
  MC_API(free)(p);
  MC_API(free)(p);
  return NULL;
}
static void double_free_first_calls_of_thread(void) {
  void *a = MC_API(malloc)(48);
  pthread_t t;
  pthread_create(&t, NULL, free_twice, a);
  pthread_join(t, NULL);
  probe(48, NULL);
}

static void realloc_after_free(void) {
  /* realloc of a freed object would hand it back in place while it is also free */
  void *a = MC_API(malloc)(64);
  MC_API(free)(a);
  void *b = MC_API(realloc)(a, 60);
  probe(64, (char *)b);
}

static void free_interior_small(void) {
  /* free(a + 16) of a 64-byte block: unless caught, the next malloc overlaps a */
  char *a = (char *)MC_API(malloc)(64);
  memset(a, 1, 64);
  MC_API(free)(a + 16);
  probe(64, a);
}

static void free_interior_small_odd(void) {
  char *a = (char *)MC_API(malloc)(200);
  MC_API(free)(a + 1);
  probe(200, a);
}

static void free_interior_reused_span(void) {
  /* The live map refuses an interior pointer because no bit but a live object's start
   * is set: pages that held 16-byte objects (a bit per granule) and now hold 64-byte
   * ones must have no bit left at a + 16. */
  enum { N = 4096 };
  static char *small[N], *big[N];
  for (int i = 0; i < N; i++) small[i] = (char *)MC_API(malloc)(16);
  char *lo = small[0], *hi = small[0];
  for (int i = 0; i < N; i++) {
    if (small[i] < lo) lo = small[i];
    if (small[i] > hi) hi = small[i];
  }
  for (int i = 0; i < N; i++) MC_API(free)(small[i]);
  MC_API(malloc_trim)(0);
  for (int i = 0; i < N; i++) big[i] = (char *)MC_API(malloc)(64);
  for (int i = 0; i < N; i++) {
    if (big[i] >= lo && big[i] + 16 <= hi) {
      MC_API(free)(big[i] + 16);
      probe(64, big[i]);
    }
  }
  fprintf(stderr, "not run: no 64-byte object in the 16-byte objects' pages\n");
  _exit(0);
}

static void free_span_tail(void) {
  /* a pointer past a span's last object, on an object boundary: never handed out, and
   * an object there would run into the next span */
  char *a = (char *)MC_API(malloc)(150); /* 160-byte objects: 51 in 8 KiB, 32 bytes left */
  mc_span_t *s = mc_pagemap_get(a);
  char *tail = (char *)s->start + (size_t)s->capacity * mc_class_size[s->sclass];
  if (mc_pagemap_get(tail) != s) _exit(3); /* the class has no tail: the test is wrong */
  MC_API(free)(tail);
  probe(150, NULL);
}

#if MC_DEBUG >= 1
static void overflow_one_byte(void) {
  /* one byte past the 40 asked for: the debug build's canary after the block */
  char *a = (char *)MC_API(malloc)(40);
  char *b = (char *)MC_API(malloc)(40);
  memset(a, 'a', 41);
  MC_API(free)(a);
  sink = b;
}

static void overflow_past_usable(void) {
  /* every usable byte is the program's; the next one is not */
  char *a = (char *)MC_API(malloc)(100);
  size_t n = MC_API(malloc_usable_size)(a);
  memset(a, 'a', n + 1);
  MC_API(free)(a);
}

static void overflow_after_realloc(void) {
  /* realloc in place moves the canary to the new size */
  char *a = (char *)MC_API(malloc)(100);
  a = (char *)MC_API(realloc)(a, 90);
  memset(a, 'a', 91);
  MC_API(free)(a);
}

static void overflow_aligned(void) {
  char *a = (char *)MC_API(aligned_alloc)(64, 100);
  memset(a, 'a', 101);
  MC_API(free)(a);
}
#endif

/* ---- legitimate patterns: none may trip a check */

static void *consume(void *arg) {
  void **objs = (void **)arg;
  for (int i = 0; i < 20000; i++) MC_API(free)(objs[i]);
  return NULL;
}

static void legit_patterns(void) {
  unsigned long long rng = 42;
  /* frees in another thread (producer/consumer), several rounds, all classes */
  static void *objs[20000];
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 20000; i++) {
      size_t n = 1 + mc_t_rand(&rng) % 4096;
      objs[i] = MC_API(malloc)(n);
      memset(objs[i], 0xff, n);
    }
    pthread_t t;
    pthread_create(&t, NULL, consume, objs);
    pthread_join(t, NULL);
  }
  /* frees in random order, every usable byte written (also with the freed-object key's
   * neighbours: all-ones and all-zero words) */
  static void *v[50000];
  for (int i = 0; i < 50000; i++) {
    size_t n = 1 + mc_t_rand(&rng) % 2048;
    v[i] = MC_API(malloc)(n);
    memset(v[i], (i & 1) ? 0 : 0xff, MC_API(malloc_usable_size)(v[i]));
  }
  for (int i = 49999; i > 0; i--) {
    int j = (int)(mc_t_rand(&rng) % (unsigned long long)(i + 1));
    void *x = v[i]; v[i] = v[j]; v[j] = x;
  }
  for (int i = 0; i < 50000; i++) MC_API(free)(v[i]);
  /* realloc chains up and down, contents kept */
  for (int k = 0; k < 50; k++) {
    char *p = (char *)MC_API(malloc)(1);
    p[0] = 7;
    size_t n = 1;
    for (size_t m = 2; m < (3u << 20); m = m * 3 / 2 + 1) { p = (char *)MC_API(realloc)(p, m); memset(p + n, 7, m - n); n = m; }
    for (size_t m = n; m > 1; m = m * 2 / 3) { p = (char *)MC_API(realloc)(p, m); if (p[m - 1] != 7) _exit(4); n = m; }
    MC_API(free)(p);
  }
  /* aligned allocation, every alignment and a range of sizes, freed in another order */
  static void *al[2000];
  int na = 0;
  for (size_t align = 16; align <= 65536; align *= 2) {
    for (size_t n = 1; n < 40000 && na < 2000; n = n * 5 / 2 + 1) {
      void *p = NULL;
      switch (na % 3) {
        case 0: if (MC_API(posix_memalign)(&p, align, n) != 0) _exit(5); break;
        case 1: p = MC_API(aligned_alloc)(align, n); break;
        default: p = MC_API(memalign)(align, n); break;
      }
      if (p == NULL || (uintptr_t)p % align) _exit(6);
      memset(p, 0x5a, MC_API(malloc_usable_size)(p));
      al[na++] = p;
    }
  }
  for (int i = 0; i < na; i += 2) MC_API(free)(al[i]);
  for (int i = 1; i < na; i += 2) MC_API(free)(al[i]);
  void *pv = MC_API(valloc)(100), *ppv = MC_API(pvalloc)(5000);
  MC_API(free)(ppv);
  MC_API(free)(pv);
  /* large blocks: a page, a span, a region; calloc; zero-size */
  size_t big[] = {32769, 100000, 1u << 20, 3u << 20, 9u << 20};
  for (int i = 0; i < 5; i++) {
    char *p = (char *)MC_API(malloc)(big[i]);
    memset(p, 1, MC_API(malloc_usable_size)(p));
    char *q = (char *)MC_API(calloc)(1, big[i]);
    MC_API(free)(p);
    MC_API(free)(q);
  }
  MC_API(free)(MC_API(malloc)(0));
  MC_API(free)(NULL);
  /* an object freed, allocated again and freed: the same address, never a double free */
  for (int i = 0; i < 1000; i++) {
    void *a = MC_API(malloc)(64), *b = MC_API(malloc)(64);
    MC_API(free)(a);
    MC_API(free)(b);
  }
  MC_API(malloc_trim)(0);
}

static void free_foreign(void) {
  static char not_heap[64];
  MC_API(free)(not_heap + 16);
}

/* free's fast path sends NULL, the first page and pointers past 48 bits to its slow
 * path with one compare: only NULL is accepted there */
static void free_first_page(void) {
  MC_API(free)(NULL);
  MC_API(free)((void *)(uintptr_t)0x40);
}
static void free_past_48_bits(void) {
  MC_API(free)((void *)(uintptr_t)0xffff800000401000ull);
}

static void free_interior_large(void) {
  char *p = (char *)MC_API(malloc)(200000);
  MC_API(free)(p + 8192);
}

static void corrupt_free_list(void) {
  /* The lists of free objects live in metadata (a use after free of an object cannot
   * reach them): simulate a wild write into a thread cache's list; it is caught when the
   * list is flushed, by the page map check of every entry. */
  void *a = MC_API(malloc)(96);
  MC_API(free)(a);
  mc_tcache->bins[mc_pagemap_get(a)->sclass].slots[0] = (void *)(uintptr_t)0x7e57dead0000ull;
  MC_API(malloc_trim)(0);
}

static void use_after_free_write(void) {
  /* not an error the allocator can see, and harmless to it: objects hold no links */
  char *a = (char *)MC_API(malloc)(96);
  MC_API(free)(a);
  memset(a, 0xa5, 96);
  for (int i = 0; i < 1000; i++) MC_API(free)(MC_API(malloc)(96));
  abort(); /* reached: the allocator kept working */
}

static void usable_size_sanity(void) {
  /* not an error: malloc_usable_size of NULL is 0 */
  if (MC_API(malloc_usable_size)(NULL) != 0) _exit(3);
  abort();
}

/* MEMCOLO_DOUBLE_FREE_CHECK=0 (release builds; run.sh runs this program with it too):
 * a double free is not looked for at the free, but is caught once both copies are back
 * in the object's span (malloc_trim empties the caches into the spans) */
static void double_free_reaches_span(void) {
  void *p = MC_API(malloc)(48);
  MC_API(free)(p);
  MC_API(free)(p);
  MC_API(malloc_trim)(0);
  probe(48, NULL);
}

/* MEMCOLO_DOUBLE_FREE_CHECK=0: the object-start test alone still refuses every pointer
 * that is not an object's start, and legitimate use trips nothing */
static int without_live_map(void) {
  run_bad("nocheck_free_foreign", free_foreign, "did not return");
  run_bad("nocheck_free_interior_large", free_interior_large, "did not return");
  run_bad("nocheck_free_first_page", free_first_page, "did not return");
  run_bad("nocheck_free_past_48_bits", free_past_48_bits, "did not return");
  run_bad("nocheck_corrupt_free_list", corrupt_free_list, "corrupted");
  run_bad("nocheck_free_interior_small", free_interior_small, "interior pointer");
  run_bad("nocheck_free_interior_small_odd", free_interior_small_odd, "interior pointer");
  run_bad("nocheck_free_span_tail", free_span_tail, "interior pointer");
  run_bad("nocheck_free_interior_reused_span", free_interior_reused_span, "interior pointer");
  run_bad("nocheck_double_free_reaches_span", double_free_reaches_span, "double free");
  run_ok("nocheck_legit_patterns", legit_patterns);
  TEST_END();
}

int main(void) {
  MC_API(free)(MC_API(malloc)(1)); /* initialized: the option is read */
  const char *opt = getenv("MEMCOLO_DOUBLE_FREE_CHECK");
  mc_t_current = "double_free_check_option";
  /* debug builds check whatever the option says */
  CHECK(mc_double_free_check == (MC_DEBUG >= 1 || opt == NULL || strcmp(opt, "0") != 0));
  if (!mc_double_free_check) return without_live_map();
  run_bad("double_free_small", double_free_small, "double free");
  run_bad("double_free_large", double_free_large, "did not return");
  run_bad("double_free_after_trim", double_free_after_trim, "double free");
  run_bad("double_free_interleaved", double_free_interleaved, "double free");
  run_bad("free_foreign", free_foreign, "did not return");
  run_bad("free_interior_large", free_interior_large, "did not return");
  run_bad("corrupt_free_list", corrupt_free_list, "corrupted");
  run_bad("double_free_nonadjacent", double_free_nonadjacent, "double free");
  run_bad("double_free_nonadjacent_16", double_free_nonadjacent_16, "double free");
  run_bad("double_free_transfer_cache", double_free_transfer_cache, "double free");
  run_bad("double_free_cross_thread", double_free_cross_thread, "double free");
  run_bad("double_free_first_calls_of_thread", double_free_first_calls_of_thread, "double free");
  run_bad("free_first_page", free_first_page, "did not return");
  run_bad("free_past_48_bits", free_past_48_bits, "did not return");
  run_bad("realloc_after_free", realloc_after_free, "double free");
  run_bad("free_interior_small", free_interior_small, "interior pointer");
  run_bad("free_interior_small_odd", free_interior_small_odd, "interior pointer");
  run_bad("free_span_tail", free_span_tail, "interior pointer");
  run_bad("free_interior_reused_span", free_interior_reused_span, "interior pointer");
#if MC_DEBUG >= 1
  run_bad("overflow_one_byte", overflow_one_byte, "overflow");
  run_bad("overflow_past_usable", overflow_past_usable, "overflow");
  run_bad("overflow_after_realloc", overflow_after_realloc, "overflow");
  run_bad("overflow_aligned", overflow_aligned, "overflow");
#endif
  run_ok("legit_patterns", legit_patterns);
  int st = 0;
  pid_t pid = fork();
  if (pid == 0) { use_after_free_write(); _exit(0); }
  waitpid(pid, &st, 0);
  mc_t_current = "use_after_free_write";
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  pid = fork();
  if (pid == 0) { usable_size_sanity(); _exit(0); }
  waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st));
  TEST_END();
}
