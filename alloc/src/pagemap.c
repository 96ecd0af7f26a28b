/* pagemap.c — the page map from 4 KiB page number to span (two-level radix over the
 * 48-bit address space: 2^18 roots of 2^18 entries; a 2 MiB leaf is mapped on first
 * use and only its touched pages become resident), and the metadata free lists of span
 * and huge page descriptors. An entry is the span's address (64-byte aligned) with the
 * size class in bits 0-5 for small spans (0 otherwise), the span's shard in bits
 * 48-55 and the page's index in its span in bits 56-63, so that free() learns the
 * class, the shard and the pointer's offset in its span without reading the span.
 * Each leaf comes with its part of the live map (internal.h), in the same mapping
 * after the entries, zero at first: no object of a new span is held by the program.
 * Small spans have every page in the map (objects lie anywhere in them); large blocks
 * have their first page and, for aligned blocks, the page of the returned pointer. All
 * writers hold the heap lock; readers (free) read entries of spans they own. */
#include <string.h>

#include "internal.h"

uintptr_t *mc_pagemap_root[1 << 18];

bool mc_pagemap_set(uintptr_t page_addr, mc_span_t *s) {
  uintptr_t a = page_addr >> MC_PAGE_SHIFT;
  if (a >> 36) return false;
  uintptr_t *leaf = mc_pagemap_root[a >> 18];
  if (leaf == NULL) {
    if (s == NULL) return true;
    /* the entries and, right after them, the leaf's live map (internal.h) */
    leaf = (uintptr_t *)mc_os_meta_alloc(MC_PM_LEAF_BYTES + MC_LIVEMAP_BYTES);
    if (leaf == NULL) return false;
    __atomic_store_n(&mc_pagemap_root[a >> 18], leaf, __ATOMIC_RELEASE);
  }
  uintptr_t e = 0;
  if (s != NULL) {
    e = (uintptr_t)s;
    if (s->kind == MC_SPAN_SMALL) {
      e |= (uintptr_t)s->sclass | ((uintptr_t)s->shard << MC_PM_SHARD_SHIFT) |
           (((page_addr - s->start) >> MC_PAGE_SHIFT) << MC_PM_PAGE_SHIFT);
    }
  }
  __atomic_store_n(&leaf[a & ((1u << 18) - 1)], e, __ATOMIC_RELEASE);
  return true;
}

bool mc_pagemap_set_span(mc_span_t *s) {
  if (s->kind == MC_SPAN_SMALL) {
    for (uint32_t i = 0; i < s->pages; i++) {
      if (!mc_pagemap_set(s->start + ((uintptr_t)i << MC_PAGE_SHIFT), s)) return false;
    }
    return true;
  }
  if (!mc_pagemap_set(s->start, s)) return false;
  if (s->map_extra && !mc_pagemap_set(s->map_extra, s)) return false;
  return true;
}

void mc_pagemap_clear_span(mc_span_t *s) {
  if (s->kind == MC_SPAN_SMALL) {
    for (uint32_t i = 0; i < s->pages; i++) mc_pagemap_set(s->start + ((uintptr_t)i << MC_PAGE_SHIFT), NULL);
    return;
  }
  mc_pagemap_set(s->start, NULL);
  if (s->map_extra) mc_pagemap_set(s->map_extra, NULL);
}

static mc_span_t *mc_span_freelist;
static mc_hugepage_t *mc_hp_freelist;

mc_span_t *mc_meta_span_alloc(void) {
  mc_span_t *s = mc_span_freelist;
  if (s != NULL) {
    mc_span_freelist = s->next;
  } else {
    s = (mc_span_t *)mc_os_meta_alloc(sizeof(mc_span_t));
    if (s == NULL) return NULL;
  }
  memset(s, 0, sizeof(*s));
  return s;
}

void mc_meta_span_free(mc_span_t *s) {
  s->kind = MC_SPAN_FREE;
  s->next = mc_span_freelist;
  mc_span_freelist = s;
}

void mc_meta_hp_free(mc_hugepage_t *h) {
  h->next = mc_hp_freelist;
  mc_hp_freelist = h;
}

mc_hugepage_t *mc_meta_hp_alloc(void) {
  mc_hugepage_t *h = mc_hp_freelist;
  if (h != NULL) {
    mc_hp_freelist = h->next;
    memset(h, 0, sizeof(*h));
    return h;
  }
  return (mc_hugepage_t *)mc_os_meta_alloc(sizeof(mc_hugepage_t));
}
