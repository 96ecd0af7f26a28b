/* tcache.c — per-thread caches: per size class a singly linked list of free objects
 * with a length bound that grows by one batch on each underflow (TCMalloc's slow
 * start) up to MEMCOLO_TCACHE bytes' worth; an overflow returns one batch to the
 * central list; a thread over its byte budget returns half of every list. Thread exit
 * (pthread key destructor) returns everything; caches are recycled. */
#include <string.h>

#include "internal.h"

__thread mc_tcache_t *mc_tcache __attribute__((tls_model("initial-exec")));
static pthread_key_t mc_tcache_key;
static mc_tcache_t *mc_tcache_all, *mc_tcache_free;
static size_t mc_tcache_live;

static void mc_tcache_flush_bin(mc_tcache_t *tc, unsigned cls, uint32_t keep) {
  mc_bin_t *b = &tc->bins[cls];
  void *batch[64];
  while (b->count > keep) {
    int n = 0;
    while (n < 64 && b->count > keep) {
      void *p = b->head;
      mc_span_t *s = mc_pagemap_get(p);
      if (p == NULL || s == NULL || s->kind != MC_SPAN_SMALL || s->sclass != cls) {
        mc_fatal("corrupted thread cache free list: entry ", p, (long)cls, "a free object of this size class");
      }
      b->head = *(void **)p;
      b->count--;
      batch[n++] = p;
    }
    mc_central_return(cls, batch, n);
  }
}

static void mc_tcache_destroy(void *arg) {
  mc_tcache_t *tc = (mc_tcache_t *)arg;
  if (tc == NULL) return;
  for (unsigned c = 1; c < MC_CLASSES; c++) mc_tcache_flush_bin(tc, c, 0);
  mc_tcache = NULL;
  pthread_mutex_lock(&mc_heap.lock);
  if (tc->prev_all) tc->prev_all->next_all = tc->next_all; else mc_tcache_all = tc->next_all;
  if (tc->next_all) tc->next_all->prev_all = tc->prev_all;
  tc->next_all = mc_tcache_free;
  mc_tcache_free = tc;
  mc_tcache_live--;
  pthread_mutex_unlock(&mc_heap.lock);
}

void mc_tcache_init(void) { pthread_key_create(&mc_tcache_key, mc_tcache_destroy); }

mc_tcache_t *mc_tcache_get_slow(void) {
  mc_ensure_init();
  if (mc_tcache) return mc_tcache;
  pthread_mutex_lock(&mc_heap.lock);
  mc_tcache_t *tc = mc_tcache_free;
  if (tc) mc_tcache_free = tc->next_all;
  else tc = (mc_tcache_t *)mc_os_meta_alloc(sizeof(mc_tcache_t));
  if (tc) {
    memset(tc, 0, sizeof(*tc));
    for (unsigned c = 1; c < MC_CLASSES; c++) tc->bins[c].max = mc_class_batch[c];
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

void *mc_tcache_refill(mc_tcache_t *tc, unsigned cls) {
  mc_bin_t *b = &tc->bins[cls];
  uint32_t batch = mc_class_batch[cls];
  void *objs[32];
  int n = mc_central_fetch(cls, objs, (int)batch);
  if (n == 0) return NULL;
  for (int i = n - 1; i >= 1; i--) {
    *(void **)objs[i] = b->head;
    b->head = objs[i];
  }
  b->count += (uint32_t)(n - 1);
  /* slow start: a class that keeps missing may cache more */
  uint32_t limit = (uint32_t)((size_t)MC_OPT(MC_OPT_TCACHE_BYTES) / 4 / mc_class_size[cls]);
  if (limit < batch) limit = batch;
  if (b->max < limit) b->max += batch;
  return objs[0];
}

void mc_tcache_overflow(mc_tcache_t *tc, unsigned cls) {
  mc_bin_t *b = &tc->bins[cls];
  uint32_t batch = mc_class_batch[cls];
  mc_tcache_flush_bin(tc, cls, b->count > batch ? b->count - batch : 0);
  size_t bytes = 0;
  for (unsigned c = 1; c < MC_CLASSES; c++) bytes += (size_t)tc->bins[c].count * mc_class_size[c];
  if (bytes > (size_t)MC_OPT(MC_OPT_TCACHE_BYTES)) {
    for (unsigned c = 1; c < MC_CLASSES; c++) {
      mc_tcache_flush_bin(tc, c, tc->bins[c].count / 2);
      if (tc->bins[c].max > 2 * mc_class_batch[c]) tc->bins[c].max /= 2;
    }
  }
}

/* Empties the calling thread's cache (malloc_trim). */
void mc_tcache_flush_self(void) {
  mc_tcache_t *tc = mc_tcache;
  if (tc == NULL) return;
  for (unsigned c = 1; c < MC_CLASSES; c++) mc_tcache_flush_bin(tc, c, 0);
}

/* After fork the child has only the forking thread: the other threads' caches are
 * unreachable; their objects are simply leaked (as every allocator does), but the
 * records are recycled. Runs with the heap lock re-initialized. */
void mc_tcache_flush_all_for_fork_child(void) {
  mc_tcache_t *me = mc_tcache;
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

bool mc_tcache_contains(mc_tcache_t *tc, unsigned cls, const void *p) {
  if (tc == NULL) return false;
  uint32_t guard = tc->bins[cls].count + 1;
  for (void *q = tc->bins[cls].head; q != NULL && guard-- > 0; q = *(void **)q) {
    if (q == p) return true;
  }
  return false;
}
