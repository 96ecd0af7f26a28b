/* test_unit.c — unit tests of the internal parts: size classes, options, the page
 * heap (filler packing, huge page cache, subrelease, coverage accounting and its
 * invariant checker), and the ISMM'21 policy (skip-subrelease with Delta, correctness
 * tracker, realized fragmentation) on a fake clock. */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

/* the debug builds pad small blocks by 8 bytes (alloc.c): malloc of a class's size
 * less this gives an object of that class in every build */
#define MC_T_PAD (MC_DEBUG >= 1 ? 8u : 0u)

TEST(test_size_classes) {
  int bad = 0;
  for (size_t sz = 0; sz <= MC_SMALL_MAX; sz++) {
    unsigned c = mc_size_to_class(sz);
    if (c < 1 || c >= MC_CLASSES || mc_class_size[c] < sz) bad++;
    else if (c > 1 && mc_class_size[c - 1] >= sz) bad++; /* tightest class */
  }
  CHECK(bad == 0);
  for (unsigned c = 1; c < MC_CLASSES; c++) {
    size_t span = (size_t)mc_class_pages[c] << MC_PAGE_SHIFT;
    CHECK(mc_class_size[c] % 16 == 0);
    CHECK(span / mc_class_size[c] >= 8 || mc_class_size[c] > 4096);
    CHECK(span % mc_class_size[c] <= span / 8);
    CHECK(mc_class_batch[c] >= 2 && mc_class_batch[c] <= 64);
    CHECK((size_t)mc_class_pages[c] * MC_PAGE_SIZE / mc_class_size[c] <= MC_SPAN_MAX_OBJECTS);
    if (c > 1) CHECK(mc_class_size[c] > mc_class_size[c - 1]);
    /* internal waste at most 25 % above 128 bytes */
    if (c > 1 && mc_class_size[c] > 128) CHECK(mc_class_size[c - 1] * 5 / 4 >= mc_class_size[c]);
  }
  CHECK(mc_class_size[MC_CLASSES - 1] == MC_SMALL_MAX);
}

TEST(test_options_from_env) {
  /* options are read once at start: check them in a fresh process */
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    setenv("MEMCOLO_RSV_FACTOR", "1.5", 1);
    setenv("MEMCOLO_MIN_RSV", "8m", 1);
    setenv("MEMCOLO_SKIP_SUBRELEASE_S", "junk", 1);
    setenv("MEMCOLO_CLASS", "be", 1);
    setenv("MEMCOLO_RSV_HORIZON_MS", "250", 1);
    setenv("MEMCOLO_MGMT_NICE", "-40", 1); /* clamped to -20 */
    execl("/proc/self/exe", "test_unit", "--print-options", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char buf[256] = {0};
  ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  waitpid(pid, NULL, 0);
  CHECK(n > 0);
  long rsv = -1, minr = -1, skip = -1, cls = -1, horizon = -1, nice = 0;
  sscanf(buf, "%ld %ld %ld %ld %ld %ld", &rsv, &minr, &skip, &cls, &horizon, &nice);
  CHECK(horizon == 250);
  CHECK(nice == -20);
  CHECK(rsv == 150);
  CHECK(minr == 8L << 20);
  CHECK(skip == 60); /* unreadable value: default */
  CHECK(cls == 2);
}

TEST(test_options_text_bools_ranges_and_overflow) {
  /* every MEMCOLO_ variable, tier.c's included, is read by options.c's table */
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    unsetenv("MEMCOLO_SOCKET");
    setenv("MEMCOLO_T_MISS", "0.05", 1);
    setenv("MEMCOLO_TIER_SOCKET", "/tmp/x/tier.sock", 1);
    setenv("MEMCOLO_TIER_THRESHOLD", "100", 1);              /* clamped up to 4k */
    setenv("MEMCOLO_STATS", "7", 1);                         /* a bool: 1 */
    setenv("MEMCOLO_RSV_YIELD_MODE", "9", 1);                /* clamped down to 3 */
    setenv("MEMCOLO_TCACHE", "99999999999999999999g", 1);    /* overflows: default */
    setenv("MEMCOLO_CLASS", "lcx", 1);                       /* unknown: none */
    setenv("MEMCOLO_TIER_RECOVER_S", "5", 1);
    execl("/proc/self/exe", "test_unit", "--print-text-options", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char buf[512] = {0};
  ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  waitpid(pid, NULL, 0);
  CHECK(n > 0);
  CHECK(strcmp(buf, "/run/memcolo/agent.sock 0.05 /tmp/x/tier.sock 4096 1 3 2097152 0 5\n") == 0);
  if (strcmp(buf, "/run/memcolo/agent.sock 0.05 /tmp/x/tier.sock 4096 1 3 2097152 0 5\n") != 0)
    fprintf(stderr, "got: %s", buf);
}

static size_t used_pages(void) { return mc_heap.used_pages; }

static bool heap_ok(void) {
  pthread_mutex_lock(&mc_heap.lock);
  bool ok = mc_heap_check_locked();
  pthread_mutex_unlock(&mc_heap.lock);
  return ok;
}

TEST(test_filler_packing) {
  CHECK(heap_ok());
  size_t base = used_pages();
  /* take a fresh huge page's worth so that new spans start on empty huge pages */
  mc_span_t *a = mc_heap_alloc(200, MC_SPAN_LARGE, false);
  mc_span_t *b = mc_heap_alloc(200, MC_SPAN_LARGE, false);
  CHECK(a && b);
  CHECK(used_pages() == base + 400);
  mc_span_t *c = mc_heap_alloc(256, MC_SPAN_LARGE, false);
  CHECK(c != NULL);
  /* the first fit for a small span is the fullest huge page that has room */
  mc_span_t *d = mc_heap_alloc(10, MC_SPAN_LARGE, false);
  CHECK(d != NULL);
  CHECK(d->hp->used_pages >= c->hp->used_pages || d->hp == c->hp);
  CHECK(d->hp->longest_free <= MC_HP_PAGES - c->hp->used_pages);
  /* spans never overlap and lie inside their huge page */
  mc_span_t *all[4] = {a, b, c, d};
  for (int i = 0; i < 4; i++) {
    CHECK(all[i]->start >= all[i]->hp->base);
    CHECK(all[i]->start + ((uintptr_t)all[i]->pages << MC_PAGE_SHIFT) <= all[i]->hp->base + MC_HUGE_SIZE);
    CHECK(all[i]->start % MC_PAGE_SIZE == 0);
    for (int j = 0; j < i; j++) {
      uintptr_t ai = all[i]->start, ae = ai + ((uintptr_t)all[i]->pages << 12);
      uintptr_t bj = all[j]->start, be = bj + ((uintptr_t)all[j]->pages << 12);
      CHECK(ae <= bj || be <= ai);
    }
    memset((void *)all[i]->start, i + 1, (size_t)all[i]->pages << 12);
  }
  CHECK(mc_pagemap_get((void *)a->start) == a);
  CHECK(heap_ok());
  /* grow in place into free neighbours, shrink back */
  size_t dp = d->pages;
  bool grew = mc_heap_try_grow(d, dp + 4);
  if (grew) CHECK(d->pages == dp + 4);
  mc_heap_shrink(d, dp);
  CHECK(d->pages == dp);
  CHECK(heap_ok());
  for (int i = 0; i < 4; i++) mc_heap_free(all[i]);
  CHECK(used_pages() == base);
  CHECK(mc_pagemap_get((void *)a->start) == NULL || mc_pagemap_get((void *)a->start)->kind != MC_SPAN_LARGE ||
        mc_pagemap_get((void *)a->start) != a);
  CHECK(heap_ok());
}

/* huge pages are carved from chunks of address space: mmap (which waits for every
 * MADV_POPULATE_WRITE in the process) is rare, and never on the allocation path once
 * the management thread has mapped the next chunk ahead */
/* the longest free run of a huge page is kept incrementally (pageheap.c): after every
 * span in and out it equals a rescan (the invariant checker compares), and the filler
 * still picks the huge page with the smallest longest free run that fits */
TEST(test_filler_longest_free_incremental) {
  CHECK(heap_ok());
  enum { N = 48 };
  mc_span_t *sp[N];
  uint64_t seed = 12345;
  for (int i = 0; i < N; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    sp[i] = mc_heap_alloc(1 + (size_t)((seed >> 33) % 24), MC_SPAN_LARGE, false);
    CHECK(sp[i] != NULL);
    CHECK(heap_ok());
  }
  /* holes of different lengths: every third span goes */
  for (int i = 0; i < N; i += 3) { mc_heap_free(sp[i]); sp[i] = NULL; CHECK(heap_ok()); }
  for (int round = 0; round < 200; round++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int i = (int)((seed >> 33) % N);
    if (sp[i]) { mc_heap_free(sp[i]); sp[i] = NULL; }
    else {
      size_t n = 1 + (size_t)((seed >> 40) % 24);
      pthread_mutex_lock(&mc_heap.lock);
      unsigned fit = MC_HP_PAGES + 1; /* the smallest longest free run >= n, intact pages */
      for (unsigned b = (unsigned)n; b <= MC_HP_PAGES && fit > MC_HP_PAGES; b++) if (mc_heap.filler[b].head) fit = b;
      pthread_mutex_unlock(&mc_heap.lock);
      sp[i] = mc_heap_alloc(n, MC_SPAN_LARGE, false);
      CHECK(sp[i] != NULL);
      if (fit <= MC_HP_PAGES && sp[i]->hp->broken == 0) CHECK(sp[i]->hp->longest_free <= fit);
    }
    CHECK(heap_ok());
  }
  for (int i = 0; i < N; i++) if (sp[i]) mc_heap_free(sp[i]);
  CHECK(heap_ok());
}

TEST(test_hugepages_carved_from_chunks) {
  enum { N = 80 }; /* 40 huge pages' worth of 1 MiB spans */
  static mc_span_t *s[2 * N];
  uint64_t m0 = mc_heap.os_mmap_calls;
  for (int i = 0; i < N; i++) {
    s[i] = mc_heap_alloc(256, MC_SPAN_LARGE, false);
    CHECK(s[i] != NULL && s[i]->hp->base % MC_HUGE_SIZE == 0);
  }
  CHECK(mc_heap.os_mmap_calls - m0 <= 2);
  uint64_t in_alloc = 0;
  for (int i = N; i < 2 * N; i++) {
    mc_heap_va_prepare();
    uint64_t m = mc_heap.os_mmap_calls;
    s[i] = mc_heap_alloc(256, MC_SPAN_LARGE, false);
    in_alloc += mc_heap.os_mmap_calls - m;
    CHECK(s[i] != NULL);
  }
  CHECK(in_alloc == 0);
  for (int i = 0; i < 2 * N; i++) {
    memset((void *)s[i]->start, 1, 4096);
    mc_heap_free(s[i]);
  }
  CHECK(heap_ok());
}

TEST(test_subrelease_breaks_and_heals) {
  memcolo_stats_t st;
  mc_span_t *s[8];
  for (int i = 0; i < 8; i++) {
    s[i] = mc_heap_alloc(64, MC_SPAN_LARGE, false);
    memset((void *)s[i]->start, 1, 64 << 12);
  }
  /* free every other span: free backed pages inside a used huge page */
  for (int i = 0; i < 8; i += 2) mc_heap_free(s[i]);
  pthread_mutex_lock(&mc_heap.lock);
  size_t broken0 = mc_heap.hugepages_broken, sub0 = mc_heap.subreleased_pages;
  size_t got = mc_heap_release_locked(0, false, 0);
  size_t broken1 = mc_heap.hugepages_broken, sub1 = mc_heap.subreleased_pages;
  bool ok = mc_heap_check_locked();
  pthread_mutex_unlock(&mc_heap.lock);
  CHECK(ok);
  CHECK(got > 0);
  CHECK(sub1 > sub0);
  CHECK(broken1 > broken0);
  memcolo_stats(&st);
  CHECK(st.hugepage_coverage < 1.0);
  CHECK(st.free_backed_bytes == 0);
  /* the surviving spans keep their content */
  for (int i = 1; i < 8; i += 2) CHECK(((unsigned char *)s[i]->start)[100] == 1);
  /* once empty, a broken huge page is released whole and intact again */
  for (int i = 1; i < 8; i += 2) mc_heap_free(s[i]);
  pthread_mutex_lock(&mc_heap.lock);
  size_t broken2 = mc_heap.hugepages_broken;
  ok = mc_heap_check_locked();
  pthread_mutex_unlock(&mc_heap.lock);
  CHECK(ok);
  CHECK(broken2 < broken1);
}

/* periodic release spares intact huge pages with fewer than 1/8 of their pages free
 * (breaking one takes all its used pages off huge page coverage); a release demanded by
 * pressure takes them */
TEST(test_periodic_release_spares_nearly_full) {
  mc_span_t *s[16];
  for (int i = 0; i < 16; i++) {
    s[i] = mc_heap_alloc(32, MC_SPAN_LARGE, false);
    CHECK(s[i] != NULL);
    memset((void *)s[i]->start, 1, 32 << 12);
  }
  mc_hugepage_t *hp = s[5]->hp;
  mc_heap_free(s[5]); /* 32 free backed pages on a huge page that was full or nearly */
  pthread_mutex_lock(&mc_heap.lock);
  unsigned fb = MC_HP_PAGES - hp->used_pages - hp->released_pages;
  bool intact0 = !hp->broken;
  mc_heap_release_periodic_locked(0, 0);
  unsigned fb1 = MC_HP_PAGES - hp->used_pages - hp->released_pages;
  bool intact1 = !hp->broken;
  bool ok = mc_heap_check_locked();
  pthread_mutex_unlock(&mc_heap.lock);
  CHECK(ok);
  if (intact0 && fb < MC_HP_PAGES / 8) CHECK(intact1 && fb1 == fb);
  CHECK(fb >= 32);
  pthread_mutex_lock(&mc_heap.lock);
  mc_heap_release_locked(0, false, 0);
  unsigned fb2 = MC_HP_PAGES - hp->used_pages - hp->released_pages;
  ok = mc_heap_check_locked();
  pthread_mutex_unlock(&mc_heap.lock);
  CHECK(ok);
  CHECK(fb2 == 0);
  for (int i = 0; i < 16; i++) if (i != 5) mc_heap_free(s[i]);
}

TEST(test_release_cache_only) {
  mc_span_t *s = mc_heap_alloc(256, MC_SPAN_LARGE, false);
  memset((void *)s->start, 1, 256 << 12);
  mc_span_t *t = mc_heap_alloc(256, MC_SPAN_LARGE, false);
  memset((void *)t->start, 1, 256 << 12);
  mc_heap_free(s);
  mc_heap_free(t);
  pthread_mutex_lock(&mc_heap.lock);
  size_t sub0 = mc_heap.subreleased_pages;
  size_t got = mc_heap_release_locked(0, true, 0);
  size_t sub1 = mc_heap.subreleased_pages;
  pthread_mutex_unlock(&mc_heap.lock);
  CHECK(sub1 == sub0); /* the cache only: no huge page broken */
  (void)got;
  CHECK(mc_heap.cache_backed_n == 0);
}

/* ISMM'21 §4 with a fake clock: 40 MiB of demand, then a drop */
TEST(test_skip_subrelease_and_tracker) {
  uint64_t t = 1000000;
  mc_fake_now_ms = t;
  pthread_mutex_lock(&mc_heap.lock);
  mc_heap_release_locked(0, false, 0);
  mc_release_test_reset_locked();
  mc_release_on_heap_change_locked(t);
  pthread_mutex_unlock(&mc_heap.lock);
  enum { N = 80 };
  mc_span_t *s[N];
  for (int i = 0; i < N; i++) { s[i] = mc_heap_alloc(128, MC_SPAN_LARGE, false); memset((void *)s[i]->start, 1, 128 << 12); }
  mc_fake_now_ms = (t += 1000);
  for (int i = 0; i < N; i += 2) mc_heap_free(s[i]); /* 20 MiB free inside used huge pages */
  memcolo_stats_t st0, st1, st2, st3;
  memcolo_stats(&st0);
  CHECK(st0.free_backed_bytes >= (20u << 20) - (1u << 20));
  /* one second later: the periodic release wants 1 MiB but the peak of Delta forbids it */
  mc_fake_now_ms = (t += 1000);
  pthread_mutex_lock(&mc_heap.lock);
  mc_release_tick_locked(t, 0);
  pthread_mutex_unlock(&mc_heap.lock);
  memcolo_stats(&st1);
  CHECK(st1.skipped_subrelease_bytes > st0.skipped_subrelease_bytes);
  CHECK(st1.subreleased_bytes == st0.subreleased_bytes);
  /* demand comes back within Delta: the skipped release is confirmed correct */
  mc_fake_now_ms = (t += 5000);
  for (int i = 0; i < N; i += 2) { s[i] = mc_heap_alloc(128, MC_SPAN_LARGE, false); }
  mc_fake_now_ms = (t += 2000);
  pthread_mutex_lock(&mc_heap.lock);
  mc_release_on_heap_change_locked(t);
  pthread_mutex_unlock(&mc_heap.lock);
  memcolo_stats(&st2);
  CHECK(st2.skipped_correct_bytes > 0);
  CHECK(st2.skipped_correct_bytes <= st2.skipped_subrelease_bytes);
  /* demand drops for good: after Delta the release proceeds, the skip is not confirmed */
  for (int i = 0; i < N; i += 2) mc_heap_free(s[i]);
  mc_fake_now_ms = (t += 1000);
  pthread_mutex_lock(&mc_heap.lock);
  mc_release_tick_locked(t, 0);
  pthread_mutex_unlock(&mc_heap.lock);
  uint64_t sub_before = 0;
  memcolo_stats(&st3);
  sub_before = st3.released_total_bytes;
  for (int k = 0; k < 70; k++) {
    mc_fake_now_ms = (t += 1000);
    pthread_mutex_lock(&mc_heap.lock);
    mc_release_tick_locked(t, 0);
    pthread_mutex_unlock(&mc_heap.lock);
  }
  memcolo_stats(&st3);
  CHECK(st3.released_total_bytes > sub_before);
  CHECK(st3.skipped_incorrect_bytes > 0);
  /* realized fragmentation: free memory existed in every epoch of the window only if
     it never dropped to zero; after the 20 MiB came back it did drop */
  CHECK(st3.realized_fragmentation_bytes <= st3.free_backed_bytes);
  for (int i = 1; i < N; i += 2) mc_heap_free(s[i]);
  mc_fake_now_ms = 0;
  CHECK(heap_ok());
}

TEST(test_realized_fragmentation) {
  uint64_t t = 5000000;
  mc_fake_now_ms = t;
  pthread_mutex_lock(&mc_heap.lock);
  mc_release_test_reset_locked();
  mc_release_on_heap_change_locked(t);
  pthread_mutex_unlock(&mc_heap.lock);
  mc_span_t *s[16];
  for (int i = 0; i < 16; i++) s[i] = mc_heap_alloc(128, MC_SPAN_LARGE, false);
  for (int i = 0; i < 16; i += 2) mc_heap_free(s[i]); /* ~4 MiB free, kept for 10 s */
  for (int k = 0; k < 10; k++) {
    mc_fake_now_ms = (t += 1000);
    pthread_mutex_lock(&mc_heap.lock);
    mc_release_on_heap_change_locked(t);
    pthread_mutex_unlock(&mc_heap.lock);
  }
  memcolo_stats_t st;
  memcolo_stats(&st);
  CHECK(st.realized_fragmentation_bytes >= (4u << 20) - (64u << 12));
  CHECK(st.realized_fragmentation_bytes <= st.average_fragmentation_bytes);
  /* one moment with no free memory makes the realized fragmentation zero */
  pthread_mutex_lock(&mc_heap.lock);
  mc_heap_release_locked(0, false, 0);
  pthread_mutex_unlock(&mc_heap.lock);
  memcolo_stats(&st);
  CHECK(st.realized_fragmentation_bytes == 0);
  for (int i = 1; i < 16; i += 2) mc_heap_free(s[i]);
  mc_fake_now_ms = 0;
}

/* Realized fragmentation (ISMM'21 §3.2-3.3) with worked numbers, T_schedule = 3 s: the
 * least free-and-mapped memory over the last 3 epochs of 1 s, each epoch keeping the
 * minimum it saw (its start included). Free pages by epoch (min / at the end):
 *   e0 0 / 0 (8 spans of 128 pages allocated)   e1 0 / 256 (2 spans freed)
 *   e2 256 / 256                                 e3 256 / 512 (2 more freed)
 *   e4 512 / 512   e5 512 / 512   e6 512 / 0 (everything released)
 * so realized = min over {e-2, e-1, e}: at e2 0 (e0, e1 saw nothing free), at e3 0, at
 * e4 256 pages (1 MiB: e2), at e5 1 MiB (e3), at e6 2 MiB, and 0 once e6 releases it.
 * The service bench reads it only once its run covers T_schedule (run_bench.py). */
TEST(test_realized_fragmentation_worked) {
  long saved = mc_options_cache[MC_OPT_T_SCHEDULE_S];
  mc_options_cache[MC_OPT_T_SCHEDULE_S] = 3;
  uint64_t t0 = 7000000;
  mc_fake_now_ms = t0;
  pthread_mutex_lock(&mc_heap.lock);
  mc_heap_release_locked(0, false, 0);
  CHECK(mc_heap.free_backed_pages == 0);
  mc_release_test_reset_locked();
  mc_release_on_heap_change_locked(t0);
  pthread_mutex_unlock(&mc_heap.lock);
  mc_span_t *s[8];
  for (int i = 0; i < 8; i++) s[i] = mc_heap_alloc(128, MC_SPAN_LARGE, false);
  memcolo_stats_t st;
  const uint64_t mib = 1u << 20;
#define RF_AT(sec) (mc_fake_now_ms = t0 + (sec) * 1000u, memcolo_stats(&st), st.realized_fragmentation_bytes)
  mc_fake_now_ms = t0 + 1000;
  mc_heap_free(s[0]);
  mc_heap_free(s[2]);
  CHECK(RF_AT(2) == 0);
  CHECK(st.average_fragmentation_bytes == 1 * mib);
  mc_fake_now_ms = t0 + 3000;
  mc_heap_free(s[4]);
  mc_heap_free(s[6]);
  CHECK(RF_AT(3) == 0);
  CHECK(RF_AT(4) == 1 * mib);
  CHECK(RF_AT(5) == 1 * mib);
  CHECK(RF_AT(6) == 2 * mib);
  CHECK(st.average_fragmentation_bytes == 2 * mib);
  pthread_mutex_lock(&mc_heap.lock);
  mc_heap_release_locked(0, false, 0);
  mc_release_on_heap_change_locked(mc_fake_now_ms);
  pthread_mutex_unlock(&mc_heap.lock);
  CHECK(RF_AT(6) == 0);
  CHECK(RF_AT(9) == 0);
#undef RF_AT
  for (int i = 1; i < 8; i += 2) mc_heap_free(s[i]);
  mc_fake_now_ms = 0;
  mc_options_cache[MC_OPT_T_SCHEDULE_S] = saved;
  CHECK(heap_ok());
}

TEST(test_realloc_growth_region) {
  MC_API(free)(MC_API(malloc)(600));
  CHECK(heap_ok());
  size_t base = used_pages(), base_growth = mc_heap.growth_regions;
  unsigned char *p = (unsigned char *)MC_API(malloc)(600);
  memset(p, 5, 600);
  /* growth past MC_GROW_MIN_BYTES: one move into a growth region, then in place */
  p = (unsigned char *)MC_API(realloc)(p, 1500);
  mc_span_t *g = mc_pagemap_get(p);
  CHECK(g != NULL && g->kind == MC_SPAN_REGION && g->growth);
  CHECK(mc_heap.growth_regions == base_growth + 1);
  CHECK(p[0] == 5 && p[599] == 5);
  unsigned char *first = p;
  size_t n = 1500;
  int moved = 0;
  for (; n < (1u << 20); n += n / 2) {
    p = (unsigned char *)MC_API(realloc)(p, n + n / 2);
    moved += p != first;
    p[n + n / 2 - 1] = 7;
  }
  CHECK(moved == 0);
  CHECK(p[0] == 5 && p[599] == 5);
  CHECK(MC_API(malloc_usable_size)(p) >= n);
  /* past its room: mremap, the content stays */
  p = (unsigned char *)MC_API(realloc)(p, 8u << 20);
  CHECK(p != NULL && p[0] == 5 && p[599] == 5);
  g = mc_pagemap_get(p);
  CHECK(g != NULL && g->growth && g->cap_pages >= g->pages && g->pages == (8u << 20) / MC_PAGE_SIZE);
  /* a shrink keeps the pointer and the room */
  unsigned char *q = (unsigned char *)MC_API(realloc)(p, 3000);
  CHECK(q == p && q[0] == 5 && q[599] == 5);
  CHECK(g->pages == 1);
  q = (unsigned char *)MC_API(realloc)(q, 100000);
  CHECK(q == p && q[0] == 5);
  CHECK(heap_ok());
  MC_API(free)(q);
  CHECK(mc_heap.growth_regions == base_growth);
  CHECK(used_pages() == base);
  CHECK(heap_ok());
  /* at most MC_GROW_REGIONS_MAX live: the others grow by copying, as before */
  enum { N = MC_GROW_REGIONS_MAX + 6 };
  unsigned char *b[N];
  int regions = 0, bad = 0;
  for (int i = 0; i < N; i++) {
    b[i] = (unsigned char *)MC_API(malloc)(500);
    memset(b[i], i, 500);
    b[i] = (unsigned char *)MC_API(realloc)(b[i], 5000);
    mc_span_t *s = mc_pagemap_get(b[i]);
    regions += s->kind == MC_SPAN_REGION && s->growth;
  }
  CHECK(regions == MC_GROW_REGIONS_MAX - (int)base_growth);
  CHECK(mc_heap.growth_regions == MC_GROW_REGIONS_MAX);
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < 500; k++) bad += b[i][k] != (unsigned char)i;
    MC_API(free)(b[i]);
  }
  CHECK(bad == 0);
  CHECK(mc_heap.growth_regions == base_growth);
  CHECK(heap_ok());
}

/* thread cache arrays: a thread that only allocates a class holds one batch's slots; a
 * thread that only frees it (a consumer) holds at most half a batch before flushing; a
 * thread that frees what it allocated grows its array with its bound */
typedef struct { void **objs; int n; unsigned cls; uint32_t cap, max, count; } tc_probe_t;
static void *tc_alloc_only(void *arg) {
  tc_probe_t *p = (tc_probe_t *)arg;
  for (int i = 0; i < p->n; i++) p->objs[i] = MC_API(malloc)(mc_class_size[p->cls] - MC_T_PAD);
  p->cap = mc_tcache->cap[p->cls];
  return NULL;
}
static void *tc_free_only(void *arg) {
  tc_probe_t *p = (tc_probe_t *)arg;
  for (int i = 0; i < p->n; i++) {
    MC_API(free)(p->objs[i]);
    if (mc_tcache->bins[p->cls].count > p->count) p->count = mc_tcache->bins[p->cls].count;
  }
  p->cap = mc_tcache->cap[p->cls];
  p->max = mc_tcache->bins[p->cls].max;
  return NULL;
}
static void *tc_alloc_free(void *arg) {
  tc_probe_t *p = (tc_probe_t *)arg;
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < p->n; i++) p->objs[i] = MC_API(malloc)(mc_class_size[p->cls] - MC_T_PAD);
    for (int i = 0; i < p->n; i++) MC_API(free)(p->objs[i]);
  }
  p->cap = mc_tcache->cap[p->cls];
  p->max = mc_tcache->bins[p->cls].max;
  p->count = mc_tcache->bins[p->cls].count;
  return NULL;
}
TEST(test_tcache_arrays_sized_by_use) {
  unsigned cls = mc_size_to_class(384);
  uint32_t batch = mc_class_batch[cls];
  enum { N = 2000 };
  static void *objs[N];
  tc_probe_t p = {objs, N, cls, 0, 0, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, tc_alloc_only, &p) == 0);
  pthread_join(t, NULL);
  CHECK(p.cap == batch);
  int nulls = 0;
  for (int i = 0; i < N; i++) nulls += objs[i] == NULL;
  CHECK(nulls == 0);
  tc_probe_t q = {objs, N, cls, 0, 0, 0};
  CHECK(pthread_create(&t, NULL, tc_free_only, &q) == 0);
  pthread_join(t, NULL);
  CHECK(q.max == (batch + 1) / 2);
  CHECK(q.cap <= batch); /* a recycled record keeps its array */
  CHECK(q.count <= (batch + 1) / 2);
  tc_probe_t r = {objs, (int)mc_class_tcap[cls], cls, 0, 0, 0};
  CHECK(pthread_create(&t, NULL, tc_alloc_free, &r) == 0);
  pthread_join(t, NULL);
  CHECK(r.cap > batch && r.cap <= mc_class_tcap[cls]);
  CHECK(r.count <= r.max && r.max <= r.cap);
  CHECK(heap_ok());
}

/* a thread cache hands out the objects of a span in ascending address order, which the
 * hardware prefetchers follow */
static void *tc_alloc_ascending(void *arg) {
  tc_probe_t *p = (tc_probe_t *)arg;
  for (int i = 0; i < p->n; i++) p->objs[i] = MC_API(malloc)(mc_class_size[p->cls] - MC_T_PAD);
  return NULL;
}
TEST(test_span_objects_ascending) {
  unsigned cls = mc_size_to_class(48);
  enum { N = 300 };
  static void *objs[N];
  mc_central_drain();
  tc_probe_t p = {objs, N, cls, 0, 0, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, tc_alloc_ascending, &p) == 0);
  pthread_join(t, NULL);
  int pairs = 0, descending = 0;
  for (int i = 0; i + 1 < N; i++) {
    CHECK(objs[i] != NULL);
    if (mc_pagemap_get(objs[i]) != mc_pagemap_get(objs[i + 1])) continue;
    pairs++;
    descending += (uintptr_t)objs[i + 1] < (uintptr_t)objs[i];
  }
  CHECK(pairs > N / 2);
  CHECK(descending == 0);
  for (int i = 0; i < N; i++) MC_API(free)(objs[i]);
}

/* On a kernel with MADV_COLLAPSE, an EINVAL for one range (here a VM_NOHUGEPAGE one)
 * after a collapse succeeded does not turn background collapse off, nor warn that the
 * kernel lacks the advice. */
TEST(test_collapse_einval_after_a_success_keeps_collapse_on) {
  CHECK(mc_os_thp_background());
  if (!mc_os_thp_background()) return; /* THP off on this machine: reported above */
  char *p = mc_os_map_huge(2 * MC_HUGE_SIZE);
  CHECK(p != NULL);
  if (!p) return;
  memset(p, 1, 2 * MC_HUGE_SIZE);
  int ok = 0;
  for (int i = 0; i < 5 && !ok; i++) ok = mc_os_collapse(p); /* EAGAIN is transient */
  CHECK(ok);
  madvise(p + MC_HUGE_SIZE, MC_HUGE_SIZE, MADV_NOHUGEPAGE);
  CHECK(!mc_os_collapse(p + MC_HUGE_SIZE));
  CHECK(mc_os_thp_background());
  mc_os_unmap(p, 2 * MC_HUGE_SIZE);
}

/* Background THP leaves huge pages that hold live allocations alone when asked to
 * (class lc: the application's accesses to a page being collapsed wait for the copy):
 * with a dense, intact huge page in use in the filler, such a pass makes no
 * MADV_COLLAPSE call and changes no huge page, while a pass that may collapse pages in
 * use does try it. */
TEST(test_collapse_pass_spares_pages_in_use_when_asked) {
  CHECK(mc_os_thp_background());
  if (!mc_os_thp_background()) return;
  /* spans of 7/16 of a huge page (the filler serves spans up to 1 MiB) until two share
   * an intact huge page: earlier tests left broken ones, which are filled first */
  enum { N = 64 };
  mc_span_t *sp[N];
  int n = 0, x = -1, y = -1;
  for (; n < N && x < 0; n++) {
    sp[n] = mc_heap_alloc(MC_HP_PAGES * 7 / 16, MC_SPAN_LARGE, false);
    if (sp[n] == NULL) break;
    for (int j = 0; j < n; j++)
      if (sp[j]->hp == sp[n]->hp && !sp[n]->hp->broken) { x = j; y = n; break; }
  }
  CHECK(x >= 0);
  if (x >= 0) {
    memset((void *)sp[x]->start, 7, (MC_HP_PAGES * 7 / 16) << MC_PAGE_SHIFT);
    memset((void *)sp[y]->start, 7, (MC_HP_PAGES * 7 / 16) << MC_PAGE_SHIFT);
    uint64_t thp0 = mc_heap.hugepages_thp, calls0 = mc_os_collapse_calls;
    for (int i = 0; i < 3; i++) CHECK(mc_heap_collapse_pass(1000000, false, false) == 0);
    CHECK(mc_heap.hugepages_thp == thp0);
    CHECK(mc_os_collapse_calls == calls0);
    /* the first pass that looks marks it dense, the next tries it */
    for (int i = 0; i < 2; i++) mc_heap_collapse_pass(1000000, true, false);
    CHECK(mc_os_collapse_calls > calls0);
    CHECK(((unsigned char *)sp[x]->start)[4096] == 7 && ((unsigned char *)sp[y]->start)[4096] == 7);
  }
  for (int i = 0; i < n; i++) if (sp[i]) mc_heap_free(sp[i]);
}

/* A size as README writes it: 5m, 1g, 4k, or bytes. */
static void print_size(long v) {
  if (v != 0 && v % (1L << 30) == 0) printf("%ldg", v >> 30);
  else if (v != 0 && v % (1L << 20) == 0) printf("%ldm", v >> 20);
  else if (v != 0 && v % (1L << 10) == 0) printf("%ldk", v >> 10);
  else printf("%ld", v);
}

static void print_x100(long v) {
  if (v % 100 == 0) printf("%ld", v / 100);
  else printf("%ld.%02ld", v / 100, v % 100);
}

/* --options-table: options.c's table as the Markdown table of README.md (checked by
 * test/options_table.sh). */
static void print_options_table(void) {
  static const char *type_name[] = {
    [MC_OT_INT] = "int", [MC_OT_BOOL] = "bool", [MC_OT_BYTES] = "bytes", [MC_OT_X100] = "decimal",
    [MC_OT_CHOICE] = "choice", [MC_OT_PATH] = "path", [MC_OT_RATIO] = "decimal"};
  printf("| Option | Type | Default | Range | Meaning |\n|---|---|---|---|---|\n");
  for (int i = 0; i < MC_OPT__COUNT; i++) {
    const mc_option_desc_t *d = mc_option_desc((mc_option_t)i);
    printf("| `MEMCOLO_%s` | %s | ", d->name, type_name[d->type]);
    switch (d->type) {
    case MC_OT_INT: case MC_OT_BOOL: printf("%ld", d->def); break;
    case MC_OT_BYTES: print_size(d->def); break;
    case MC_OT_X100: print_x100(d->def); break;
    case MC_OT_PATH: printf("%s", d->sdef ? d->sdef : "unset"); break;
    default: printf("unset"); break;
    }
    printf(" | ");
    switch (d->type) {
    case MC_OT_BOOL: printf("0, 1"); break;
    case MC_OT_INT: printf("%ld..%ld", d->min, d->max); break;
    case MC_OT_BYTES:
      printf(">= "); print_size(d->min);
      if (d->max != LONG_MAX) { printf(", <= "); print_size(d->max); }
      break;
    case MC_OT_X100: print_x100(d->min); printf(".."); print_x100(d->max); break;
    case MC_OT_CHOICE:
      for (const char *c = d->sdef; *c; c++) {
        if (c == d->sdef) printf("`");
        if (*c == ',') printf("`, `"); else putchar(*c);
      }
      printf("`");
      break;
    case MC_OT_PATH: printf("a Unix socket path"); break;
    case MC_OT_RATIO: printf("0..1"); break;
    }
    printf(" | %s |\n", d->doc);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--options-table") == 0) {
    print_options_table();
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--print-text-options") == 0) {
    free(malloc(1));
    const char *t_miss = MC_OPT_STR(MC_OPT_T_MISS), *tier_sock = MC_OPT_STR(MC_OPT_TIER_SOCKET);
    printf("%s %s %s %ld %ld %ld %ld %ld %ld\n", MC_OPT_STR(MC_OPT_SOCKET), t_miss ? t_miss : "-",
           tier_sock ? tier_sock : "-", MC_OPT(MC_OPT_TIER_THRESHOLD), MC_OPT(MC_OPT_STATS),
           MC_OPT(MC_OPT_RSV_YIELD_MODE), MC_OPT(MC_OPT_TCACHE_BYTES), MC_OPT(MC_OPT_CLASS),
           MC_OPT(MC_OPT_TIER_RECOVER_S));
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--print-options") == 0) {
    free(malloc(1));
    printf("%ld %ld %ld %ld %ld %ld\n", MC_OPT(MC_OPT_RSV_FACTOR_PCT), MC_OPT(MC_OPT_MIN_RSV_BYTES),
           MC_OPT(MC_OPT_SKIP_SUBRELEASE_S), MC_OPT(MC_OPT_CLASS), MC_OPT(MC_OPT_RSV_HORIZON_MS),
           MC_OPT(MC_OPT_MGMT_NICE));
    return 0;
  }
  /* The release tests drive the clock and the release ticks themselves (fake time): no
   * management thread may run the periodic release beside them. */
  mc_mgmt_autostart_off();
  free(malloc(1));
  RUN(test_size_classes);
  RUN(test_options_from_env);
  RUN(test_options_text_bools_ranges_and_overflow);
  RUN(test_filler_packing);
  RUN(test_realloc_growth_region);
  RUN(test_tcache_arrays_sized_by_use);
  RUN(test_span_objects_ascending);
  RUN(test_filler_longest_free_incremental);
  RUN(test_hugepages_carved_from_chunks);
  RUN(test_subrelease_breaks_and_heals);
  RUN(test_periodic_release_spares_nearly_full);
  RUN(test_release_cache_only);
  RUN(test_skip_subrelease_and_tracker);
  RUN(test_realized_fragmentation);
  RUN(test_realized_fragmentation_worked);
  RUN(test_collapse_einval_after_a_success_keeps_collapse_on);
  RUN(test_collapse_pass_spares_pages_in_use_when_asked);
  TEST_END();
}
