/* alloc.c — the malloc surface: malloc, free, calloc, realloc, reallocarray,
 * posix_memalign, aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size,
 * malloc_trim, mallopt. The fast path is a thread-cache pop/push; everything else
 * (refill, large blocks, aligned blocks, the first call of a thread) is out of line.
 * free() reads the pointer's page map entry, which carries the size class: an unknown
 * pointer aborts with a message. Double frees are caught at the free, wherever the
 * first free left the object (this thread's cache, another's, a transfer cache, its
 * span), unless MEMCOLO_DOUBLE_FREE_CHECK=0 turns this off (then only the object-start
 * test runs at the free, and the central lists' check catches a double free once both
 * copies reach the span): malloc sets the object's bit in the live map (internal.h) and free clears it,
 * aborting if it was clear. The bits are metadata (no object is read or written: a use
 * after free cannot corrupt them or a list), one atomic RMW on each side. Only a live
 * object's start has its bit set, so the same test refuses an interior pointer (or one
 * past the span's last object); the object-start test (the pointer's offset in its
 * span, from the page map entry) runs only then, to say which misuse it was. Debug builds (MC_DEBUG >= 1) also search the
 * caches at every free, and pad small blocks: a canary and filler bytes after the size
 * asked for (mimalloc's MI_PADDING), checked at free and realloc, so that a write past
 * the block's end is caught; malloc_usable_size is then the size asked for. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

uint64_t mc_stat_slow_calls, mc_stat_large_allocs;
uint64_t mc_secret;

/* 64 random bits (getrandom; the clock and an address, mixed, if the kernel has no
 * entropy yet), never 0: the debug canaries' key. */
void mc_secret_init(void) {
  uint64_t k = 0;
  if (syscall(SYS_getrandom, &k, sizeof(k), GRND_NONBLOCK) != (long)sizeof(k)) k = 0;
  uint64_t z = mc_now_ns() ^ (uintptr_t)&k ^ ((uint64_t)getpid() << 32);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  k ^= z ^ (z >> 31);
  mc_secret = k != 0 ? k : 0x9E3779B97F4A7C15ull;
}

bool mc_double_free_check = true;

/* an object handed out: its live bit set (MEMCOLO_DOUBLE_FREE_CHECK) */
static inline void *mc_obj_out(void *p) {
  uintptr_t a = (uintptr_t)p;
  if (mc_likely(mc_double_free_check)) __atomic_fetch_or(mc_livemap_word(a), mc_livemap_bit(a), __ATOMIC_RELAXED);
  return p;
}

#if MC_DEBUG >= 1
/* Debug padding: a small block of n bytes asked for is an object of the class for
 * n + MC_PAD; its last MC_PAD bytes hold {canary, delta = class size - n}, and up to
 * MC_PAD_FILL_MAX bytes after n hold MC_PAD_FILL. The canary depends on the address,
 * delta and mc_secret. */
#define MC_PAD ((size_t)8)
#define MC_PAD_FILL 0xde
#define MC_PAD_FILL_MAX ((size_t)256)
static inline uint32_t mc_pad_canary(const void *p, uint32_t delta) {
  uint64_t x = (mc_secret ^ (uintptr_t)p) * 0x9E3779B97F4A7C15ull;
  return (uint32_t)(x >> 32) ^ delta;
}
static void mc_pad_set(void *p, size_t n) {
  size_t sz = mc_class_size[mc_pagemap_entry(p) & MC_PM_CLASS_MASK];
  size_t fill = sz - MC_PAD - n;
  memset((char *)p + n, MC_PAD_FILL, fill < MC_PAD_FILL_MAX ? fill : MC_PAD_FILL_MAX);
  uint32_t w[2] = {mc_pad_canary(p, (uint32_t)(sz - n)), (uint32_t)(sz - n)};
  memcpy((char *)p + sz - MC_PAD, w, sizeof(w));
}
/* the size asked for, or (size_t)-1 if the padding was overwritten */
static size_t mc_pad_size(const void *p, unsigned cls) {
  size_t sz = mc_class_size[cls];
  uint32_t w[2];
  memcpy(w, (const char *)p + sz - MC_PAD, sizeof(w));
  if (w[1] < MC_PAD || w[1] > sz || w[0] != mc_pad_canary(p, w[1])) return (size_t)-1;
  size_t n = sz - w[1], fill = sz - MC_PAD - n;
  if (fill > MC_PAD_FILL_MAX) fill = MC_PAD_FILL_MAX;
  for (size_t i = 0; i < fill; i++) {
    if (((const unsigned char *)p)[n + i] != MC_PAD_FILL) return (size_t)-1;
  }
  return n;
}
static MC_NOINLINE void mc_pad_check(void *p, unsigned cls) {
  if (mc_pad_size(p, cls) == (size_t)-1) {
    mc_fatal("heap buffer overflow: the padding after the block was overwritten, block ", p, (long)cls,
             "the bytes past the size asked for intact (debug canary)");
  }
}
#define MC_PAD_BYTES MC_PAD
#define MC_PAD_SET(p, n) mc_pad_set(p, n)
#define MC_PAD_CHECK(p, cls) mc_pad_check(p, cls)
#else
#define MC_PAD_BYTES ((size_t)0)
#define MC_PAD_SET(p, n) do { } while (0)
#define MC_PAD_CHECK(p, cls) do { } while (0)
#endif


/* The thread cache's pop of class cls (size's). */
static inline void *mc_pop(size_t size, unsigned cls) {
  mc_bin_t *b = &mc_tcache->bins[cls]; /* mc_tcache_none's lists are empty */
  if (mc_likely(b->count != 0)) return mc_obj_out(b->slots[--b->count]);
  return mc_malloc_slow(size);
}

/* The thread cache's pop for a size up to MC_SMALL_MAX. */
static inline void *mc_small_fast(size_t size) { return mc_pop(size, mc_size_to_class(size)); }

static void *mc_large_alloc(size_t size) {
  size_t pages = (size + MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT;
  if (pages == 0 || size > ((size_t)1 << 46)) { errno = ENOMEM; return NULL; }
  mc_tcache_t *tc = mc_tcache_self();
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
  mc_mgmt_start_deferred();
  return (void *)s->start;
}

MC_NOINLINE void *mc_malloc_slow(size_t size) {
  mc_ensure_init();
  mc_tcache_t *tc = mc_tcache_self();
  if (tc == NULL) tc = mc_tcache_get_slow();
  if (tc) tc->slow_calls++; /* per thread: a shared counter here would bounce between cores */
  else __atomic_fetch_add(&mc_stat_slow_calls, 1, __ATOMIC_RELAXED);
  if (size > MC_SMALL_MAX) return mc_large_alloc(size);
  unsigned cls = mc_size_to_class(size);
  if (tc != NULL) {
    mc_bin_t *b = &tc->bins[cls];
    if (b->count != 0) return mc_obj_out(b->slots[--b->count]);
    void *p = mc_tcache_refill(tc, cls);
    if (p == NULL) { errno = ENOMEM; return NULL; }
    mc_mgmt_start_deferred(); /* the list is whole again: a nested malloc is safe */
    return mc_obj_out(p);
  }
  /* no thread cache (thread being torn down, or out of metadata): go central */
  void *p = NULL;
  if (mc_central_fetch(0, cls, &p, 1) == 0) { errno = ENOMEM; return NULL; }
  mc_mgmt_start_deferred();
  return mc_obj_out(p);
}

#if MC_DEBUG >= 1
/* a block of size bytes with its padding (small blocks; large ones are not padded) */
static void *mc_alloc_padded(size_t size) {
  if (size > MC_SMALL_MAX - MC_PAD) {
    if (size > MC_SMALL_MAX) return mc_malloc_slow(size);
    mc_ensure_init();
    return mc_large_alloc(size);
  }
  void *p = mc_small_fast(size + MC_PAD);
  if (p) mc_pad_set(p, size);
  return p;
}
#endif

MC_EXPORT void *MC_NAME(malloc)(size_t size) {
#if MC_DEBUG >= 1
  return mc_alloc_padded(size);
#endif
  /* up to 1 KiB first, the fall-through path (one compare before the class table;
   * no taken branch from the entry to the return) */
  if (mc_likely(size <= 1024)) return mc_pop(size, mc_class_small_idx[(size + 15) >> 4]);
  if (mc_likely(size <= MC_SMALL_MAX)) return mc_pop(size, mc_class_large_idx[(size + 127) >> 7]);
  return mc_malloc_slow(size);
}


static MC_NOINLINE void mc_free_interior(void *p, unsigned cls) {
  mc_fatal("invalid free (interior pointer) ", p, (long)cls, "the start of an object malloc returned");
}

static MC_NOINLINE void mc_not_live(void *p, unsigned cls) {
  mc_fatal("double free (or free of an object never allocated) of object ", p, (long)cls,
           "an object malloc returned and that is not yet freed");
}

/* The object-start test: a, in a page of a small span (entry e, class cls), is the start
 * of one of the span's objects: its offset in the span (the page's index from the
 * entry) is below the span's last object and a multiple of the class's size
 * (mc_class_check; sizes are multiples of 16, so a passes only 16-byte aligned). */
static inline bool mc_object_start(uintptr_t a, uintptr_t e, unsigned cls) {
  uint32_t off = (uint32_t)(((e >> MC_PM_PAGE_SHIFT) << MC_PAGE_SHIFT) | (a & (MC_PAGE_SIZE - 1)));
  const mc_class_check_t *k = &mc_class_check[cls];
  return off < k->end && (uint64_t)off * k->magic < k->magic;
}

/* A free (or realloc) of p, in a page of a small span (entry e, class cls), that the
 * live map refused (or, with MEMCOLO_DOUBLE_FREE_CHECK=0, the object-start test): p is
 * not 16-byte aligned or its granule's bit is clear. The bits
 * are set only at the starts of live objects, so this is an interior pointer (or one
 * past the span's last object) or an object that is not live; the object-start test
 * tells which, for the message: p's offset in its span (the page's index from the
 * entry) is a multiple of the class's size below the span's last object
 * (mc_class_check). */
static MC_NOINLINE void mc_free_refused(void *p, uintptr_t e, unsigned cls) {
  if (!mc_object_start((uintptr_t)p, e, cls)) mc_free_interior(p, cls);
  mc_not_live(p, cls);
}

#if MC_DEBUG >= 1
/* debug builds: every free also checks that the object is in no cache of this thread
 * and not free in its shard (a second opinion to the live map) */
static MC_NOINLINE void mc_debug_free_check(void *p, unsigned cls) {
  if (mc_tcache_contains(mc_tcache, cls, p) || mc_central_contains(cls, p)) {
    mc_fatal("double free of object ", p, (long)cls, "a pointer that is allocated");
  }
}
#define MC_DEBUG_FREE_CHECK(p, cls) mc_debug_free_check(p, cls)
#else
#define MC_DEBUG_FREE_CHECK(p, cls) do { } while (0)
#endif

/* Every check of a small object's free: the start of an object held by the program
 * (16-byte aligned and its live bit set; the bit is cleared here, one atomic RMW), its
 * padding intact (debug). The live bit alone also refuses interior pointers: no bit
 * but an object's start is ever set. leaf: the page map leaf of p (its live map follows
 * the entries). */
static inline void mc_small_free_checks(const uintptr_t *leaf, void *p, uintptr_t e, unsigned cls) {
  uintptr_t a = (uintptr_t)p;
  bool ok;
  if (mc_likely(mc_double_free_check)) {
    uint64_t bit = mc_livemap_bit(a);
    ok = (a & (MC_ALIGN - 1)) == 0 && (__atomic_fetch_and(mc_livemap_word_in(leaf, a), ~bit, __ATOMIC_RELAXED) & bit) != 0;
  } else {
    ok = mc_object_start(a, e, cls);
  }
  if (mc_unlikely(!ok)) mc_free_refused(p, e, cls);
  MC_DEBUG_FREE_CHECK(p, cls);
  MC_PAD_CHECK(p, cls);
}

MC_EXPORT void MC_NAME(free)(void *p);

MC_NOINLINE void mc_free_slow(void *p, uintptr_t entry) {
  if (p == NULL) return;
  mc_span_t *s = (mc_span_t *)(entry & MC_PM_SPAN_MASK);
  if (s == NULL) {
    mc_fatal("free of a pointer that memcolo did not return (or already freed) ", p, 0,
             "a pointer from malloc/calloc/realloc/aligned allocation");
  }
  unsigned cls = (unsigned)(entry & MC_PM_CLASS_MASK);
  if (cls != 0) { /* a small object: free's own path serves every thread (mc_free_overflow) */
    MC_NAME(free)(p);
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
 * fast path needs no stack frame (p's address is taken here). p has passed the checks.
 * A thread without a cache (mc_tcache_none, whose lists are all full) gets one now: a
 * consumer's first free; a thread being torn down gives p to the central lists. */
static MC_NOINLINE void mc_free_overflow(mc_tcache_t *tc, unsigned cls, void *p) {
  if (mc_unlikely(tc == &mc_tcache_none)) {
    tc = mc_tcache_dead ? NULL : mc_tcache_get_slow();
    if (tc == NULL) {
      mc_central_return(cls, &p, 1);
      return;
    }
    mc_bin_t *b = &tc->bins[cls];
    if (b->count < b->max) {
      b->slots[b->count++] = p;
      return;
    }
  }
  if (mc_unlikely(!mc_tcache_overflow(tc, cls))) {
    mc_central_return(cls, &p, 1);
    return;
  }
  mc_bin_t *b = &tc->bins[cls];
  b->slots[b->count++] = p;
}

MC_EXPORT void MC_NAME(free)(void *p) {
  /* NULL (any pointer into the first page) and pointers past the page map's 48 bits
   * take the slow path: one compare */
  uintptr_t a = (uintptr_t)p;
  if (mc_unlikely(a - MC_PAGE_SIZE >= ((uintptr_t)1 << 48) - MC_PAGE_SIZE)) {
    mc_free_slow(p, 0);
    return;
  }
  const uintptr_t *leaf = mc_pagemap_root[a >> 30];
  if (mc_unlikely(leaf == NULL)) {
    mc_free_slow(p, 0);
    return;
  }
  uintptr_t e = leaf[(a >> MC_PAGE_SHIFT) & ((1u << 18) - 1)];
  unsigned cls = (unsigned)(e & MC_PM_CLASS_MASK);
  mc_tcache_t *tc = mc_tcache; /* mc_tcache_none's lists are full: mc_free_overflow */
  if (mc_likely(cls != 0)) {
    mc_small_free_checks(leaf, p, e, cls);
    mc_bin_t *b = &tc->bins[cls];
    uint32_t n = b->count;
    void **slots = b->slots;
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
#if MC_DEBUG >= 1
  if (s->kind == MC_SPAN_SMALL) {
    size_t n = mc_pad_size(p, s->sclass);
    return n != (size_t)-1 ? n : mc_class_size[s->sclass] - MC_PAD;
  }
#endif
  if (s->kind == MC_SPAN_SMALL) return mc_class_size[s->sclass];
  if (s->kind == MC_SPAN_FREE) return 0;
  return s->start + ((size_t)s->pages << MC_PAGE_SHIFT) - (uintptr_t)p;
}

MC_EXPORT size_t MC_NAME(malloc_usable_size)(void *p) { return mc_usable_size(p); }

MC_EXPORT void *MC_NAME(calloc)(size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) { errno = ENOMEM; return NULL; }
  if (total <= MC_SMALL_MAX) {
#if MC_DEBUG >= 1
    void *p = mc_alloc_padded(total);
#else
    void *p = mc_small_fast(total);
#endif
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
  uintptr_t e = mc_pagemap_entry(p);
  mc_span_t *s = (mc_span_t *)(e & MC_PM_SPAN_MASK);
  if (s == NULL || s->kind == MC_SPAN_FREE) mc_free_slow(p, 0);
  if (s->kind == MC_SPAN_SMALL) {
    /* a freed object would be handed back in place while it is also free */
    unsigned cls = (unsigned)(e & MC_PM_CLASS_MASK);
    uintptr_t a = (uintptr_t)p;
    bool ok = mc_double_free_check
                  ? (a & (MC_ALIGN - 1)) == 0 && (__atomic_load_n(mc_livemap_word(a), __ATOMIC_RELAXED) & mc_livemap_bit(a)) != 0
                  : mc_object_start(a, e, cls);
    if (mc_unlikely(!ok)) mc_free_refused(p, e, cls);
    MC_PAD_CHECK(p, cls);
    size_t cur = mc_class_size[cls] - MC_PAD_BYTES; /* the most the object holds */
    size_t old = MC_DEBUG >= 1 ? mc_usable_size(p) : cur;
    if (size <= cur && (size > cur / 2 || cur <= 128)) { /* same or adjacent class */
      MC_PAD_SET(p, size);
      return p;
    }
    if (size > cur) return mc_realloc_grow(p, old, size);
    return mc_realloc_move(p, old, size);
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
  if (size <= MC_SMALL_MAX - MC_PAD_BYTES && align <= MC_PAGE_SIZE) {
    /* a class whose size is a multiple of align gives aligned objects: spans are page aligned */
    size_t need = (size + MC_PAD_BYTES + align - 1) & ~(align - 1);
    for (unsigned c = mc_size_to_class(need); c < MC_CLASSES; c++) {
      if (mc_class_size[c] % align == 0) {
        if (mc_class_size[c] > need * 2 && mc_class_size[c] > MC_PAGE_SIZE) break;
        void *p = mc_small_fast(mc_class_size[c]);
        if (p) MC_PAD_SET(p, size);
        return p;
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
  mc_mgmt_start_deferred();
  uintptr_t a = (s->start + align - 1) & ~(uintptr_t)(align - 1);
  if (a != s->start && !mc_heap_map_extra(s, a)) { mc_heap_free(s); errno = ENOMEM; return NULL; }
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
