/* central.c — the central lists, per shard and size class (TCMalloc's transfer cache
 * and central free list; jemalloc's per-arena bins):
 *   - a transfer cache: an array of free objects that thread caches exchange in
 *     batches (memcpy of pointers under a short lock; the cheap path for
 *     producer/consumer frees), bounded at 32 KiB worth (at least two batches);
 *   - the spans with free objects, each with a bitmap of its free objects: taking a
 *     batch scans words of the bitmap, giving one back sets a bit. No object is read
 *     or written, so no cache line of the application's data is touched and a
 *     use-after-free write cannot corrupt the allocator's lists.
 * A thread refills from its own shard; objects go back to the shard of their span (the
 * page map entry says which), so memory freed by a consumer returns to the producer
 * that allocated it. A span whose objects all came back goes back to the page heap
 * (after the shard's lock is dropped). Checks, all off the fast path: an object given
 * back must be in the page map as an object of its class (else the thread cache's list
 * was corrupted), on an object boundary of its span, and not already free in its span
 * (a double free). */
#define _GNU_SOURCE
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define MC_TRANSFER_SLOTS 256
#ifndef MC_TRANSFER_BYTES
#define MC_TRANSFER_BYTES (32 << 10) /* a transfer cache holds this much, at least two batches */
#endif

typedef struct mc_central_s {
  pthread_mutex_t lock;
  int ntransfer, transfer_max;
  mc_span_t *nonempty;
  void **transfer;           /* transfer_max slots, in mc_transfer_slots */
} __attribute__((aligned(64))) mc_central_t;

/* The headers are dense (one cache line each) and the transfer arrays apart, so that
 * a process touches (and keeps resident) only the arrays of the classes it uses: set
 * up in place, 8 shards x 40 classes of arrays would cost 700 KiB of RSS at start.
 * The arrays are packed end to end, each of its class's bound (transfer_max slots, not
 * MC_TRANSFER_SLOTS), so that a shard's arrays for the classes a program uses share
 * pages (about 25 KiB per shard for the classes up to 512 B, not 2 KiB per class). */
static mc_central_t mc_central[MC_MAX_SHARDS][MC_CLASSES];
static void *mc_transfer_slots[MC_MAX_SHARDS * MC_CLASSES * MC_TRANSFER_SLOTS];
unsigned mc_nshards = 1;

/* short critical sections: spin a little before sleeping (glibc's adaptive mutex) */
static pthread_mutexattr_t mc_central_attr;

/* The CPUs this process may run on. Through syscall(2), not sched_getaffinity(3): the
 * latter's text lies in a 64 KiB window of libc that nothing else of a typical program
 * touches, and a file page's fault maps its whole window (fault-around), so the one
 * call at init cost 64 KiB of RSS (of a 4.7 MiB producer/consumer run); syscall's
 * wrapper shares a page with mmap's, which the heap calls anyway. */
static unsigned mc_cpus_allowed(void) {
  uint64_t mask[16]; /* 1024 CPUs */
  long bytes = syscall(SYS_sched_getaffinity, 0, sizeof(mask), mask);
  if (bytes <= 0) return 1;
  unsigned n = 0;
  for (long w = 0; w < bytes / 8; w++) n += (unsigned)__builtin_popcountll(mask[w]);
  return n;
}

void mc_central_init(void) {
  pthread_mutexattr_init(&mc_central_attr);
  pthread_mutexattr_settype(&mc_central_attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  unsigned n = mc_cpus_allowed();
  mc_nshards = n < 1 ? 1 : (n > MC_MAX_SHARDS ? MC_MAX_SHARDS : n);
  size_t used = 0;
  for (unsigned sh = 0; sh < mc_nshards; sh++) { /* the other shards are never used */
    for (unsigned c = 1; c < MC_CLASSES; c++) {
      mc_central_t *ce = &mc_central[sh][c];
      pthread_mutex_init(&ce->lock, &mc_central_attr);
      int m = (int)((size_t)MC_TRANSFER_BYTES / mc_class_size[c]);
      if (m < 2 * mc_class_batch[c]) m = 2 * mc_class_batch[c];
      ce->transfer_max = m > MC_TRANSFER_SLOTS ? MC_TRANSFER_SLOTS : m;
      ce->transfer = &mc_transfer_slots[used];
      used += (size_t)ce->transfer_max;
    }
  }
}

void mc_central_lock_all(void) {
  for (unsigned sh = 0; sh < mc_nshards; sh++)
    for (unsigned c = 1; c < MC_CLASSES; c++) pthread_mutex_lock(&mc_central[sh][c].lock);
}
void mc_central_unlock_all(void) {
  for (unsigned sh = 0; sh < mc_nshards; sh++)
    for (unsigned c = 1; c < MC_CLASSES; c++) pthread_mutex_unlock(&mc_central[sh][c].lock);
}
void mc_central_reinit_locks(void) {
  for (unsigned sh = 0; sh < mc_nshards; sh++)
    for (unsigned c = 1; c < MC_CLASSES; c++) pthread_mutex_init(&mc_central[sh][c].lock, &mc_central_attr);
}

static void span_list_push(mc_central_t *ce, mc_span_t *s) {
  s->prev = NULL;
  s->next = ce->nonempty;
  if (ce->nonempty) ce->nonempty->prev = s;
  ce->nonempty = s;
  s->in_central = 1;
}
static void span_list_remove(mc_central_t *ce, mc_span_t *s) {
  if (s->prev) s->prev->next = s->next; else ce->nonempty = s->next;
  if (s->next) s->next->prev = s->prev;
  s->next = s->prev = NULL;
  s->in_central = 0;
}

/* the index of object p in span s, or a fatal error if p is not on a boundary */
static inline unsigned span_index(const mc_span_t *s, const void *p, unsigned cls) {
  uintptr_t off = (uintptr_t)p - s->start;
  unsigned idx = (unsigned)(((uint64_t)(uint32_t)off * mc_class_recip[cls]) >> 32);
  if (mc_unlikely(idx >= s->capacity || (uintptr_t)idx * mc_class_size[cls] != off)) {
    mc_fatal("invalid free (interior pointer) ", p, (long)cls, "an object boundary inside its span");
  }
  return idx;
}

static void span_init(mc_span_t *s, unsigned cls) {
  unsigned cap = (unsigned)(((size_t)s->pages << MC_PAGE_SHIFT) / mc_class_size[cls]);
  s->capacity = (uint16_t)cap;
  s->allocated = 0;
  memset(s->freemap, 0, sizeof(s->freemap));
  for (unsigned w = 0; w < cap / 64; w++) s->freemap[w] = ~(uint64_t)0;
  if (cap % 64) s->freemap[cap / 64] = ((uint64_t)1 << (cap % 64)) - 1;
}

#if MC_DEBUG >= 2
/* the bitmap's count of free objects agrees with `allocated` */
static void span_check(const mc_span_t *s) {
  unsigned nfree = 0;
  for (unsigned w = 0; w < MC_SPAN_MAX_OBJECTS / 64; w++) nfree += (unsigned)__builtin_popcountll(s->freemap[w]);
  if (nfree + s->allocated != s->capacity) mc_fatal("span counts inconsistent for span ", (void *)s->start, s->sclass, "free + allocated == capacity");
}
#define MC_SPAN_CHECK(s) span_check(s)
#else
#define MC_SPAN_CHECK(s) do { } while (0)
#endif

/* Takes up to n free objects of span s, its lowest addresses, and writes them in
 * descending order: a thread cache pops from the end of its array, so the application
 * gets them in ascending order, which the hardware prefetchers follow (handed out
 * descending, refilling a million small objects took 15 % longer, the time going to
 * the application's first write to each object, a cache miss). */
static int span_take(mc_span_t *s, unsigned cls, void **out, int n) {
  unsigned words = (s->capacity + 63u) / 64;
  int nfree = 0;
  for (unsigned w = 0; w < words; w++) nfree += __builtin_popcountll(s->freemap[w]);
  int got = nfree < n ? nfree : n;
  int k = got;
  uintptr_t size = mc_class_size[cls];
  for (unsigned w = 0; k > 0; w++) {
    uint64_t m = s->freemap[w];
    while (m != 0 && k > 0) {
      unsigned b = (unsigned)__builtin_ctzll(m);
      m &= m - 1;
      out[--k] = (void *)(s->start + (uintptr_t)(w * 64 + b) * size);
    }
    s->freemap[w] = m;
  }
  s->allocated = (uint16_t)(s->allocated + got);
  MC_SPAN_CHECK(s);
  return got;
}

/* copies the k objects on top of a transfer cache, the earliest given back last, so
 * that they are popped in the order they came back (for producer/consumer objects, the
 * order they were allocated in: ascending) */
static inline void transfer_take(void **out, void *const *top, int k) {
  for (int i = 0; i < k; i++) out[i] = top[k - 1 - i];
}

int mc_central_fetch(unsigned shard, unsigned cls, void **out, int n) {
  mc_central_t *ce = &mc_central[shard][cls];
  pthread_mutex_lock(&ce->lock);
  if (ce->ntransfer > 0) {
    int k = ce->ntransfer < n ? ce->ntransfer : n;
    ce->ntransfer -= k;
    transfer_take(out, &ce->transfer[ce->ntransfer], k);
    pthread_mutex_unlock(&ce->lock);
    return k;
  }
  int got = 0;
  while (got < n) {
    mc_span_t *s = ce->nonempty;
    if (s == NULL) {
      if (got > 0) break;
      pthread_mutex_unlock(&ce->lock);
      size_t pages = mc_class_pages[cls];
      s = mc_heap_alloc(pages, MC_SPAN_SMALL, cls | (shard << 8));
      if (s == NULL) return 0;
      mc_small_spans_taken(pages << MC_PAGE_SHIFT);
      span_init(s, cls);
      pthread_mutex_lock(&ce->lock);
      span_list_push(ce, s);
    }
    got += span_take(s, cls, out + got, n - got);
    if (s->allocated == s->capacity) span_list_remove(ce, s);
  }
  pthread_mutex_unlock(&ce->lock);
  return got;
}

/* Objects come back in the order the application freed them, often random: the page
 * map entry and the span descriptor of each are then cache misses (the loads of the
 * descriptor took a third of return_to_shard's samples when a million small objects
 * were freed in random order). Loads issued a few objects ahead overlap them. */
#define MC_PREFETCH_AHEAD 8
static inline void pagemap_prefetch(const void *p) {
  uintptr_t a = (uintptr_t)p >> MC_PAGE_SHIFT;
  if (mc_unlikely(a >> 36)) return;
  const uintptr_t *leaf = mc_pagemap_root[a >> 18];
  if (mc_likely(leaf != NULL)) __builtin_prefetch(&leaf[a & ((1u << 18) - 1)]);
}

/* gives objects of one shard back; empty spans are collected in *empty */
static void return_to_shard(unsigned shard, unsigned cls, void **objs, mc_span_t **spans, int n, mc_span_t **empty) {
  mc_central_t *ce = &mc_central[shard][cls];
  pthread_mutex_lock(&ce->lock);
  if (ce->ntransfer + n <= ce->transfer_max) {
    memcpy(&ce->transfer[ce->ntransfer], objs, (size_t)n * sizeof(void *));
    ce->ntransfer += n;
    pthread_mutex_unlock(&ce->lock);
    return;
  }
  for (int i = 0; i < n; i++) {
    void *p = objs[i];
    mc_span_t *s = spans[i];
    if (i + MC_PREFETCH_AHEAD < n) __builtin_prefetch(spans[i + MC_PREFETCH_AHEAD], 1);
    unsigned idx = span_index(s, p, cls);
    uint64_t bit = (uint64_t)1 << (idx & 63);
    if (mc_unlikely((s->freemap[idx >> 6] & bit) != 0 || s->allocated == 0)) {
      mc_fatal("double free of object ", p, (long)cls, "an allocated object (it is already free in its span)");
    }
    s->freemap[idx >> 6] |= bit;
    s->allocated--;
    MC_SPAN_CHECK(s);
    if (s->allocated == 0) {
      if (s->in_central) span_list_remove(ce, s);
      s->next = *empty;
      *empty = s;
    } else if (!s->in_central) {
      span_list_push(ce, s);
    }
  }
  pthread_mutex_unlock(&ce->lock);
}

void mc_central_return(unsigned cls, void **objs, int n) {
  /* validate against the page map (a corrupted thread cache list, or an invalid free)
   * and group by shard: usually all objects belong to one */
  unsigned nsh = mc_nshards; /* sized by the shards in use: 1 KiB of stack each */
  void *groups[nsh][64];
  mc_span_t *spans[nsh][64]; /* the page map is read once per object */
  int counts[MC_MAX_SHARDS] = {0};
  mc_span_t *empty = NULL;
  for (int i = 0; i < n; i++) {
    if (i + MC_PREFETCH_AHEAD < n) pagemap_prefetch(objs[i + MC_PREFETCH_AHEAD]);
    uintptr_t e = mc_pagemap_entry(objs[i]);
    if (mc_unlikely((e & MC_PM_CLASS_MASK) != cls)) {
      mc_fatal("corrupted free list or invalid free: object ", objs[i], (long)cls, "an object of this size class");
    }
    unsigned sh = (unsigned)(e >> MC_PM_SHARD_SHIFT) & (MC_MAX_SHARDS - 1);
    if (mc_unlikely(sh >= nsh)) mc_fatal("corrupted page map entry for object ", objs[i], (long)cls, "a shard in use");
    spans[sh][counts[sh]] = (mc_span_t *)(e & MC_PM_SPAN_MASK);
    groups[sh][counts[sh]++] = objs[i];
    if (counts[sh] == 64) {
      return_to_shard(sh, cls, groups[sh], spans[sh], 64, &empty);
      counts[sh] = 0;
    }
  }
  for (unsigned sh = 0; sh < nsh; sh++) {
    if (counts[sh]) return_to_shard(sh, cls, groups[sh], spans[sh], counts[sh], &empty);
  }
  if (empty != NULL) {
    size_t pages = 0;
    for (mc_span_t *s = empty; s; s = s->next) pages += s->pages;
    mc_small_spans_returned(pages << MC_PAGE_SHIFT);
  }
  mc_heap_free_list(empty);
}

/* debug: is p free, in a transfer cache or in its span's bitmap? */
bool mc_central_contains(unsigned cls, const void *p) {
  uintptr_t e = mc_pagemap_entry(p);
  if ((e & MC_PM_CLASS_MASK) != cls) return false;
  unsigned shard = (unsigned)(e >> MC_PM_SHARD_SHIFT) & (MC_MAX_SHARDS - 1);
  mc_span_t *s = (mc_span_t *)(e & MC_PM_SPAN_MASK);
  bool found = false;
  for (unsigned sh = 0; sh < mc_nshards && !found; sh++) {
    mc_central_t *ce = &mc_central[sh][cls];
    pthread_mutex_lock(&ce->lock);
    for (int i = 0; i < ce->ntransfer && !found; i++) found = ce->transfer[i] == p;
    if (!found && sh == shard) {
      uintptr_t off = (uintptr_t)p - s->start;
      uintptr_t idx = off / mc_class_size[cls];
      if (idx < s->capacity && idx * mc_class_size[cls] == off) found = (s->freemap[idx >> 6] >> (idx & 63)) & 1;
    }
    pthread_mutex_unlock(&ce->lock);
  }
  return found;
}

/* Drops every transfer cache into the spans (malloc_trim, the agent's high and top), so
 * that empty spans go back to the page heap. */
void mc_central_drain(void) {
  for (unsigned sh = 0; sh < mc_nshards; sh++) {
    for (unsigned c = 1; c < MC_CLASSES; c++) {
      mc_central_t *ce = &mc_central[sh][c];
      void *tmp[MC_TRANSFER_SLOTS];
      pthread_mutex_lock(&ce->lock);
      int n = ce->ntransfer;
      memcpy(tmp, ce->transfer, (size_t)n * sizeof(void *));
      ce->ntransfer = 0;
      int saved = ce->transfer_max;
      ce->transfer_max = 0;
      pthread_mutex_unlock(&ce->lock);
      if (n) mc_central_return(c, tmp, n);
      pthread_mutex_lock(&ce->lock);
      ce->transfer_max = saved;
      pthread_mutex_unlock(&ce->lock);
    }
  }
}
