/* pageheap.c — the huge-page-aware page heap (the TCMalloc design that ISMM'21 builds
 * on). Memory comes from the OS in 2 MiB-aligned huge pages (made THPs in the
 * background, os.c):
 *   - the filler cuts spans of 1..MC_REGION_PAGES pages from partially used huge
 *     pages, choosing the huge page whose longest free run is the smallest that fits
 *     (so allocations pack onto the fullest huge pages and empty ones drain), intact
 *     huge pages before broken ones;
 *   - the huge page cache keeps free huge pages, backed or released;
 *   - regions: blocks above MC_REGION_PAGES pages get their own 2 MiB-aligned mapping,
 *     with a small cache of freed regions;
 *   - release: whole huge pages from the cache first, then subrelease of free 4 KiB
 *     pages of partially used huge pages (which breaks them). A broken huge page that
 *     becomes empty is released whole so that it is intact again when reused.
 * Per huge page, `used` and `released` bitmaps; `released` marks pages that are not
 * backed (never faulted since mapping/release). Background THP: the management
 * thread collapses dense, resident intact huge pages (mc_heap_collapse_pass); a huge
 * page being collapsed is never released meanwhile, and subrelease or a whole release
 * ends its THP state. Every function here runs under
 * mc_heap.lock unless it says it takes it. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

/* short critical sections: spin a little before sleeping (glibc's adaptive mutex) */
mc_heap_t mc_heap = {.lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP};

#define MC_REGION_CACHE_MAX 8
#define MC_REGION_CACHE_BYTES ((size_t)64 << 20)
#define MC_REGION_CACHE_DELTA_MAX 256 /* regions kept under the Delta rule, at most */

/* ------------------------------------------------------------ bitmap helpers */
static inline bool bit_get(const uint64_t *b, unsigned i) { return (b[i >> 6] >> (i & 63)) & 1; }
static inline void bit_set(uint64_t *b, unsigned i) { b[i >> 6] |= (uint64_t)1 << (i & 63); }
static inline void bit_clr(uint64_t *b, unsigned i) { b[i >> 6] &= ~((uint64_t)1 << (i & 63)); }

/* the first page >= i whose `used` bit is `want` (MC_HP_PAGES if none): word at a time */
static inline unsigned hp_next(const mc_hugepage_t *hp, unsigned i, bool want) {
  while (i < MC_HP_PAGES) {
    uint64_t w = hp->used[i >> 6];
    if (!want) w = ~w;
    w &= ~(uint64_t)0 << (i & 63);
    if (w != 0) return (i & ~63u) + (unsigned)__builtin_ctzll(w);
    i = (i & ~63u) + 64;
  }
  return MC_HP_PAGES;
}

/* the last page < i whose `used` bit is set, or -1: word at a time */
static inline int hp_prev_used(const mc_hugepage_t *hp, unsigned i) {
  while (i > 0) {
    unsigned w = (i - 1) >> 6;
    uint64_t m = hp->used[w];
    unsigned top = (i - 1) & 63; /* highest bit of this word below i */
    if (top < 63) m &= ((uint64_t)1 << (top + 1)) - 1;
    if (m != 0) return (int)(w * 64 + 63 - (unsigned)__builtin_clzll(m));
    i = w * 64;
  }
  return -1;
}

/* the length of the free run around [first, first+n) (pages free or being freed) */
static inline unsigned hp_run_around(const mc_hugepage_t *hp, unsigned first, unsigned n) {
  return hp_next(hp, first + n, true) - (unsigned)(hp_prev_used(hp, first) + 1);
}

/* the longest run of free pages (one step per run, not per page); *count: how many
 * runs are that long */
static unsigned hp_longest_free(const mc_hugepage_t *hp, unsigned *count) {
  unsigned best = 0, k = 0;
  for (unsigned i = hp_next(hp, 0, false); i < MC_HP_PAGES;) {
    unsigned end = hp_next(hp, i, true);
    if (end - i > best) { best = end - i; k = 1; }
    else if (end - i == best) k++;
    i = hp_next(hp, end, false);
  }
  if (count) *count = k;
  return best;
}

/* first run of n free pages, or -1 */
static int hp_find_run(const mc_hugepage_t *hp, unsigned n) {
  for (unsigned i = hp_next(hp, 0, false); i < MC_HP_PAGES;) {
    unsigned end = hp_next(hp, i, true);
    if (end - i >= n) return (int)i;
    i = hp_next(hp, end, false);
  }
  return -1;
}

/* ------------------------------------------------------------ lists */
static void list_push(mc_hplist_t *l, mc_hugepage_t *h) {
  h->prev = NULL;
  h->next = l->head;
  if (l->head) l->head->prev = h;
  l->head = h;
}
static void list_remove(mc_hplist_t *l, mc_hugepage_t *h) {
  if (h->prev) h->prev->next = h->next; else l->head = h->next;
  if (h->next) h->next->prev = h->prev;
  h->next = h->prev = NULL;
}

/* hp->longest_free is kept by hp_mark_used and hp_mark_free */
static void filler_insert(mc_hugepage_t *hp) {
  unsigned bin = hp->longest_free;
  if (hp->broken) { list_push(&mc_heap.filler_broken[bin], hp); bit_set(mc_heap.broken_nonempty, bin); }
  else { list_push(&mc_heap.filler[bin], hp); bit_set(mc_heap.filler_nonempty, bin); }
  hp->where = MC_HP_FILLER;
}
static void filler_remove(mc_hugepage_t *hp) {
  unsigned bin = hp->longest_free;
  if (hp->broken) {
    list_remove(&mc_heap.filler_broken[bin], hp);
    if (!mc_heap.filler_broken[bin].head) bit_clr(mc_heap.broken_nonempty, bin);
  } else {
    list_remove(&mc_heap.filler[bin], hp);
    if (!mc_heap.filler[bin].head) bit_clr(mc_heap.filler_nonempty, bin);
  }
  hp->where = MC_HP_NONE;
}

/* smallest nonempty bin >= n */
static int bins_find(const uint64_t *nonempty, unsigned n) {
  for (unsigned w = n >> 6; w < (MC_HP_PAGES + 1 + 63) / 64; w++) {
    uint64_t m = nonempty[w];
    if (w == (n >> 6)) m &= ~(uint64_t)0 << (n & 63);
    if (m) return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
  }
  return -1;
}

/* ------------------------------------------------------------ page accounting */
/* returns true if every page was backed (a reservation hit) */
/* Both keep hp->longest_free (and how many runs are that long) up to date without
 * rescanning the bitmap on every span in and out (the rescan took ~13 % of a
 * producer/consumer run's CPU): a free merges with its neighbours (each shorter than
 * the merged run), so the longest run is the larger of the old one and the merged run;
 * a use changes it only when it cuts the last run as long as the longest, and only
 * then is the bitmap scanned (one step per run). */
static bool hp_mark_used(mc_hugepage_t *hp, unsigned first, unsigned n) {
  bool all_backed = true;
  bool rescan = false;
  if (hp_run_around(hp, first, n) >= hp->longest_free) {
    if (hp->longest_count > 1) hp->longest_count--;
    else rescan = true;
  }
  for (unsigned i = first; i < first + n; i++) {
    bit_set(hp->used, i);
    if (bit_get(hp->released, i)) {
      bit_clr(hp->released, i);
      hp->released_pages--;
      mc_heap.released_pages--;
      all_backed = false;
    } else {
      mc_heap.free_backed_pages--;
    }
  }
  hp->used_pages = (uint16_t)(hp->used_pages + n);
  mc_heap.used_pages += n;
  if (!hp->broken) mc_heap.used_intact_pages += n;
  if (hp->thp) mc_heap.used_thp_pages += n;
  if (rescan) {
    unsigned k;
    hp->longest_free = (uint16_t)hp_longest_free(hp, &k);
    hp->longest_count = (uint16_t)k;
  }
  return all_backed;
}

static void hp_mark_free(mc_hugepage_t *hp, unsigned first, unsigned n) {
  for (unsigned i = first; i < first + n; i++) bit_clr(hp->used, i);
  unsigned run = hp_run_around(hp, first, n);
  if (run > hp->longest_free) { hp->longest_free = (uint16_t)run; hp->longest_count = 1; }
  else if (run == hp->longest_free) hp->longest_count++;
  hp->used_pages = (uint16_t)(hp->used_pages - n);
  mc_heap.used_pages -= n;
  mc_heap.free_backed_pages += n;
  if (!hp->broken) mc_heap.used_intact_pages -= n;
  if (hp->thp) mc_heap.used_thp_pages -= n;
}

static void hp_lose_thp(mc_hugepage_t *hp) {
  if (!hp->thp) return;
  hp->thp = 0;
  mc_heap.hugepages_thp--;
  mc_heap.used_thp_pages -= hp->used_pages;
}

/* releases every backed free page of an empty huge page, making it intact again */
static void hp_release_whole(mc_hugepage_t *hp) {
  size_t backed = MC_HP_PAGES - hp->released_pages;
  if (backed) {
    mc_os_release((void *)hp->base, MC_HUGE_SIZE);
    mc_heap.free_backed_pages -= backed;
    mc_heap.released_pages += backed;
    mc_heap.released_total_pages += backed;
  }
  memset(hp->released, 0xff, sizeof(hp->released));
  hp->released_pages = MC_HP_PAGES;
  if (hp->broken) { hp->broken = 0; mc_heap.hugepages_broken--; }
  hp_lose_thp(hp);
  hp->dense_seen = 0;
}

static void cache_insert(mc_hugepage_t *hp) {
  hp->where = MC_HP_CACHE;
  if (hp->released_pages == MC_HP_PAGES) {
    list_push(&mc_heap.cache_released, hp);
    mc_heap.cache_released_n++;
    return;
  }
  /* the limit: MEMCOLO_HP_CACHE, the reservation, and the demand that went away in the
   * last second or two (TCMalloc's HugeCache sizes itself by recent demand too); the
   * rest goes back to the OS at once. What stays is released by the periodic release
   * (rate-limited, sparing the peak of Delta) or on the agent's notifications. */
  size_t recent = mc_release_recent_peak_used_locked();
  size_t fluct = recent > mc_heap.used_pages ? (recent - mc_heap.used_pages) << MC_PAGE_SHIFT : 0;
  size_t limit = (size_t)MC_OPT(MC_OPT_HP_CACHE_BYTES) + mc_reserve_target_bytes() + fluct;
  if ((mc_heap.cache_backed_n + 1) * MC_HUGE_SIZE > limit && !hp->collapsing) {
    hp_release_whole(hp);
    list_push(&mc_heap.cache_released, hp);
    mc_heap.cache_released_n++;
    return;
  }
  list_push(&mc_heap.cache_backed, hp);
  mc_heap.cache_backed_n++;
}

static void cache_remove(mc_hugepage_t *hp) {
  if (hp->released_pages == MC_HP_PAGES) { list_remove(&mc_heap.cache_released, hp); mc_heap.cache_released_n--; }
  else { list_remove(&mc_heap.cache_backed, hp); mc_heap.cache_backed_n--; }
  hp->where = MC_HP_NONE;
}

/* puts a huge page whose use changed back where it belongs */
static void hp_place(mc_hugepage_t *hp) {
  if (hp->used_pages == 0) {
    if (hp->broken && !hp->collapsing) hp_release_whole(hp);
    cache_insert(hp);
  } else {
    filler_insert(hp);
  }
}

/* ------------------------------------------------------------ address space
 * Huge pages are carved from chunks of address space mapped MC_VA_CHUNK_BYTES at a
 * time and never unmapped (a huge page's memory goes back with MADV_DONTNEED). mmap
 * and munmap take the process's mmap lock for writing, so they wait for every holder
 * of it for reading, such as the management thread's MADV_POPULATE_WRITE of a huge
 * page (~0.7-1 ms here): an allocation that mapped its own huge page (three system
 * calls: map 4 MiB, trim both ends to the 2 MiB alignment) waited that long, once
 * every few huge pages, under the heap lock (strace -f -T: mmap <0.001004> ending with
 * the populate; the 700-900 us p99 of back-to-back 256 KiB blocks). Carving makes a
 * new huge page a bump of a pointer; the management thread maps the next chunk ahead
 * (mc_heap_va_prepare) so that an allocation does not map even one chunk while the
 * thread runs. If a chunk cannot be mapped (strict overcommit counts NORESERVE
 * mappings too), single huge pages are mapped as before. */
#define MC_VA_CHUNK_BYTES ((size_t)64 << 20)
static uintptr_t va_next, va_end; /* the chunk being carved: [va_next, va_end) */
static uintptr_t va_spare;        /* a chunk mapped ahead by the management thread, or 0 */

static void *va_take_hugepage(void) {
  if (va_next == va_end) {
    uintptr_t c = va_spare;
    va_spare = 0;
    if (c == 0) c = (uintptr_t)mc_os_map_huge_try(MC_VA_CHUNK_BYTES);
    if (c == 0) return mc_os_map_huge(MC_HUGE_SIZE); /* retried: a refusal is real */
    va_next = c;
    va_end = c + MC_VA_CHUNK_BYTES;
  }
  void *p = (void *)va_next;
  va_next += MC_HUGE_SIZE;
  return p;
}

void mc_heap_va_prepare(void) {
  pthread_mutex_lock(&mc_heap.lock);
  bool need = va_spare == 0 && va_end - va_next < MC_VA_CHUNK_BYTES / 2;
  pthread_mutex_unlock(&mc_heap.lock);
  if (!need) return;
  void *c = mc_os_map_huge_try(MC_VA_CHUNK_BYTES);
  if (c == NULL) return;
  pthread_mutex_lock(&mc_heap.lock);
  if (va_spare == 0) { va_spare = (uintptr_t)c; c = NULL; }
  pthread_mutex_unlock(&mc_heap.lock);
  if (c) mc_os_unmap(c, MC_VA_CHUNK_BYTES);
}

static mc_hugepage_t *hp_new_from_os(void) {
  mc_hugepage_t *hp = mc_meta_hp_alloc();
  if (hp == NULL) return NULL;
  void *mem = va_take_hugepage();
  if (mem == NULL) { mc_meta_hp_free(hp); return NULL; }
  memset(hp, 0, sizeof(*hp));
  hp->base = (uintptr_t)mem;
  memset(hp->released, 0xff, sizeof(hp->released));
  hp->released_pages = MC_HP_PAGES;
  hp->longest_free = MC_HP_PAGES;
  hp->longest_count = 1;
  mc_heap.released_pages += MC_HP_PAGES;
  mc_heap.hugepages++;
  return hp;
}

/* ------------------------------------------------------------ filler allocation */
static mc_span_t *filler_alloc(size_t n, unsigned *first_out, mc_hugepage_t **hp_out) {
  mc_hugepage_t *hp = NULL;
  int bin = bins_find(mc_heap.filler_nonempty, (unsigned)n);
  if (bin >= 0) hp = mc_heap.filler[bin].head;
  if (hp == NULL) {
    bin = bins_find(mc_heap.broken_nonempty, (unsigned)n);
    if (bin >= 0) hp = mc_heap.filler_broken[bin].head;
  }
  int first = -1;
  if (hp != NULL) {
    first = hp_find_run(hp, (unsigned)n);
    /* with the reservation on, prefer pre-faulted huge pages over faulting new pages */
    if (mc_reserve_on && mc_heap.cache_backed.head != NULL) {
      bool backed = true;
      for (unsigned i = (unsigned)first; i < (unsigned)first + n && backed; i++) backed = !bit_get(hp->released, i);
      if (!backed) hp = NULL;
    }
    if (hp) filler_remove(hp);
  }
  if (hp == NULL) {
    if (mc_heap.cache_backed.head) hp = mc_heap.cache_backed.head;
    else if (mc_heap.cache_released.head) hp = mc_heap.cache_released.head;
    if (hp) cache_remove(hp);
    else hp = hp_new_from_os();
    if (hp == NULL) return NULL;
    first = 0;
  }
  *first_out = (unsigned)first;
  *hp_out = hp;
  return (mc_span_t *)hp; /* non-NULL marker */
}

/* unmaps every cached freed region (before retrying a refused mapping) */
static void region_cache_unmap_all(void) {
  while (mc_heap.region_cache) {
    mc_span_t *r = mc_heap.region_cache;
    mc_heap.region_cache = r->next;
    mc_heap.region_cache_n--;
    mc_heap.region_cache_bytes -= (size_t)r->cap_pages << MC_PAGE_SHIFT;
    mc_heap.free_backed_pages -= r->pages;
    mc_heap.released_total_pages += r->pages;
    mc_os_unmap((void *)r->start, (size_t)r->cap_pages << MC_PAGE_SHIFT);
    mc_meta_span_free(r);
  }
}

/* A region of `pages` pages whose mapping holds min_cap..max_cap pages: a cached region
 * if one fits, else a new mapping of new_cap pages. A cached region counts its last
 * length L as free backed pages (resident, or at least faulted once since its last
 * release). Among those that fit, the one with the shortest L >= pages (no page to
 * fault, the least left over), else the longest L (the fewest pages to fault). When
 * none is large enough (a plain large block: min_cap == pages), the cached region with
 * the longest L is moved to a mapping of new_cap pages (mremap, no copy, its resident
 * pages kept): cached regions never pile up unused while new ones are mapped beside
 * them. The block takes all L pages when L is at most 8 x `pages` (no release, no
 * fault; malloc_usable_size says so, and they count as used: the demand the Delta rule
 * sees is what stays resident): replaced at random, 5-25 MiB buffers then settle on
 * regions of the largest size and stop faulting (126k faults per 1000 replacements,
 * tcmalloc 131k; releasing the rest past 2 x or 4 x `pages` faulted 455-690k, as many
 * as mapping each buffer afresh). A longer rest goes back to the OS. */
static mc_span_t *region_alloc(size_t pages, size_t min_cap, size_t max_cap, size_t new_cap) {
  mc_span_t *best = NULL, **best_link = NULL;
  for (mc_span_t **l = &mc_heap.region_cache; *l; l = &(*l)->next) {
    mc_span_t *r = *l;
    if (r->cap_pages < min_cap || r->cap_pages > max_cap) continue;
    bool better;
    if (best == NULL) better = true;
    else if (best->pages >= pages) better = r->pages >= pages && r->pages < best->pages;
    else better = r->pages > best->pages;
    if (better) { best = r; best_link = l; }
  }
  bool grow = false;
  if (best == NULL && min_cap == pages && mc_heap.region_cache != NULL) {
    /* none is large enough: the one with the most resident pages, moved to a larger
     * mapping (mremap: its pages come along, only the rest is faulted) */
    for (mc_span_t **l = &mc_heap.region_cache; *l; l = &(*l)->next) {
      if (best == NULL || (*l)->pages > best->pages) { best = *l; best_link = l; }
    }
    grow = true;
  }
  if (best) {
    if (grow) {
      void *q = mc_os_remap((void *)best->start, (size_t)best->cap_pages << MC_PAGE_SHIFT, new_cap << MC_PAGE_SHIFT);
      if (q == NULL) goto fresh;
      mc_heap.region_cache_bytes -= (size_t)best->cap_pages << MC_PAGE_SHIFT;
      mc_heap.region_cache_bytes += new_cap << MC_PAGE_SHIFT;
      best->start = (uintptr_t)q;
      best->cap_pages = (uint32_t)new_cap;
    }
    *best_link = best->next;
    mc_heap.region_cache_n--;
    mc_heap.region_cache_bytes -= (size_t)best->cap_pages << MC_PAGE_SHIFT;
    mc_heap.free_backed_pages -= best->pages;
    mc_heap.reserve_hits++;
    best->next = best->prev = NULL;
    best->fresh = 0;
    size_t len = best->pages;
    if (len > 8 * pages) {
      mc_os_release((void *)(best->start + (pages << MC_PAGE_SHIFT)), (len - pages) << MC_PAGE_SHIFT);
      mc_heap.released_total_pages += len - pages;
      len = pages;
    }
    best->pages = (uint32_t)(len > pages ? len : pages);
    return best;
  }
fresh:;
  mc_span_t *s = mc_meta_span_alloc();
  if (!s) return NULL;
  void *mem = mc_os_map_huge_try(new_cap << MC_PAGE_SHIFT);
  if (!mem) {
    /* before the retries: what the cache of freed regions holds goes back first */
    region_cache_unmap_all();
    mem = mc_os_map_huge(new_cap << MC_PAGE_SHIFT);
  }
  if (!mem) { mc_meta_span_free(s); return NULL; }
  s->start = (uintptr_t)mem;
  s->pages = (uint32_t)pages;
  s->cap_pages = (uint32_t)new_cap;
  s->fresh = 1;
  mc_heap.reserve_misses++;
  return s;
}

/* brings the heap's totals from a region's counted pages to `pages` */
static void region_account(mc_span_t *s, size_t pages) {
  mc_heap.used_pages += pages - s->acct_pages;
  mc_heap.used_intact_pages += pages - s->acct_pages;
  mc_heap.region_pages += pages - s->acct_pages;
  s->acct_pages = (uint32_t)pages;
}

static void region_account_new(mc_span_t *s) {
  s->kind = MC_SPAN_REGION;
  s->hp = NULL;
  s->acct_pages = 0;
  region_account(s, s->pages);
}

/* the mapping of a new large region of `pages`: twice as much (address space only), in
 * whole huge pages */
static size_t region_cap(size_t pages) {
  size_t cap = 2 * pages;
  return (cap + MC_HP_PAGES - 1) & ~(size_t)(MC_HP_PAGES - 1);
}

/* room for a growth region of `pages`: twice as much, in whole huge pages */
static size_t growth_cap(size_t pages) {
  size_t cap = 2 * pages;
  return (cap + MC_HP_PAGES - 1) & ~(size_t)(MC_HP_PAGES - 1);
}

#if MC_DEBUG >= 2
#define MC_HEAP_CHECK() do { if (!mc_heap_check_locked()) mc_fatal("page heap invariant broken near ", NULL, 0, NULL); } while (0)
#else
#define MC_HEAP_CHECK() do { } while (0)
#endif

mc_span_t *mc_heap_alloc(size_t pages, size_t kind, unsigned tag) {
  pthread_mutex_lock(&mc_heap.lock);
  mc_span_t *s;
  if (pages > MC_REGION_PAGES) {
    /* mapped with room for twice as much (address space only): a freed region then
     * serves a later block up to twice its size, faulting only the difference */
    s = region_alloc(pages, pages, SIZE_MAX, region_cap(pages));
    if (s) region_account_new(s);
  } else {
    unsigned first;
    mc_hugepage_t *hp;
    s = NULL;
    if (filler_alloc(pages, &first, &hp) != NULL) {
      s = mc_meta_span_alloc();
      if (s == NULL) {
        hp_place(hp);
      } else {
        if (hp_mark_used(hp, first, (unsigned)pages)) mc_heap.reserve_hits++;
        else mc_heap.reserve_misses++;
        hp_place(hp);
        s->start = hp->base + ((uintptr_t)first << MC_PAGE_SHIFT);
        s->pages = (uint32_t)pages;
        s->hp = hp;
        s->kind = (uint8_t)kind;
      }
    }
  }
  if (s) {
    s->kind = (uint8_t)(pages > MC_REGION_PAGES ? MC_SPAN_REGION : kind);
    if (s->kind == MC_SPAN_SMALL) {
      s->sclass = (uint8_t)(tag & 0xff);
      s->shard = (uint8_t)(tag >> 8);
    }
    if (!mc_pagemap_set_span(s)) {
      /* no metadata for the page map (refused): give the pages back */
      pthread_mutex_unlock(&mc_heap.lock);
      mc_heap_free(s);
      return NULL;
    }
    mc_release_on_heap_change_locked(mc_now_ms());
  }
  MC_HEAP_CHECK();
  /* The management thread is started by the allocation's entry point once it is done
   * (mc_mgmt_start_deferred), never from here: pthread_create callocs (the new thread's
   * DTV, 288 bytes), and inside a thread cache's refill that nested malloc refilled the
   * same class's list under the outer refill, which then counted slots it never wrote
   * (CPython with PYTHONMALLOC=malloc aborted at its 4th huge page). */
  if (mc_unlikely(mc_heap.hugepages >= MC_MGMT_AUTOSTART_HP && !mc_reserve_thread_running))
    __atomic_store_n(&mc_mgmt_start_wanted, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&mc_heap.lock);
  return s;
}

bool mc_heap_map_extra(mc_span_t *s, uintptr_t addr) {
  pthread_mutex_lock(&mc_heap.lock);
  uintptr_t page = addr & ~(uintptr_t)(MC_PAGE_SIZE - 1);
  bool ok = true;
  if (page != s->start) {
    ok = mc_pagemap_set(page, s);
    if (ok) s->map_extra = page;
  }
  pthread_mutex_unlock(&mc_heap.lock);
  return ok;
}

static void heap_free_locked(mc_span_t *s);

mc_span_t *mc_heap_growth_alloc(size_t pages) {
  pthread_mutex_lock(&mc_heap.lock);
  mc_span_t *s = NULL;
  if (mc_heap.growth_regions < MC_GROW_REGIONS_MAX && pages <= UINT32_MAX / 4) {
    size_t cap = growth_cap(pages);
    s = region_alloc(pages, 2 * pages, cap * 4, cap);
    if (s) {
      region_account_new(s);
      s->growth = 1;
      s->fresh = 0;
      mc_heap.growth_regions++;
      if (!mc_pagemap_set(s->start, s)) { /* no page map metadata: no growth region */
        heap_free_locked(s);
        s = NULL;
      }
      mc_release_on_heap_change_locked(mc_now_ms());
    }
  }
  pthread_mutex_unlock(&mc_heap.lock);
  return s;
}

/* Large blocks under the adaptive subrelease rule (ISMM'21 §4.1): a freed region stays
 * mapped, its pages resident, while the heap's mapped memory stays within the peak
 * demand of the last Delta (MEMCOLO_SKIP_SUBRELEASE_S): that demand is expected back,
 * and a region kept is reused without faulting (the random replacement of 5-25 MiB
 * buffers spent almost all its time faulting fresh mappings). Kept regions count as
 * free backed pages, so realized fragmentation and the periodic release see them; the
 * decision is a skipped release for the correctness tracker (release.c); the periodic
 * release (within the same Delta rule) and every release the agent or malloc_trim
 * demands unmap them. Without Delta, at most MC_REGION_CACHE_MAX regions of up to
 * MC_REGION_CACHE_BYTES in all are kept. */
static void region_free_locked(mc_span_t *s) {
  size_t bytes = (size_t)s->cap_pages << MC_PAGE_SHIFT;
  region_account(s, 0);
  if (s->growth) { s->growth = 0; mc_heap.growth_regions--; }
  bool keep = bytes <= MC_REGION_CACHE_BYTES / 2 && mc_heap.region_cache_n < MC_REGION_CACHE_MAX &&
              mc_heap.region_cache_bytes + bytes <= MC_REGION_CACHE_BYTES;
  if (!keep && MC_OPT(MC_OPT_SKIP_SUBRELEASE_S) > 0 && mc_heap.region_cache_n < MC_REGION_CACHE_DELTA_MAX) {
    size_t peak = mc_release_peak_used_pages_locked(mc_now_ms());
    keep = mc_heap.used_pages + mc_heap.free_backed_pages + s->pages <= peak;
    if (keep) mc_release_skipped_locked(s->pages);
  }
  if (keep) {
    s->kind = MC_SPAN_REGION;
    s->next = mc_heap.region_cache;
    mc_heap.region_cache = s;
    mc_heap.region_cache_n++;
    mc_heap.region_cache_bytes += bytes;
    mc_heap.free_backed_pages += s->pages;
    return;
  }
  mc_os_unmap((void *)s->start, bytes);
  mc_heap.released_total_pages += s->pages;
  mc_meta_span_free(s);
}

static void heap_free_locked(mc_span_t *s) {
  mc_pagemap_clear_span(s);
  s->map_extra = 0;
  if (s->kind == MC_SPAN_REGION) {
    region_free_locked(s);
  } else {
    mc_hugepage_t *hp = s->hp;
    unsigned first = (unsigned)((s->start - hp->base) >> MC_PAGE_SHIFT);
    filler_remove(hp);
    hp_mark_free(hp, first, s->pages);
    hp_place(hp);
    mc_meta_span_free(s);
  }
}

void mc_heap_free(mc_span_t *s) {
  pthread_mutex_lock(&mc_heap.lock);
  heap_free_locked(s);
  mc_release_on_heap_change_locked(mc_now_ms());
  MC_HEAP_CHECK();
  pthread_mutex_unlock(&mc_heap.lock);
}

void mc_heap_free_list(mc_span_t *list) {
  if (list == NULL) return;
  pthread_mutex_lock(&mc_heap.lock);
  while (list != NULL) {
    mc_span_t *s = list;
    list = s->next;
    s->next = NULL;
    heap_free_locked(s);
  }
  mc_release_on_heap_change_locked(mc_now_ms());
  MC_HEAP_CHECK();
  pthread_mutex_unlock(&mc_heap.lock);
}

bool mc_heap_try_grow(mc_span_t *s, size_t new_pages) {
  if (s->kind == MC_SPAN_REGION || new_pages > MC_REGION_PAGES) return false;
  bool ok = false;
  pthread_mutex_lock(&mc_heap.lock);
  mc_hugepage_t *hp = s->hp;
  unsigned first = (unsigned)((s->start - hp->base) >> MC_PAGE_SHIFT);
  unsigned end = first + s->pages, new_end = first + (unsigned)new_pages;
  if (new_end <= MC_HP_PAGES) {
    ok = true;
    for (unsigned i = end; i < new_end; i++) if (bit_get(hp->used, i)) { ok = false; break; }
    if (ok) {
      filler_remove(hp);
      hp_mark_used(hp, end, new_end - end);
      hp_place(hp);
      s->pages = (uint32_t)new_pages;
      mc_release_on_heap_change_locked(mc_now_ms());
    }
  }
  pthread_mutex_unlock(&mc_heap.lock);
  return ok;
}

void mc_heap_shrink(mc_span_t *s, size_t new_pages) {
  if (new_pages >= s->pages || new_pages == 0) return;
  pthread_mutex_lock(&mc_heap.lock);
  if (s->kind == MC_SPAN_REGION) {
    size_t cut = s->pages - new_pages;
    if (s->growth) {
      /* keep the room to grow; the cut pages go back to the OS */
      mc_os_release((void *)(s->start + (new_pages << MC_PAGE_SHIFT)), cut << MC_PAGE_SHIFT);
    } else {
      mc_os_unmap((void *)(s->start + (new_pages << MC_PAGE_SHIFT)), ((size_t)s->cap_pages - new_pages) << MC_PAGE_SHIFT);
      s->cap_pages = (uint32_t)new_pages;
    }
    region_account(s, new_pages);
    mc_heap.released_total_pages += cut;
    s->pages = (uint32_t)new_pages;
  } else {
    mc_hugepage_t *hp = s->hp;
    unsigned first = (unsigned)((s->start - hp->base) >> MC_PAGE_SHIFT);
    filler_remove(hp);
    hp_mark_free(hp, first + (unsigned)new_pages, s->pages - (unsigned)new_pages);
    hp_place(hp);
    s->pages = (uint32_t)new_pages;
  }
  mc_release_on_heap_change_locked(mc_now_ms());
  pthread_mutex_unlock(&mc_heap.lock);
}

bool mc_heap_region_grow(mc_span_t *s, size_t new_pages) {
  if (new_pages > UINT32_MAX / 4) return false;
  /* in place, lock-free: only the block's owner changes its length (the totals catch
   * up at the next locked change, and lag by at most 1 MiB or a quarter per region) */
  size_t slack = s->acct_pages / 4 > MC_REGION_PAGES ? s->acct_pages / 4 : MC_REGION_PAGES;
  if (new_pages <= s->cap_pages && new_pages <= s->acct_pages + slack) {
    s->pages = (uint32_t)new_pages;
    return true;
  }
  pthread_mutex_lock(&mc_heap.lock);
  bool ok = true;
  if (new_pages > s->cap_pages) {
    /* move the pages to a mapping with room (mremap, no copy) */
    size_t cap = growth_cap(new_pages);
    mc_pagemap_clear_span(s);
    void *q = mc_os_remap((void *)s->start, (size_t)s->cap_pages << MC_PAGE_SHIFT, cap << MC_PAGE_SHIFT);
    if (q != NULL) {
      s->start = (uintptr_t)q;
      s->cap_pages = (uint32_t)cap;
    } else {
      ok = false;
    }
    mc_pagemap_set(s->start, s);
  }
  if (ok) {
    region_account(s, new_pages);
    s->pages = (uint32_t)new_pages;
    mc_release_on_heap_change_locked(mc_now_ms());
  }
  pthread_mutex_unlock(&mc_heap.lock);
  return ok;
}

/* ------------------------------------------------------------ release */
static size_t subrelease_hp(mc_hugepage_t *hp, size_t want_pages) {
  size_t done = 0;
  unsigned i = 0;
  while (i < MC_HP_PAGES && done < want_pages) {
    if (bit_get(hp->used, i) || bit_get(hp->released, i)) { i++; continue; }
    unsigned j = i;
    while (j < MC_HP_PAGES && !bit_get(hp->used, j) && !bit_get(hp->released, j) && done + (j - i) < want_pages) j++;
    mc_os_release((void *)(hp->base + ((uintptr_t)i << MC_PAGE_SHIFT)), (size_t)(j - i) << MC_PAGE_SHIFT);
    for (unsigned k = i; k < j; k++) bit_set(hp->released, k);
    hp->released_pages = (uint16_t)(hp->released_pages + (j - i));
    done += j - i;
    i = j;
  }
  if (done) {
    mc_heap.free_backed_pages -= done;
    mc_heap.released_pages += done;
    mc_heap.released_total_pages += done;
    mc_heap.subreleased_pages += done;
    if (!hp->broken) {
      hp->broken = 1;
      mc_heap.hugepages_broken++;
      mc_heap.used_intact_pages -= hp->used_pages;
    }
    hp_lose_thp(hp);
  }
  return done;
}

/* Periodic release never breaks an intact huge page for fewer than this many free
 * pages (1/8 of it). Breaking one takes all its used pages off huge page coverage, and
 * at the peak of a fluctuating service (mapped == used plus a few scattered free pages,
 * which Delta cannot protect: they are above the peak) the 10 MiB/s release broke dozens
 * of nearly full huge pages per second to return a few pages of each: coverage fell
 * from 97.8 % to 81.7 % within 2 s while used and mapped stayed the same (bench/alloc
 * subrelease, Delta = 60 s and 0 alike). Releases demanded by memory pressure take
 * every free page. */
#define MC_SUBRELEASE_MIN_INTACT_PAGES (MC_HP_PAGES / 8)

static size_t heap_release(size_t bytes, bool cache_only, size_t protect_cache_bytes, unsigned min_intact_free);

size_t mc_heap_release_locked(size_t bytes, bool cache_only, size_t protect_cache_bytes) {
  return heap_release(bytes, cache_only, protect_cache_bytes, 0);
}

size_t mc_heap_release_periodic_locked(size_t bytes, size_t protect_cache_bytes) {
  return heap_release(bytes, false, protect_cache_bytes, MC_SUBRELEASE_MIN_INTACT_PAGES);
}

static size_t heap_release(size_t bytes, bool cache_only, size_t protect_cache_bytes, unsigned min_intact_free) {
  size_t protect_hp = (protect_cache_bytes + MC_HUGE_SIZE - 1) / MC_HUGE_SIZE;
  size_t want = (bytes + MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT, done = 0;
  if (bytes == 0) want = SIZE_MAX;
  while (done < want && mc_heap.region_cache) {
    mc_span_t *r = mc_heap.region_cache;
    mc_heap.region_cache = r->next;
    mc_heap.region_cache_n--;
    mc_heap.region_cache_bytes -= (size_t)r->cap_pages << MC_PAGE_SHIFT;
    mc_heap.free_backed_pages -= r->pages;
    mc_heap.released_total_pages += r->pages;
    done += r->pages;
    mc_os_unmap((void *)r->start, (size_t)r->cap_pages << MC_PAGE_SHIFT);
    mc_meta_span_free(r);
  }
  for (mc_hugepage_t *next_hp = mc_heap.cache_backed.head; done < want && next_hp && mc_heap.cache_backed_n > protect_hp;) {
    mc_hugepage_t *hp = next_hp;
    next_hp = hp->next;
    if (hp->collapsing) continue;
    cache_remove(hp);
    size_t backed = MC_HP_PAGES - hp->released_pages;
    hp_release_whole(hp);
    done += backed;
    cache_insert(hp);
  }
  if (!cache_only) {
    /* subrelease from the emptiest huge pages first: broken ones, then intact */
    for (int pass = 0; pass < 2 && done < want; pass++) {
      mc_hplist_t *bins = pass == 0 ? mc_heap.filler_broken : mc_heap.filler;
      for (int b = MC_HP_PAGES; b >= 1 && done < want; b--) {
        mc_hugepage_t *hp = bins[b].head;
        while (hp && done < want) {
          mc_hugepage_t *next = hp->next;
          unsigned free_backed = MC_HP_PAGES - hp->used_pages - hp->released_pages;
          if (free_backed > 0 && !hp->collapsing && (hp->broken || free_backed >= min_intact_free)) {
            filler_remove(hp);
            done += subrelease_hp(hp, want - done);
            hp_place(hp);
          }
          hp = next;
        }
      }
    }
  }
  return done << MC_PAGE_SHIFT;
}

size_t mc_heap_backed_free_bytes(void) {
  return __atomic_load_n(&mc_heap.free_backed_pages, __ATOMIC_RELAXED) << MC_PAGE_SHIFT;
}

/* Reservation (Hermes Algorithm 1, line 10-16): makes one more huge page of the cache
 * backed, pre-faulting it outside the lock so that allocations never wait for it.
 * Returns false when no memory could be added. Takes the lock. */
bool mc_heap_prefault_one_hugepage(void) {
  pthread_mutex_lock(&mc_heap.lock);
  mc_hugepage_t *hp = mc_heap.cache_released.head;
  if (hp) cache_remove(hp);
  else hp = hp_new_from_os(); /* carved from the address space mapped ahead: no syscall */
  if (hp) hp->where = MC_HP_BUSY;
  pthread_mutex_unlock(&mc_heap.lock);
  if (hp == NULL) return false;
  /* fault it with no lock held */
  mc_os_populate((void *)hp->base, MC_HUGE_SIZE);
  pthread_mutex_lock(&mc_heap.lock);
  mc_heap.released_pages -= hp->released_pages;
  mc_heap.free_backed_pages += hp->released_pages;
  memset(hp->released, 0, sizeof(hp->released));
  hp->released_pages = 0;
  hp->where = MC_HP_CACHE;
  list_push(&mc_heap.cache_backed, hp);
  mc_heap.cache_backed_n++;
  pthread_mutex_unlock(&mc_heap.lock);
  return true;
}

/* ------------------------------------------------------------ background THP */
/* A candidate: with in_use, an intact huge page of the filler, not yet a THP, at least
 * half used, seen dense by the previous pass too (so short-lived spikes are not
 * collapsed); with with_cache, also a fully backed free huge page of the cache (the
 * reservation's pre-faulted pages). */
static mc_hugepage_t *collapse_candidate(bool in_use, bool with_cache) {
  for (unsigned b = 0; in_use && b <= MC_HP_PAGES; b++) {
    for (mc_hugepage_t *hp = mc_heap.filler[b].head; hp; hp = hp->next) {
      if (hp->thp || hp->collapsing || hp->used_pages < MC_HP_PAGES / 2) continue;
      if (!hp->dense_seen) { hp->dense_seen = 1; continue; }
      return hp;
    }
  }
  if (with_cache) {
    for (mc_hugepage_t *hp = mc_heap.cache_backed.head; hp; hp = hp->next) {
      if (!hp->thp && !hp->collapsing && hp->released_pages == 0) return hp;
    }
  }
  return NULL;
}

unsigned mc_heap_collapse_pass(uint64_t budget_us, bool in_use, bool with_cache) {
  if (!mc_os_thp_background()) return 0;
  uint64_t t0 = mc_now_us();
  unsigned done = 0, tries = 0;
  while (tries++ < 64 && mc_now_us() - t0 < budget_us) {
    pthread_mutex_lock(&mc_heap.lock);
    mc_hugepage_t *hp = collapse_candidate(in_use, with_cache);
    if (hp) hp->collapsing = 1;
    pthread_mutex_unlock(&mc_heap.lock);
    if (hp == NULL) break;
    /* only memory already resident: a collapse must not raise RSS by more than 1/8 */
    bool ok = mc_os_resident_pages((void *)hp->base) >= MC_HP_PAGES - MC_HP_PAGES / 8 &&
              mc_os_collapse((void *)hp->base);
    pthread_mutex_lock(&mc_heap.lock);
    hp->collapsing = 0;
    hp->dense_seen = 0;
    if (ok && !hp->broken && !hp->thp) {
      bool in_cache = hp->where == MC_HP_CACHE;
      if (in_cache) cache_remove(hp);
      /* the collapse backed every page of the range */
      size_t rel = hp->released_pages;
      memset(hp->released, 0, sizeof(hp->released));
      hp->released_pages = 0;
      mc_heap.released_pages -= rel;
      mc_heap.free_backed_pages += rel;
      hp->thp = 1;
      mc_heap.hugepages_thp++;
      mc_heap.used_thp_pages += hp->used_pages;
      if (in_cache) cache_insert(hp);
      done++;
    } else if (hp->where == MC_HP_CACHE && hp->used_pages == 0) {
      /* emptied meanwhile, its release was deferred: let the cache limit apply */
      cache_remove(hp);
      cache_insert(hp);
    }
    pthread_mutex_unlock(&mc_heap.lock);
  }
  return done;
}

void mc_heap_stats_locked(memcolo_stats_t *st) {
  st->used_bytes = (uint64_t)mc_heap.used_pages << MC_PAGE_SHIFT;
  st->free_backed_bytes = (uint64_t)mc_heap.free_backed_pages << MC_PAGE_SHIFT;
  st->mapped_bytes = st->used_bytes + st->free_backed_bytes;
  st->released_bytes = (uint64_t)mc_heap.released_pages << MC_PAGE_SHIFT;
  st->hugepages_total = mc_heap.hugepages;
  st->hugepages_broken = mc_heap.hugepages_broken;
  st->hugepage_coverage = mc_heap.used_pages ? (double)mc_heap.used_intact_pages / (double)mc_heap.used_pages : 1.0;
  st->hugepages_thp = mc_os_thp_at_fault() ? mc_heap.hugepages - mc_heap.hugepages_broken : mc_heap.hugepages_thp;
  size_t filler_used = mc_heap.used_pages - mc_heap.region_pages;
  size_t thp_used = mc_os_thp_at_fault() ? mc_heap.used_intact_pages - mc_heap.region_pages : mc_heap.used_thp_pages;
  st->thp_coverage = filler_used ? (double)thp_used / (double)filler_used : 0.0;
  st->released_total_bytes = mc_heap.released_total_pages << MC_PAGE_SHIFT;
  st->subreleased_bytes = mc_heap.subreleased_pages << MC_PAGE_SHIFT;
  st->average_fragmentation_bytes = st->free_backed_bytes;
  st->reserve_hits = mc_heap.reserve_hits;
  st->reserve_misses = mc_heap.reserve_misses;
  st->os_mmap_calls = mc_heap.os_mmap_calls;
}

/* Invariant checker (debug builds): recounts every huge page's bitmaps and the heap's
 * totals. Returns false (after printing what differs) on any mismatch. */
static size_t popcount_bits(const uint64_t *b) {
  size_t n = 0;
  for (unsigned w = 0; w < MC_HP_PAGES / 64; w++) n += (size_t)__builtin_popcountll(b[w]);
  return n;
}

static size_t chk_thp, chk_thp_used;
static bool check_hp(const mc_hugepage_t *hp, size_t *used, size_t *free_backed, size_t *released, size_t *intact) {
  if (hp->thp) { chk_thp++; chk_thp_used += hp->used_pages; }
  if (hp->thp && hp->broken) { mc_warn("invariant: a broken huge page is marked THP"); return false; }
  if (popcount_bits(hp->used) != hp->used_pages || popcount_bits(hp->released) != hp->released_pages) {
    mc_warn("invariant: huge page counters differ from its bitmaps");
    return false;
  }
  for (unsigned w = 0; w < MC_HP_PAGES / 64; w++) {
    if (hp->used[w] & hp->released[w]) { mc_warn("invariant: a used page is marked released"); return false; }
  }
  unsigned nlongest;
  if (hp->longest_free != hp_longest_free(hp, &nlongest) || (hp->longest_free && hp->longest_count != nlongest)) {
    mc_warn("invariant: a huge page's longest free run is stale");
    return false;
  }
  *used += hp->used_pages;
  *released += hp->released_pages;
  *free_backed += MC_HP_PAGES - hp->used_pages - hp->released_pages;
  if (!hp->broken) *intact += hp->used_pages;
  return true;
}

bool mc_heap_check_locked(void) {
  size_t used = 0, fb = 0, rel = 0, intact = 0, nbroken = 0;
  chk_thp = chk_thp_used = 0;
  for (unsigned b = 0; b <= MC_HP_PAGES; b++) {
    for (int pass = 0; pass < 2; pass++) {
      for (mc_hugepage_t *hp = (pass ? mc_heap.filler_broken : mc_heap.filler)[b].head; hp; hp = hp->next) {
        if (!check_hp(hp, &used, &fb, &rel, &intact)) return false;
        if (hp->longest_free != b || hp->used_pages == 0 || (unsigned)hp->broken != (unsigned)pass) {
          mc_warn("invariant: huge page in the wrong filler bin");
          return false;
        }
        nbroken += hp->broken;
      }
    }
  }
  for (int pass = 0; pass < 2; pass++) {
    for (mc_hugepage_t *hp = (pass ? mc_heap.cache_released : mc_heap.cache_backed).head; hp; hp = hp->next) {
      if (!check_hp(hp, &used, &fb, &rel, &intact)) return false;
      if (hp->used_pages != 0) { mc_warn("invariant: cached huge page has used pages"); return false; }
      nbroken += hp->broken;
    }
  }
  for (mc_span_t *r = mc_heap.region_cache; r; r = r->next) fb += r->pages;
  used += mc_heap.region_pages;
  intact += mc_heap.region_pages;
  /* huge pages being pre-faulted (BUSY) are counted as released */
  if (used != mc_heap.used_pages || fb != mc_heap.free_backed_pages || rel > mc_heap.released_pages ||
      intact != mc_heap.used_intact_pages || nbroken != mc_heap.hugepages_broken ||
      chk_thp != mc_heap.hugepages_thp || chk_thp_used != mc_heap.used_thp_pages) {
    mc_warn("invariant: page heap totals differ from the sum over huge pages");
    return false;
  }
  return true;
}
