/* tcache.c — per-thread caches: per size class an array (a stack) of free objects, so
 * that malloc pops and free pushes a pointer without touching the object (jemalloc's
 * tcache bins, TCMalloc's per-CPU slabs). A list's bound starts at half a batch (a
 * thread that only frees a class, a consumer, parks a quarter batch on average instead
 * of half) and grows by one batch on each underflow (TCMalloc's slow start) up to the
 * class's capacity (mc_class_tcap: a quarter of MEMCOLO_TCACHE's bytes); an overflow
 * returns the oldest half of the list to the central lists; a thread over its byte
 * budget returns half of every list. A list's array is allocated on its first use and
 * doubled when frees fill it (up to the bound), so a thread keeps resident only the
 * slots its lists reach: arrays of full capacity for every class cost about 60 KiB of
 * RSS per thread (a page per class touched; 250 KiB of a producer/consumer run with
 * four threads and a 4.7 MiB peak). Each thread is
 * given a central shard (round robin). Thread exit (pthread key destructor) returns
 * everything; caches and their arrays are recycled. */
#include <string.h>

#include "internal.h"

mc_tcache_t mc_tcache_none; /* bins of count 0 and max 0: malloc and free take their slow paths */
__thread mc_tcache_t *mc_tcache __attribute__((tls_model("initial-exec"))) = &mc_tcache_none;
__thread int mc_tcache_dead __attribute__((tls_model("initial-exec"))); /* its cache was destroyed */
static pthread_key_t mc_tcache_key;
static mc_tcache_t *mc_tcache_all, *mc_tcache_free;
static size_t mc_tcache_live;
static unsigned mc_tcache_next_shard;

/* returns the `n` oldest objects of a list (the bottom of the stack) to the central lists */
static void mc_tcache_flush_oldest(mc_tcache_t *tc, unsigned cls, uint32_t n) {
  mc_bin_t *b = &tc->bins[cls];
  if (n > b->count) n = b->count;
  if (n == 0) return;
  mc_central_return(cls, b->slots, (int)n);
  memmove(b->slots, b->slots + n, (size_t)(b->count - n) * sizeof(void *));
  b->count -= n;
}

static void mc_tcache_destroy(void *arg) {
  mc_tcache_t *tc = (mc_tcache_t *)arg;
  if (tc == NULL) return;
  for (unsigned c = 1; c < MC_CLASSES; c++) mc_tcache_flush_oldest(tc, c, tc->bins[c].count);
  mc_tcache = &mc_tcache_none;
  mc_tcache_dead = 1;
  pthread_mutex_lock(&mc_heap.lock);
  mc_stat_slow_calls += tc->slow_calls;
  mc_stat_large_allocs += tc->large_allocs;
  if (tc->prev_all) tc->prev_all->next_all = tc->next_all; else mc_tcache_all = tc->next_all;
  if (tc->next_all) tc->next_all->prev_all = tc->prev_all;
  tc->next_all = mc_tcache_free;
  mc_tcache_free = tc;
  mc_tcache_live--;
  pthread_mutex_unlock(&mc_heap.lock);
}

void mc_tcache_init(void) { pthread_key_create(&mc_tcache_key, mc_tcache_destroy); }

/* a new cache record; its arrays come with the first use of each class */
static mc_tcache_t *mc_tcache_new(void) { return (mc_tcache_t *)mc_os_meta_alloc(sizeof(mc_tcache_t)); }

/* makes the array of class cls hold at least `want` (<= mc_class_tcap) slots: a new
 * array of twice the capacity (metadata memory, never freed: the old array's slots
 * stay with the record, at most as many as the final array's); false on OOM */
static bool mc_tcache_reserve(mc_tcache_t *tc, unsigned cls, uint32_t want) {
  if (want <= tc->cap[cls]) return true;
  uint32_t cap = 2u * tc->cap[cls];
  if (cap < want) cap = want;
  if (cap > mc_class_tcap[cls]) cap = mc_class_tcap[cls];
  if (cap < want) return false;
  void **arr = (void **)mc_os_meta_alloc((size_t)cap * sizeof(void *));
  if (arr == NULL) return false;
  mc_bin_t *b = &tc->bins[cls];
  if (b->count) memcpy(arr, b->slots, (size_t)b->count * sizeof(void *));
  b->slots = arr;
  tc->cap[cls] = (uint16_t)cap;
  return true;
}

/* the fast paths' bound: the list's bound within the array's capacity */
static inline void mc_tcache_set_max(mc_tcache_t *tc, unsigned cls) {
  tc->bins[cls].max = tc->lmax[cls] < tc->cap[cls] ? tc->lmax[cls] : tc->cap[cls];
}

mc_tcache_t *mc_tcache_get_slow(void) {
  mc_ensure_init();
  if (mc_tcache != &mc_tcache_none) return mc_tcache;
  if (mc_tcache_dead) return NULL; /* malloc/free from later TLS destructors: go central */
  pthread_mutex_lock(&mc_heap.lock);
  mc_tcache_t *tc = mc_tcache_free;
  if (tc) mc_tcache_free = tc->next_all;
  else tc = mc_tcache_new();
  if (tc) {
    for (unsigned c = 1; c < MC_CLASSES; c++) { /* a recycled record keeps its arrays */
      tc->bins[c].count = 0;
      tc->lmax[c] = (uint16_t)((mc_class_batch[c] + 1) / 2);
      mc_tcache_set_max(tc, c);
    }
    tc->shard = mc_tcache_next_shard++ % mc_nshards;
    tc->slow_calls = tc->large_allocs = 0;
    tc->prev_all = NULL;
    tc->next_all = mc_tcache_all;
    if (mc_tcache_all) mc_tcache_all->prev_all = tc;
    mc_tcache_all = tc;
    mc_tcache_live++;
  }
  pthread_mutex_unlock(&mc_heap.lock);
  if (tc == NULL) return NULL;
  mc_tcache = tc;
  pthread_setspecific(mc_tcache_key, tc);
  return tc;
}

/* an empty list: one batch from the central lists; returns one object, NULL on OOM */
void *mc_tcache_refill(mc_tcache_t *tc, unsigned cls) {
  mc_bin_t *b = &tc->bins[cls];
  uint32_t batch = mc_class_batch[cls];
  /* slow start: a class that keeps missing may cache more (the array grows only when
   * frees fill it: a thread that only allocates holds one batch's slots) */
  if (tc->lmax[cls] + batch <= mc_class_tcap[cls]) tc->lmax[cls] = (uint16_t)(tc->lmax[cls] + batch);
  if (!mc_tcache_reserve(tc, cls, batch)) { /* no array (metadata OOM): one object from the shard */
    void *p = NULL;
    return mc_central_fetch(tc->shard, cls, &p, 1) ? p : NULL;
  }
  mc_tcache_set_max(tc, cls);
  int n = mc_central_fetch(tc->shard, cls, b->slots + b->count, (int)batch);
  if (n == 0) return NULL;
  b->count += (uint32_t)n;
  return b->slots[--b->count];
}

/* a full list (count == max). Below the list's bound, the array grows (or is made, on
 * a thread's first free of the class). At the bound, the oldest half goes (at least a
 * batch; moving the rest down costs one pointer per object freed, where a batch at a
 * time would move the whole list every batch); over the byte budget, half of all.
 * Returns false when the list has no room (metadata OOM): the caller gives its object
 * to the central lists itself. */
bool mc_tcache_overflow(mc_tcache_t *tc, unsigned cls) {
  mc_bin_t *b = &tc->bins[cls];
  if (b->count < tc->lmax[cls]) {
    uint32_t want = b->count + mc_class_batch[cls];
    if (want > tc->lmax[cls]) want = tc->lmax[cls];
    bool ok = mc_tcache_reserve(tc, cls, want);
    mc_tcache_set_max(tc, cls);
    if (ok) return true;
    if (b->count < b->max) return true;
    if (b->max == 0) return false;
  }
  uint32_t n = b->count / 2;
  if (n < mc_class_batch[cls]) n = mc_class_batch[cls];
  mc_tcache_flush_oldest(tc, cls, n);
  size_t bytes = 0;
  for (unsigned c = 1; c < MC_CLASSES; c++) bytes += (size_t)tc->bins[c].count * mc_class_size[c];
  if (bytes > (size_t)MC_OPT(MC_OPT_TCACHE_BYTES)) {
    for (unsigned c = 1; c < MC_CLASSES; c++) {
      mc_tcache_flush_oldest(tc, c, tc->bins[c].count - tc->bins[c].count / 2);
      if (tc->lmax[c] > 2u * mc_class_batch[c]) tc->lmax[c] /= 2;
      mc_tcache_set_max(tc, c);
    }
  }
  return true;
}

/* Empties the calling thread's cache (malloc_trim). */
void mc_tcache_flush_self(void) {
  mc_tcache_t *tc = mc_tcache_self();
  if (tc == NULL) return;
  for (unsigned c = 1; c < MC_CLASSES; c++) mc_tcache_flush_oldest(tc, c, tc->bins[c].count);
}

/* After fork the child has only the forking thread: the other threads' caches are
 * unreachable; their objects are simply leaked (as every allocator does), but the
 * records are recycled. Runs with the heap lock re-initialized. */
void mc_tcache_flush_all_for_fork_child(void) {
  mc_tcache_t *me = mc_tcache_self();
  mc_tcache_t *tc = mc_tcache_all;
  mc_tcache_all = NULL;
  mc_tcache_live = 0;
  while (tc) {
    mc_tcache_t *next = tc->next_all;
    if (tc != me) { tc->next_all = mc_tcache_free; mc_tcache_free = tc; }
    tc = next;
  }
  if (me) {
    me->next_all = NULL;
    me->prev_all = NULL;
    mc_tcache_all = me;
    mc_tcache_live = 1;
  }
}

size_t mc_tcache_count(void) { return mc_tcache_live; }

/* the counters of live threads (read without their owners' cooperation: a snapshot
 * that may lag by a few calls) plus those of exited threads */
void mc_tcache_sum_stats(uint64_t *slow_calls, uint64_t *large_allocs) {
  pthread_mutex_lock(&mc_heap.lock);
  uint64_t s = __atomic_load_n(&mc_stat_slow_calls, __ATOMIC_RELAXED);
  uint64_t l = __atomic_load_n(&mc_stat_large_allocs, __ATOMIC_RELAXED);
  for (mc_tcache_t *tc = mc_tcache_all; tc; tc = tc->next_all) {
    s += __atomic_load_n(&tc->slow_calls, __ATOMIC_RELAXED);
    l += __atomic_load_n(&tc->large_allocs, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&mc_heap.lock);
  *slow_calls = s;
  *large_allocs = l;
}

bool mc_tcache_contains(mc_tcache_t *tc, unsigned cls, const void *p) {
  if (tc == NULL) return false;
  const mc_bin_t *b = &tc->bins[cls];
  for (uint32_t i = 0; i < b->count; i++) {
    if (b->slots[i] == p) return true;
  }
  return false;
}
