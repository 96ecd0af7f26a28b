/* alloc.c — the malloc surface: malloc, free, calloc, realloc, reallocarray,
 * posix_memalign, aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size,
 * malloc_trim, mallopt. The fast path is a thread-cache pop/push; everything else
 * (refill, large blocks, aligned blocks, the first call of a thread) is out of line.
 * free() reads the pointer's page map entry, which carries the size class: an unknown
 * pointer aborts with a message. Double frees are caught where it costs nothing on the
 * fast path: the same pointer freed twice in a row (one compare with the top of the
 * thread cache's list), and any other when the object reaches its span, whose bitmap
 * says it is already free (central.c); debug builds also check at every free. */
#include <errno.h>
#include <malloc.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

uint64_t mc_stat_slow_calls, mc_stat_large_allocs;


/* The thread cache's pop. Objects up to 1 KiB are the fall-through path (no taken
 * branch from the entry to the return: mc_size_to_class's mc_likely; without it the
 * larger classes were laid out there). */
static inline void *mc_small_fast(size_t size) {
  mc_tcache_t *tc = mc_tcache;
  if (mc_likely(tc != NULL)) {
    unsigned cls = mc_size_to_class(size);
    mc_bin_t *b = &tc->bins[cls];
    if (mc_likely(b->count != 0)) return b->slots[--b->count];
  }
  return mc_malloc_slow(size);
}

static void *mc_large_alloc(size_t size) {
  size_t pages = (size + MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT;
  if (pages == 0 || size > ((size_t)1 << 46)) { errno = ENOMEM; return NULL; }
  mc_tcache_t *tc = mc_tcache;
  if (tc) tc->large_allocs++;
  else __atomic_fetch_add(&mc_stat_large_allocs, 1, __ATOMIC_RELAXED);
  if (mc_reserve_on) {
    __atomic_fetch_add(&mc_demand_large_bytes, pages << MC_PAGE_SHIFT, __ATOMIC_RELAXED);
    __atomic_fetch_add(&mc_demand_large_count, 1, __ATOMIC_RELAXED);
    if (size >= MC_POOL_MIN_BYTES && pages <= MC_REGION_PAGES) {
      void *p = mc_pool_alloc(pages);
      if (p) return p;
    }
  }
  mc_span_t *s = mc_heap_alloc(pages, MC_SPAN_LARGE, false);
  if (s == NULL) { errno = ENOMEM; return NULL; }
  return (void *)s->start;
}

MC_NOINLINE void *mc_malloc_slow(size_t size) {
  mc_ensure_init();
  mc_tcache_t *tc = mc_tcache;
  if (tc == NULL) tc = mc_tcache_get_slow();
  if (tc) tc->slow_calls++; /* per thread: a shared counter here would bounce between cores */
  else __atomic_fetch_add(&mc_stat_slow_calls, 1, __ATOMIC_RELAXED);
  if (size > MC_SMALL_MAX) return mc_large_alloc(size);
  unsigned cls = mc_size_to_class(size);
  if (tc != NULL) {
    mc_bin_t *b = &tc->bins[cls];
    if (b->count != 0) return b->slots[--b->count];
    void *p = mc_tcache_refill(tc, cls);
    if (p == NULL) errno = ENOMEM;
    return p;
  }
  /* no thread cache (thread being torn down, or out of metadata): go central */
  void *p = NULL;
  if (mc_central_fetch(0, cls, &p, 1) == 0) { errno = ENOMEM; return NULL; }
  return p;
}

MC_EXPORT void *MC_NAME(malloc)(size_t size) {
  if (mc_likely(size <= MC_SMALL_MAX)) return mc_small_fast(size);
  return mc_malloc_slow(size);
}

static MC_NOINLINE void mc_double_free(void *p, unsigned cls) {
  mc_fatal("double free of object ", p, (long)cls, "a pointer that is allocated");
}

#if MC_DEBUG >= 1
/* debug builds: every free checks that the object is not already free anywhere */
static MC_NOINLINE void mc_debug_free_check(void *p, unsigned cls) {
  if (mc_tcache_contains(mc_tcache, cls, p) || mc_central_contains(cls, p)) mc_double_free(p, cls);
}
#define MC_DEBUG_FREE_CHECK(p, cls) mc_debug_free_check(p, cls)
#else
#define MC_DEBUG_FREE_CHECK(p, cls) do { } while (0)
#endif

MC_NOINLINE void mc_free_slow(void *p, uintptr_t entry) {
  mc_span_t *s = (mc_span_t *)(entry & MC_PM_SPAN_MASK);
  if (s == NULL) {
    mc_fatal("free of a pointer that memcolo did not return (or already freed) ", p, 0,
             "a pointer from malloc/calloc/realloc/aligned allocation");
  }
  unsigned cls = (unsigned)(entry & MC_PM_CLASS_MASK);
  if (cls != 0) {
    /* a thread that frees before it ever allocated (a consumer) gets its cache now */
    mc_tcache_t *tc = mc_tcache_dead ? NULL : mc_tcache_get_slow();
    if (tc != NULL) {
      MC_NAME(free)(p);
      return;
    }
    /* no thread cache (the thread is being torn down): straight to the central list */
    MC_DEBUG_FREE_CHECK(p, cls);
    mc_central_return(cls, &p, 1);
    return;
  }
  if (s->kind != MC_SPAN_LARGE && s->kind != MC_SPAN_REGION) {
    mc_fatal("free of a pointer into a span that is not allocated ", p, 0, "an allocated block");
  }
  uintptr_t a = (uintptr_t)p;
  if (a != s->start && (s->map_extra == 0 || (a & ~(uintptr_t)(MC_PAGE_SIZE - 1)) != s->map_extra)) {
    mc_fatal("free of an interior pointer of a large block ", p, 0, "the block's start");
  }
  if (s->kind == MC_SPAN_LARGE && mc_reserve_on && s->map_extra == 0 && mc_pool_free(s)) return;
  mc_heap_free(s);
}

/* A full list: its oldest half goes to the central lists. Out of line, so that free's
 * fast path needs no stack frame (p's address is taken here). */
static MC_NOINLINE void mc_free_overflow(mc_tcache_t *tc, unsigned cls, void *p) {
  if (mc_unlikely(!mc_tcache_overflow(tc, cls))) {
    mc_central_return(cls, &p, 1);
    return;
  }
  mc_bin_t *b = &tc->bins[cls];
  b->slots[b->count++] = p;
}

MC_EXPORT void MC_NAME(free)(void *p) {
  if (mc_unlikely(p == NULL)) return;
  uintptr_t e = mc_pagemap_entry(p);
  unsigned cls = (unsigned)(e & MC_PM_CLASS_MASK);
  mc_tcache_t *tc = mc_tcache;
  if (mc_likely(cls != 0 && tc != NULL)) {
    mc_bin_t *b = &tc->bins[cls];
    uint32_t n = b->count;
    void **slots = b->slots;
    if (mc_likely(n != 0)) {
      if (mc_unlikely(slots[n - 1] == p)) mc_double_free(p, cls);
    }
    MC_DEBUG_FREE_CHECK(p, cls);
    if (mc_unlikely(n >= b->max)) {
      mc_free_overflow(tc, cls, p);
      return;
    }
    slots[n] = p;
    b->count = n + 1;
    return;
  }
  mc_free_slow(p, e);
}

MC_EXPORT void MC_NAME(cfree)(void *p) { MC_NAME(free)(p); }

size_t mc_usable_size(const void *p) {
  if (p == NULL) return 0;
  mc_span_t *s = mc_pagemap_get(p);
  if (s == NULL) return 0;
  if (s->kind == MC_SPAN_SMALL) return mc_class_size[s->sclass];
  if (s->kind == MC_SPAN_FREE) return 0;
  return s->start + ((size_t)s->pages << MC_PAGE_SHIFT) - (uintptr_t)p;
}

MC_EXPORT size_t MC_NAME(malloc_usable_size)(void *p) { return mc_usable_size(p); }

MC_EXPORT void *MC_NAME(calloc)(size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) { errno = ENOMEM; return NULL; }
  if (total <= MC_SMALL_MAX) {
    void *p = mc_small_fast(total);
    if (p) memset(p, 0, total);
    return p;
  }
  void *p = mc_large_alloc(total);
  if (p == NULL) return NULL;
  mc_span_t *s = mc_pagemap_get(p);
  if (s && s->kind == MC_SPAN_REGION && s->fresh) { s->fresh = 0; return p; }
  memset(p, 0, total);
  return p;
}

static void *mc_realloc_move(void *p, size_t old_usable, size_t size) {
  void *q = MC_NAME(malloc)(size);
  if (q == NULL) return NULL;
  memcpy(q, p, old_usable < size ? old_usable : size);
  MC_NAME(free)(p);
  return q;
}

/* Growth past MC_GROW_MIN_BYTES: one copy into a growth region, whose later growth is
 * in place (or an mremap); the copies of a growth chain stop there instead of going on
 * at every size class and every move of a large block (glibc grows its top chunk in
 * place and mremaps mmapped chunks). */
static void *mc_realloc_grow(void *p, size_t old_usable, size_t size) {
  if (size >= MC_GROW_MIN_BYTES && size <= ((size_t)1 << 46)) {
    mc_span_t *g = mc_heap_growth_alloc((size + MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT);
    if (g != NULL) {
      memcpy((void *)g->start, p, old_usable < size ? old_usable : size);
      MC_NAME(free)(p);
      return (void *)g->start;
    }
  }
  return mc_realloc_move(p, old_usable, size);
}

MC_EXPORT void *MC_NAME(realloc)(void *p, size_t size) {
  if (p == NULL) return MC_NAME(malloc)(size);
  if (size == 0) { MC_NAME(free)(p); return NULL; }
  mc_span_t *s = mc_pagemap_get(p);
  if (s == NULL || s->kind == MC_SPAN_FREE) mc_free_slow(p, 0);
  if (s->kind == MC_SPAN_SMALL) {
    size_t cur = mc_class_size[s->sclass];
    if (size <= cur && size > cur / 2) return p;            /* same or adjacent class */
    if (size <= cur && cur <= 128) return p;
    if (size > cur) return mc_realloc_grow(p, cur, size);
    return mc_realloc_move(p, cur, size);
  }
  size_t usable = mc_usable_size(p);
  if ((uintptr_t)p != s->start) return mc_realloc_move(p, usable, size); /* aligned block */
  size_t pages = (size + MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT;
  if (size <= usable) {
    if (s->growth) { /* a growth region shrinks in place and keeps its room */
      if (pages < s->pages) mc_heap_shrink(s, pages);
      return p;
    }
    if (size <= MC_SMALL_MAX) {
      if (size > usable / 2) return p; /* shrinks by less than half: keep */
      return mc_realloc_move(p, usable, size);
    }
    if (pages == s->pages) return p;
    if (s->kind == MC_SPAN_REGION && pages <= MC_REGION_PAGES) return mc_realloc_move(p, usable, size);
    mc_heap_shrink(s, pages);
    return p;
  }
  if (s->kind == MC_SPAN_LARGE && mc_heap_try_grow(s, pages)) return p;
  if (s->kind == MC_SPAN_REGION && mc_heap_region_grow(s, pages)) return (void *)s->start;
  return mc_realloc_grow(p, usable, size);
}

MC_EXPORT void *MC_NAME(reallocarray)(void *p, size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) { errno = ENOMEM; return NULL; }
  return MC_NAME(realloc)(p, total);
}

void *mc_alloc_aligned(size_t align, size_t size) {
  if (align <= MC_ALIGN) return MC_NAME(malloc)(size);
  mc_ensure_init();
  if (size == 0) size = 1;
  if (size <= MC_SMALL_MAX && align <= MC_PAGE_SIZE) {
    /* a class whose size is a multiple of align gives aligned objects: spans are page aligned */
    size_t need = (size + align - 1) & ~(align - 1);
    for (unsigned c = mc_size_to_class(need); c < MC_CLASSES; c++) {
      if (mc_class_size[c] % align == 0) {
        if (mc_class_size[c] > need * 2 && mc_class_size[c] > MC_PAGE_SIZE) break;
        return mc_small_fast(mc_class_size[c]);
      }
    }
  }
  if (align <= MC_PAGE_SIZE) return mc_large_alloc(size > MC_SMALL_MAX ? size : MC_SMALL_MAX + 1);
  size_t pages = (size + MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT;
  if (align <= MC_HUGE_SIZE && pages > MC_REGION_PAGES) return mc_large_alloc(size); /* regions are 2 MiB aligned */
  size_t total;
  if (__builtin_add_overflow(size, align, &total)) { errno = ENOMEM; return NULL; }
  size_t tpages = (total + MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT;
  mc_span_t *s = mc_heap_alloc(tpages, MC_SPAN_LARGE, false);
  if (s == NULL) { errno = ENOMEM; return NULL; }
  uintptr_t a = (s->start + align - 1) & ~(uintptr_t)(align - 1);
  if (a != s->start) mc_heap_map_extra(s, a);
  return (void *)a;
}

static inline bool is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

MC_EXPORT int MC_NAME(posix_memalign)(void **out, size_t align, size_t size) {
  if (!is_pow2(align) || align % sizeof(void *) != 0) return EINVAL;
  void *p = mc_alloc_aligned(align, size);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

MC_EXPORT void *MC_NAME(aligned_alloc)(size_t align, size_t size) {
  if (!is_pow2(align)) { errno = EINVAL; return NULL; }
  return mc_alloc_aligned(align, size);
}

MC_EXPORT void *MC_NAME(memalign)(size_t align, size_t size) {
  if (!is_pow2(align)) { errno = EINVAL; return NULL; }
  return mc_alloc_aligned(align, size);
}

MC_EXPORT void *MC_NAME(valloc)(size_t size) { return mc_alloc_aligned(MC_PAGE_SIZE, size); }

MC_EXPORT void *MC_NAME(pvalloc)(size_t size) {
  size_t r = (size + MC_PAGE_SIZE - 1) & ~(MC_PAGE_SIZE - 1);
  if (r < size) { errno = ENOMEM; return NULL; }
  return mc_alloc_aligned(MC_PAGE_SIZE, r ? r : MC_PAGE_SIZE);
}


MC_EXPORT int MC_NAME(malloc_trim)(size_t pad) {
  (void)pad;
  mc_ensure_init();
  mc_tcache_flush_self();
  mc_central_drain();
  mc_pool_drain();
  pthread_mutex_lock(&mc_heap.lock);
  size_t done = mc_heap_release_locked(0, false, 0);
  pthread_mutex_unlock(&mc_heap.lock);
  return done > 0;
}

MC_EXPORT int MC_NAME(mallopt)(int param, int value) {
  (void)param;
  (void)value;
  return 1; /* accepted and ignored: memcolo takes its options from MEMCOLO_* */
}
