/* internal.h — libmemcolo's internal table of contents.
 *
 * Glossary (sizes on x86-64 Linux):
 *   page      4 KiB, the unit of the page heap and of subrelease (MADV_DONTNEED).
 *   huge page 2 MiB = 512 pages, the unit obtained from the OS (MADV_HUGEPAGE). A huge
 *             page is "intact" until some of its free pages are subreleased, then
 *             "broken" (the kernel backs it with 4 KiB pages).
 *   span      a run of contiguous pages handed out by the page heap: either cut into
 *             objects of one size class (small span) or one large block.
 *   size class one of MC_CLASSES object sizes, 16 B .. 32 KiB, multiples of 16.
 *   filler    the set of huge pages from which spans < MC_REGION_PAGES are cut,
 *             packing onto the fullest huge page (TCMalloc HugePageFiller).
 *   hp cache  free huge pages, backed ("pre-faulted") or released.
 *   region    a dedicated 2 MiB-aligned mapping for a block > MC_REGION_PAGES pages, or
 *             a growth region: the mapping of a block that realloc grows past
 *             MC_GROW_MIN_BYTES, with room (cap_pages) to grow in place.
 *   pool      Hermes' segregated free list of pre-faulted large blocks (formula (1)).
 *   tcache    a thread's cache of free objects: per size class an array (stack) of
 *             pointers; objects themselves are never written by the allocator.
 *   shard     one of mc_nshards (number of CPUs, at most MC_MAX_SHARDS) copies of the
 *             central lists; a thread refills from its own shard, and objects go back
 *             to the shard of their span (jemalloc's arenas, TCMalloc's sharded
 *             transfer caches).
 *   central   per shard and size class: a transfer cache (an array of free objects
 *             moved in batches) and the spans with free objects, each with a bitmap
 *             of its free objects (no pointer chasing, no object touched).
 *   page map  page -> entry: span pointer | size class (bits 0-5, 0 = not a small
 *             span) | shard (bits 48-55) | page index in the span (bits 56-63): free()
 *             finds the class and the pointer's offset in its span in one load.
 *   live map  one bit per 16-byte granule of the address space, set while the object
 *             starting there is held by the program (malloc sets it, free clears it
 *             and aborts if it was clear): a double free, or a free of an object never
 *             handed out, is caught at the free wherever the first free left the
 *             object. No other bit is ever set (a span's bits are all clear when it
 *             goes back to the page heap), so a pointer into an object, or past a
 *             span's last object, finds its bit clear too. Kept in each page map
 *             leaf's mapping, after its entries (1 GiB of address space per leaf).
 *
 * Locks, in order: central[shard][c].lock -> heap lock (mc_heap.lock) ; pool lock -> heap lock.
 * Prefixes: public memcolo_*, shared internal mc_<file>_*, file-private static.
 */
#ifndef MC_INTERNAL_H
#define MC_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memcolo.h"

#define MC_EXPORT __attribute__((visibility("default")))
/* MC_PREFIXED builds (ASan/UBSan test builds) export memcolo_malloc etc. instead of
 * malloc, so that the sanitizer's own allocator keeps the standard names. */
#ifdef MC_PREFIXED
#define MC_NAME(n) memcolo_##n
#else
#define MC_NAME(n) n
#endif
#define mc_likely(x) __builtin_expect(!!(x), 1)
#define mc_unlikely(x) __builtin_expect(!!(x), 0)
#define MC_NOINLINE __attribute__((noinline))

#define MC_PAGE_SHIFT 12
#define MC_PAGE_SIZE ((size_t)1 << MC_PAGE_SHIFT)
#define MC_HUGE_SHIFT 21
#define MC_HUGE_SIZE ((size_t)1 << MC_HUGE_SHIFT)
#define MC_HP_PAGES 512
#define MC_ALIGN 16                       /* alignment of every malloc result */
#define MC_SMALL_MAX ((size_t)32768)      /* largest size class */
#define MC_CLASSES 41                     /* class 0 unused; 1..40 */
#define MC_REGION_PAGES 256               /* spans above 1 MiB get their own mapping */
#define MC_POOL_MIN_BYTES ((size_t)128 << 10) /* Hermes min_mmap_size */
#define MC_POOL_BUCKETS 8                 /* Hermes table_size (1 MiB / 128 KiB) */
#define MC_SPAN_MAX_OBJECTS 256           /* objects in a small span, at most */
#define MC_MAX_SHARDS 8
#define MC_GROW_MIN_BYTES ((size_t)1024) /* realloc growth past this goes to a growth region */
#define MC_GROW_REGIONS_MAX 64           /* live growth regions, at most (then copies as before) */

#ifndef MC_DEBUG
#define MC_DEBUG 0 /* 0: release checks only; 1: + cheap invariants; 2: + full walks */
#endif

/* ---------------------------------------------------------------- types */
typedef enum { MC_SPAN_FREE = 0, MC_SPAN_SMALL, MC_SPAN_LARGE, MC_SPAN_REGION } mc_span_kind_t;

struct mc_hugepage_s;

typedef struct mc_span_s {
  /* first cache line: all that giving an object back to its span touches */
  uintptr_t start;          /* address of the first page */
  uint32_t pages;           /* length in 4 KiB pages */
  uint8_t kind;             /* mc_span_kind_t */
  uint8_t sclass;           /* size class (small spans) */
  uint8_t in_central;       /* on its class's nonempty list */
  uint8_t pooled;           /* sitting in the Hermes pool */
  uint8_t fresh;            /* region straight from mmap: still zero */
  uint8_t shard;            /* central shard owning a small span */
  uint8_t locked;           /* pooled block mlocked (MEMCOLO_MLOCK; reserve.c) */
  uint16_t capacity;        /* objects in a small span (<= MC_SPAN_MAX_OBJECTS) */
  uint16_t allocated;       /* objects out of the span (in tcaches, transfer caches, or app) */
  uint64_t freemap[MC_SPAN_MAX_OBJECTS / 64]; /* bit set: object i is free in the span */
  struct mc_span_s *next;
  /* second cache line */
  struct mc_span_s *prev;
  struct mc_hugepage_s *hp; /* owning huge page (filler spans) */
  uintptr_t map_extra;      /* an interior page also in the page map (aligned blocks), or 0 */
  uint32_t cap_pages;       /* regions: pages mapped (>= pages); growth within them is in place */
  uint32_t acct_pages;      /* regions: pages counted in the heap's totals (lags pages by a
                               bounded amount while a growth region grows without the lock) */
  uint8_t growth;           /* a growth region (made by realloc, counted in mc_heap.growth_regions) */
} __attribute__((aligned(64))) mc_span_t;

typedef struct mc_hugepage_s {
  uintptr_t base;                        /* 2 MiB-aligned */
  uint64_t used[MC_HP_PAGES / 64];       /* bit set: page belongs to an allocated span */
  uint64_t released[MC_HP_PAGES / 64];   /* bit set: page is not backed (never faulted or subreleased) */
  uint16_t used_pages, released_pages, longest_free;
  uint16_t longest_count;                /* free runs of length longest_free (pageheap.c) */
  uint8_t where;   /* MC_HP_FILLER, MC_HP_CACHE, MC_HP_BUSY */
  uint8_t broken;  /* partially subreleased since last whole release */
  uint8_t thp;     /* backed by a transparent huge page (collapsed by us) */
  uint8_t collapsing; /* MADV_COLLAPSE in progress: no release of its pages meanwhile */
  uint8_t dense_seen; /* found dense by the last collapse pass */
  struct mc_hugepage_s *next, *prev;
} mc_hugepage_t;

enum { MC_HP_NONE = 0, MC_HP_FILLER, MC_HP_CACHE, MC_HP_BUSY };

typedef struct mc_list_s { mc_hugepage_t *head; } mc_hplist_t;

/* the page heap (pageheap.c); every field under lock */
typedef struct mc_heap_s {
  pthread_mutex_t lock;
  mc_hplist_t filler[MC_HP_PAGES + 1];   /* by longest free run (1..511); intact only */
  mc_hplist_t filler_broken[MC_HP_PAGES + 1]; /* same, for broken huge pages */
  uint64_t filler_nonempty[(MC_HP_PAGES + 1 + 63) / 64];
  uint64_t broken_nonempty[(MC_HP_PAGES + 1 + 63) / 64];
  mc_hplist_t cache_backed, cache_released;
  size_t cache_backed_n, cache_released_n;
  mc_span_t *region_cache;   /* freed regions kept for reuse */
  size_t region_cache_n, region_cache_bytes;
  /* accounting, in pages */
  size_t used_pages;         /* allocated spans (filler + regions) */
  size_t used_intact_pages;  /* allocated pages on intact filler huge pages or in regions */
  size_t free_backed_pages;  /* free & backed in filler and cache */
  size_t released_pages;     /* free & released in filler and cache */
  size_t hugepages, hugepages_broken;
  size_t hugepages_thp, used_thp_pages; /* THP-backed huge pages, used pages on them */
  size_t region_pages;       /* pages in live regions */
  size_t growth_regions;     /* live growth regions */
  /* cumulative */
  uint64_t released_total_pages, subreleased_pages, os_mmap_calls;
  uint64_t reserve_hits, reserve_misses;
} mc_heap_t;

/* options (options.c) */
typedef enum {
  MC_OPT_CLASS,               /* lc|be|elastic (0=none,1=lc,2=be,3=elastic) */
  MC_OPT_RESERVE,             /* force reservation on/off (-1 = by class) */
  MC_OPT_RESERVE_INTERVAL_US, /* management thread period */
  MC_OPT_RSV_FACTOR_PCT,      /* RSV_FACTOR x 100 */
  MC_OPT_MIN_RSV_BYTES,       /* min_rsv */
  MC_OPT_TRIM_FACTOR_PCT,     /* TRIM_THR = this/100 x reservation target */
  MC_OPT_MLOCK,               /* mlock pooled large blocks until handed out, when permitted */
  MC_OPT_RELEASE_RATE_BYTES,  /* periodic release rate, bytes/s (0 = none) */
  MC_OPT_SKIP_SUBRELEASE_S,   /* Delta, seconds (0 = off) */
  MC_OPT_T_SCHEDULE_S,        /* window of realized fragmentation */
  MC_OPT_HP_CACHE_BYTES,      /* backed free huge pages kept beyond the reserve */
  MC_OPT_TCACHE_BYTES,        /* per-thread cache bound */
  MC_OPT_THP,                 /* 0 none, 1 background MADV_COLLAPSE, 2 MADV_HUGEPAGE at mmap */
  MC_OPT_STATS,               /* report at exit */
  MC_OPT_VERBOSE,             /* warnings */
  MC_OPT_AGENT,               /* talk to the agent when a class is set */
  MC_OPT_NUM_EPOCHS,          /* allow-rate gate: NUM_epochs (M3 §4.2) */
  MC_OPT_GATE_MIN_EPOCH_MS,   /* allow-rate gate: shortest epoch, ms (protocol §9) */
  MC_OPT_TOP_HOLD_S,          /* seconds without reservation after a `top` notification */
  MC_OPT_MGMT_NICE,           /* nice of the management thread while the reservation is on */
  MC_OPT_RSV_HORIZON_MS,      /* reserves also cover this long of the measured demand rate */
  MC_OPT_RSV_TRACE,           /* 1: the management thread's samples on stderr at exit */
  MC_OPT_RSV_BACKOFF,         /* 0 off, 1 stop pre-faulting, 2 fair share, while a busy app misses */
  MC_OPT_RSV_YIELD_US,        /* longest app wait for the filling thread's CPU, us; 0 = never */
  MC_OPT_RSV_YIELD_WAIT_US,   /* app wait on our CPU before the fill steps aside, us (0 = at once) */
  MC_OPT_RSV_YIELD_MODE,      /* how the fill steps aside: 0 sleep, 1 sched_yield, 2 leave the app's CPU, 3 SCHED_IDLE while busy */
  MC_OPT_MGMT_SLICE_US,       /* EEVDF slice of the management thread (sched_attr.sched_runtime), us; 0 = kernel's */
  MC_OPT_SOCKET,              /* the agent's socket (string: mc_options_str) */
  MC_OPT_TIER,                /* MaxMem tiering of large anonymous mappings (tier.c) */
  MC_OPT_TIER_THRESHOLD,      /* smallest mapping tiered, bytes */
  MC_OPT_TIER_RECOVER_S,      /* how long tiered memory waits for a new agent after a crash */
  MC_OPT_T_MISS,              /* target fast-memory miss ratio (string: mc_options_str; NULL = agent's) */
  MC_OPT_TIER_SOCKET,         /* the tiering socket (string: mc_options_str; NULL = beside SOCKET) */
  MC_OPT_DOUBLE_FREE_CHECK,   /* 1: the live map's double-free check at every free; 0: the object-start test only */
  MC_OPT__COUNT
} mc_option_t;

/* How an option's value is read (options.c). */
typedef enum {
  MC_OT_INT,    /* an integer (k/m/g suffixes accepted), clamped to [min, max] */
  MC_OT_BOOL,   /* 0 or 1 (any other number is 1) */
  MC_OT_BYTES,  /* a size in bytes, k/m/g suffixes */
  MC_OT_X100,   /* a decimal factor, kept x100 */
  MC_OT_CHOICE, /* one word of sdef's comma-separated list: its index + 1; unset 0 */
  MC_OT_PATH,   /* a path (mc_options_str; sdef the default, NULL none) */
  MC_OT_RATIO,  /* a decimal passed on as text (mc_options_str; NULL unset) */
} mc_option_type_t;

#define MC_OPT_RATIO_MAX 32 /* longest MC_OT_RATIO text, with its NUL */

/* One option: MEMCOLO_<name>, its type, default (def for numbers, sdef for text and
 * the list of a choice), range [min, max] of numbers, and its meaning. */
typedef struct {
  const char *name;
  mc_option_type_t type;
  long def, min, max;
  const char *sdef;
  const char *doc;
} mc_option_desc_t;

long mc_option(mc_option_t o);
void mc_options_init(void); /* reads the environment, once per process */
const char *mc_option_name(mc_option_t o);
const mc_option_desc_t *mc_option_desc(mc_option_t o);
extern long mc_options_cache[MC_OPT__COUNT];
extern const char *mc_options_str[MC_OPT__COUNT];
#define MC_OPT(o) (mc_options_cache[o])
#define MC_OPT_STR(o) (mc_options_str[o]) /* MC_OT_PATH and MC_OT_RATIO options */

/* ---------------------------------------------------------------- os.c */
/* 2 MiB-aligned anonymous mapping, NULL when the system refuses it (after retries; see
 * os.c "Refusals") */
void *mc_os_map_huge(size_t bytes);
void *mc_os_map_huge_try(size_t bytes); /* one try, silent: the caller has a fallback */
extern uint64_t mc_os_refusals;       /* mappings refused after every retry */
void mc_os_unmap(void *p, size_t bytes);
void mc_os_release(void *p, size_t bytes);  /* MADV_DONTNEED (after munlock if locked) */
void mc_os_populate(void *p, size_t bytes); /* MADV_POPULATE_WRITE, or touch */
bool mc_os_populate_locked(void *p, size_t bytes); /* populate + mlock with MEMCOLO_MLOCK; true if locked */
void mc_os_unlock(void *p, size_t bytes);   /* munlock */
void *mc_os_remap(void *p, size_t old_bytes, size_t new_bytes); /* keeps 2 MiB alignment */
void *mc_os_meta_alloc(size_t bytes); /* zeroed internal memory, never freed */
void mc_os_thp_init(void);            /* reads the THP settings (MEMCOLO_THP, sysfs) */
bool mc_os_thp_background(void);      /* huge pages come from background MADV_COLLAPSE */
bool mc_os_thp_at_fault(void);        /* huge pages come at first touch (MADV_HUGEPAGE) */
extern uint64_t mc_os_collapse_calls; /* MADV_COLLAPSE attempts (tests) */
bool mc_os_collapse(void *p);         /* MADV_COLLAPSE of the huge page at p */
unsigned mc_os_resident_pages(void *p); /* mincore count of the huge page at p */
void mc_os_warn_once(int *flag, const char *msg, long err);

/* ---------------------------------------------------------------- message.c */
void mc_write_str(int fd, const char *s);
char *mc_fmt_u64(char *buf, uint64_t v);   /* returns end; buf >= 21 bytes */
char *mc_fmt_hex(char *buf, uint64_t v);   /* "0x..." */
void mc_msg(int fd, const char *const *parts, const uint64_t *nums, int n); /* part,num,part,... */
__attribute__((noreturn)) void mc_fatal(const char *what, const void *p, long sclass, const char *expected);
void mc_warn(const char *what);

/* ---------------------------------------------------------------- sizeclass.c */
extern uint32_t mc_class_size[MC_CLASSES];
extern uint32_t mc_class_recip[MC_CLASSES]; /* ceil(2^32 / size): offset / size by a multiply */
extern uint16_t mc_class_pages[MC_CLASSES];
extern uint16_t mc_class_batch[MC_CLASSES];
extern uint16_t mc_class_tcap[MC_CLASSES];  /* thread cache slots of the class */
extern uint8_t mc_class_small_idx[(1024 >> 4) + 1];
/* What free checks of a pointer's offset `off` (bytes) from its span's start: it is an
 * object's start iff off < end (the span's bytes that hold objects: capacity x size)
 * and off % size == 0, tested as off * magic < magic with magic = ceil(2^64 / size)
 * (Lemire, Kaser, Kurz, "Faster remainder by direct computation", 2019, §3). */
typedef struct { uint64_t magic; uint32_t end; uint32_t unused; } mc_class_check_t;
extern mc_class_check_t mc_class_check[MC_CLASSES] __attribute__((visibility("hidden")));
extern uint8_t mc_class_large_idx[(MC_SMALL_MAX >> 7) + 1];
void mc_sizeclass_init(void);
static inline unsigned mc_size_to_class(size_t size) {
  /* small sizes first: malloc's fast path falls through to them (no taken branch) */
  if (mc_likely(size <= 1024)) return mc_class_small_idx[(size + 15) >> 4];
  return mc_class_large_idx[(size + 127) >> 7];
}

/* ---------------------------------------------------------------- pagemap.c */
extern uintptr_t *mc_pagemap_root[1 << 18];
#define MC_PM_CLASS_MASK ((uintptr_t)63)
#define MC_PM_SPAN_MASK ((uintptr_t)0x0000ffffffffffc0ull)
#define MC_PM_SHARD_SHIFT 48
#define MC_PM_PAGE_SHIFT 56 /* small spans: the page's index in its span (< 256 pages) */
/* the raw entry of the page holding p: span | class | shard << 48 | page index << 56, or 0 */
static inline uintptr_t mc_pagemap_entry(const void *p) {
  uintptr_t a = (uintptr_t)p >> MC_PAGE_SHIFT;
  if (mc_unlikely(a >> 36)) return 0;
  uintptr_t *leaf = mc_pagemap_root[a >> 18];
  return mc_likely(leaf != NULL) ? leaf[a & ((1u << 18) - 1)] : 0;
}
/* The live map (see the glossary): per page map leaf (2^30 bytes of address space),
 * 2^26 bits, one per 16-byte granule, set while the object starting there is held by
 * the program. Mapped right after the leaf's entries, in the same mapping (8 MiB of
 * address space; only the words of the granules of small spans ever become resident:
 * 1/128 of those spans' bytes), so that free, which has loaded the leaf's address for
 * the page map entry, finds the live map word without another load. Its words are
 * shared by objects of different threads: updated with atomic RMWs. */
#define MC_PM_LEAF_BYTES (sizeof(uintptr_t) << 18)
#define MC_LIVEMAP_BYTES ((size_t)1 << (30 - 4 - 3))
/* the word of address a's granule, in the live map of a's leaf (a < 2^48, in the map) */
static inline uint64_t *mc_livemap_word_in(const uintptr_t *leaf, uintptr_t a) {
  /* the byte offset of word a >> 10, as one shift and mask: an addressing mode's
   * displacement then adds MC_PM_LEAF_BYTES */
  return (uint64_t *)((const char *)leaf + MC_PM_LEAF_BYTES + ((a >> 7) & (((uintptr_t)1 << 23) - 8)));
}
static inline uint64_t *mc_livemap_word(uintptr_t a) {
  return mc_livemap_word_in(mc_pagemap_root[a >> 30], a);
}
static inline uint64_t mc_livemap_bit(uintptr_t a) { return (uint64_t)1 << ((a >> 4) & 63); }
static inline mc_span_t *mc_pagemap_get(const void *p) {
  return (mc_span_t *)(mc_pagemap_entry(p) & MC_PM_SPAN_MASK);
}
bool mc_pagemap_set(uintptr_t page_addr, mc_span_t *s);   /* false on metadata OOM */
bool mc_pagemap_set_span(mc_span_t *s);   /* all pages of a small span, ends of others */
void mc_pagemap_clear_span(mc_span_t *s);
mc_span_t *mc_meta_span_alloc(void);    /* heap lock held */
void mc_meta_span_free(mc_span_t *s);   /* heap lock held */
mc_hugepage_t *mc_meta_hp_alloc(void);  /* heap lock held */
void mc_meta_hp_free(mc_hugepage_t *h); /* heap lock held */

/* ---------------------------------------------------------------- pageheap.c */
extern mc_heap_t mc_heap;
void mc_heap_init(void);
/* A span of `pages` pages of `kind` (locks; NULL on OOM). For small spans, tag =
 * size class | shard << 8, set before the span enters the page map. */
mc_span_t *mc_heap_alloc(size_t pages, size_t kind, unsigned tag);
bool mc_heap_map_extra(mc_span_t *s, uintptr_t addr);     /* locks; false: no metadata */
/* A growth region of `pages` pages (realloc): NULL when MC_GROW_REGIONS_MAX are live or
 * on OOM. Locks. */
mc_span_t *mc_heap_growth_alloc(size_t pages);
/* Grows a region to new_pages: in place within cap_pages (without the lock while the
 * growth not yet counted in the heap's totals stays small), else mremap (no copy) to a
 * mapping of twice new_pages; false if it cannot. */
bool mc_heap_region_grow(mc_span_t *s, size_t new_pages);
void mc_heap_free(mc_span_t *s);                   /* locks */
void mc_heap_free_list(mc_span_t *list);           /* spans linked by next, one lock hold */
bool mc_heap_try_grow(mc_span_t *s, size_t new_pages); /* in place; locks */
void mc_heap_shrink(mc_span_t *s, size_t new_pages);   /* in place; locks */
/* Releases up to `bytes` (0 = all) of free memory: cached regions, then backed free huge
 * pages of the cache while more than protect_cache_bytes of them remain (the
 * reservation), then, unless cache_only, free pages of partially used huge pages
 * (subrelease). Returns the bytes released. */
size_t mc_heap_release_locked(size_t bytes, bool cache_only, size_t protect_cache_bytes);
size_t mc_heap_release_periodic_locked(size_t bytes, size_t protect_cache_bytes); /* spares nearly full intact huge pages */
size_t mc_heap_backed_free_bytes(void);
bool mc_heap_prefault_one_hugepage(void);          /* reservation: one more backed hp */
/* the management thread, no lock held: maps the next chunk of address space for huge
 * pages ahead, so that allocations never wait in mmap (locks) */
void mc_heap_va_prepare(void);
/* background THP: collapses dense, resident huge pages (in_use: of the filler, holding
 * allocations; with_cache: free pre-faulted ones of the cache) for at most budget_us; returns
 * the number collapsed (takes and drops the lock around each MADV_COLLAPSE) */
unsigned mc_heap_collapse_pass(uint64_t budget_us, bool in_use, bool with_cache);
void mc_heap_stats_locked(memcolo_stats_t *st);
bool mc_heap_check_locked(void);                   /* invariant checker */

/* ---------------------------------------------------------------- release.c (ISMM'21) */
void mc_release_on_heap_change_locked(uint64_t now_ms); /* epoch tracking + periodic release */
void mc_release_tick_locked(uint64_t now_ms, size_t protect_bytes);
void mc_release_stats_locked(memcolo_stats_t *st);
size_t mc_release_peak_used_pages_locked(uint64_t now_ms);
size_t mc_release_recent_peak_used_locked(void);
void mc_release_skipped_locked(size_t pages); /* a kept freed region: a skipped release (§4.2) */
uint64_t mc_now_ms(void);
extern uint64_t mc_fake_now_ms; /* tests: nonzero replaces the clock */
void mc_release_test_reset_locked(void);
void mc_central_drain(void);
void mc_tcache_flush_self(void);
uint64_t mc_now_us(void);
uint64_t mc_now_ns(void);

/* ---------------------------------------------------------------- central.c */
extern unsigned mc_nshards;
void mc_central_init(void);
/* up to n free objects of class cls from the shard (>= 1, or 0 on OOM) */
int mc_central_fetch(unsigned shard, unsigned cls, void **out, int n);
/* gives objects back, each to the shard of its span; checks each against the page map */
void mc_central_return(unsigned cls, void **objs, int n);
void mc_central_lock_all(void);
void mc_central_unlock_all(void);
bool mc_central_contains(unsigned cls, const void *p);      /* debug: in a transfer cache or free in its span */

/* ---------------------------------------------------------------- tcache.c */
/* count <= max = min(the list's bound lmax, the capacity of slots): the fast paths
 * look at max only */
typedef struct mc_bin_s { uint32_t count, max; void **slots; } mc_bin_t;
typedef struct mc_tcache_s {
  mc_bin_t bins[MC_CLASSES];
  uint16_t lmax[MC_CLASSES];         /* the list's bound (slow start, byte budget) */
  uint16_t cap[MC_CLASSES];          /* slots allocated (grown when count reaches it, 0 = none yet) */
  unsigned shard;
  uint64_t slow_calls, large_allocs; /* telemetry, summed by memcolo_stats */
  struct mc_tcache_s *next_all, *prev_all;
} mc_tcache_t;
/* The calling thread's cache; &mc_tcache_none (every list empty and full at once, never
 * written) until the thread's first allocation and after its cache is destroyed, so that
 * the fast paths need no test for a missing cache: their slow paths tell it apart. */
extern __thread mc_tcache_t *mc_tcache __attribute__((tls_model("initial-exec")));
extern mc_tcache_t mc_tcache_none;
/* the calling thread's cache, or NULL when it has none (yet, or any more) */
static inline mc_tcache_t *mc_tcache_self(void) { return mc_tcache != &mc_tcache_none ? mc_tcache : NULL; }
extern __thread int mc_tcache_dead __attribute__((tls_model("initial-exec")));
mc_tcache_t *mc_tcache_get_slow(void);
void *mc_tcache_refill(mc_tcache_t *tc, unsigned cls);
bool mc_tcache_overflow(mc_tcache_t *tc, unsigned cls); /* false: no room (give the object to central) */
void mc_tcache_init(void);
void mc_tcache_flush_all_for_fork_child(void);
size_t mc_tcache_count(void);
bool mc_tcache_contains(mc_tcache_t *tc, unsigned cls, const void *p);

/* ---------------------------------------------------------------- alloc.c */
/* MEMCOLO_DOUBLE_FREE_CHECK (alloc.c): true until init reads the option (debug builds:
 * always). It may only go from true to false, before the first object is handed out. */
extern bool mc_double_free_check __attribute__((visibility("hidden")));
extern uint64_t mc_secret;        /* random, nonzero (debug canaries); set by mc_secret_init */
void mc_secret_init(void);
void *mc_malloc_slow(size_t size);
void *mc_alloc_aligned(size_t align, size_t size);
void mc_free_slow(void *p, uintptr_t entry);
size_t mc_usable_size(const void *p);
extern uint64_t mc_stat_slow_calls, mc_stat_large_allocs; /* of exited threads, and cacheless calls */
void mc_tcache_sum_stats(uint64_t *slow_calls, uint64_t *large_allocs);

/* ---------------------------------------------------------------- reserve.c (Hermes) */
extern volatile int mc_reserve_on;
extern volatile int mc_reserve_thread_running;
extern uint64_t mc_demand_large_bytes, mc_demand_large_count;
/* Small demand (Algorithm 1) is the growth of the bytes in small spans, not the spans
 * taken: mc_small_span_bytes is what the front end holds from the page heap now (bytes),
 * mc_small_span_peak its highest value since the management thread last read it. A span
 * given back and taken again is no demand: its pages are still backed (reserve.c). One
 * atomic add per span taken or given back (not per object). */
extern uint64_t mc_small_span_bytes, mc_small_span_peak;
static inline void mc_small_spans_taken(size_t bytes) {
  uint64_t now = __atomic_add_fetch(&mc_small_span_bytes, bytes, __ATOMIC_RELAXED);
  uint64_t peak = __atomic_load_n(&mc_small_span_peak, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&mc_small_span_peak, &peak, now, true, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)) {
  }
}
static inline void mc_small_spans_returned(size_t bytes) {
  __atomic_sub_fetch(&mc_small_span_bytes, bytes, __ATOMIC_RELAXED);
}
void *mc_pool_alloc(size_t pages);   /* NULL if the pool cannot serve */
bool mc_pool_free(mc_span_t *s);     /* true if kept */
void mc_reserve_start(void);
void mc_reserve_stats(memcolo_stats_t *st);
size_t mc_reserve_target_bytes(void);
void mc_reserve_lock(void);
void mc_reserve_unlock(void);
void mc_reserve_after_fork_child(void);
size_t mc_pool_drain(void);
void mc_reserve_suspend(uint64_t hold_ms);  /* off now, back on after hold_ms (top) */
void mc_reserve_yield_point(void);          /* between pre-fault steps: sleeps while the app waits for our CPU */
void mc_mgmt_maybe_start(void);             /* management thread without reservation */
/* set by the page heap when the management thread should start; the allocation entry
 * points start it once they hold no allocator state in flight (it callocs) */
extern int mc_mgmt_start_wanted;
static inline void mc_mgmt_start_deferred(void) {
  if (mc_unlikely(__atomic_load_n(&mc_mgmt_start_wanted, __ATOMIC_RELAXED))) {
    __atomic_store_n(&mc_mgmt_start_wanted, 0, __ATOMIC_RELAXED);
    mc_mgmt_maybe_start();
  }
}
void mc_mgmt_autostart_off(void);            /* tests that drive the release clock themselves */
#define MC_MGMT_AUTOSTART_HP 4
bool mc_reserve_suspended(void);

/* ---------------------------------------------------------------- agent.c (M3 link) */
void mc_agent_start(void);                 /* background link to the agent, once */
void mc_agent_after_fork_child(void);
size_t mc_agent_release(memcolo_level_t level, size_t target_bytes);
const char *mc_agent_socket_path(void);
void mc_agent_stats(memcolo_stats_t *st);
/* allow-rate gate (M3 §4.2), clock passed in for tests */
void mc_gate_reset(void);
void mc_gate_signal_received(uint64_t now_ns);
void mc_gate_signal_handled(uint64_t now_ns);
double mc_gate_rate_at(uint64_t now_ns);
int mc_gate_admit_at(uint64_t now_ns);
/* The wire format of the link (docs/protocol.md), apart from its I/O so that
 * test/test_vectors.c runs it against sdk/testvectors. */
#define MC_AGENT_MAX_LINE 65536                 /* protocol MAX_LINE_BYTES */
#define MC_AGENT_LINE_CAP 256                   /* buffer for mc_agent_fmt_* */
/* `register{class, name, notify: socket}` with its newline into buf (at least
 * MC_AGENT_LINE_CAP bytes); cls "lc", "be" or "elastic"; comm (at most 16 bytes used)
 * NULL or "" for no name. Returns the line's length. */
size_t mc_agent_fmt_register(char *buf, const char *cls, const char *comm);
/* `reclaimed{seq, bytes, duration_ms, ok: true}` with its newline; length returned. */
size_t mc_agent_fmt_reclaimed(char *buf, uint64_t seq, uint64_t bytes, uint64_t duration_ms);
typedef enum {
  MC_AG_IGNORED,    /* not a valid reply (§9.4: ignored, warned about once) */
  MC_AG_NOTIFY,     /* seq, level, target_bytes */
  MC_AG_REGISTERED, /* cls: 1 lc, 2 be, 3 elastic (MEMCOLO_CLASS's values) */
  MC_AG_ERROR,      /* code, code_len: the error code */
  MC_AG_OTHER,      /* ok, pong, status, cgroup: nothing to do */
} mc_agent_kind_t;
typedef struct {
  mc_agent_kind_t kind;
  bool newer_version;      /* MC_AG_IGNORED for a `v` above 1 (unsupported_version) */
  bool unknown_type;       /* MC_AG_IGNORED for a `type` this client does not know */
  const char *why;         /* MC_AG_IGNORED: the warning */
  uint64_t seq, target_bytes;
  memcolo_level_t level;
  int cls;
  const char *code;        /* points into the line */
  size_t code_len;
} mc_agent_reply_t;
/* Decodes one reply line (without its newline). */
void mc_agent_parse_reply(const char *s, size_t n, mc_agent_reply_t *out);

/* ---------------------------------------------------------------- stats.c */
void mc_agent_stats_publish(bool force);   /* the stats file for `memcolo alloc-stats` */
void mc_agent_stats_unpublish(void);
void mc_agent_stats_after_fork_child(void);

/* ---------------------------------------------------------------- init.c */
extern volatile int mc_initialized;
void mc_init(void);
static inline void mc_ensure_init(void) { if (mc_unlikely(!mc_initialized)) mc_init(); }
void mc_lock_all(void);
void mc_unlock_all(void);
/* a detached internal thread with every signal blocked; false if it could not start */
bool mc_thread_start(void *(*fn)(void *), size_t stack_bytes);

/* spans of a class's objects are at most this many bytes per object index */
static inline void *mc_span_obj(const mc_span_t *s, uint32_t i) {
  return (void *)(s->start + (uintptr_t)i * mc_class_size[s->sclass]);
}

#endif
