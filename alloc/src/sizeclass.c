/* sizeclass.c — size classes: 16..128 B in steps of 16, then four classes per
 * doubling up to 32 KiB (the mimalloc/TCMalloc spacing; internal waste <= 25 %).
 * free's check that a pointer is an object's start uses mc_class_check (an exact
 * divisibility test by one multiply, and the end of the span's objects).
 * Each class has a span length in pages (>= 8 objects; classes up to 128 B
 * MC_SPAN_MAX_OBJECTS objects so that a thread turns fewer spans through the page heap,
 * up to 1 KiB two pages; tail waste <= 1/8 of the span), a batch size for moves between
 * thread caches and the central lists (TCMalloc num_objects_to_move: 16 KiB worth,
 * 2..64 objects), the capacity of its thread cache array (a quarter of MEMCOLO_TCACHE's
 * bytes, 2 batches .. 512 objects up to 128 B, 256 above) and the reciprocal that turns
 * an offset into an object index. Span length, batch and capacity trade speed for
 * peak RSS: memory parked in lists and half-used spans is resident. */
#include "internal.h"

#ifndef MC_BATCH_BYTES
#define MC_BATCH_BYTES 16384 /* a batch between thread caches and central lists: this much */
#endif

uint32_t mc_class_size[MC_CLASSES];
uint32_t mc_class_recip[MC_CLASSES];
uint16_t mc_class_pages[MC_CLASSES];
uint16_t mc_class_batch[MC_CLASSES];
uint16_t mc_class_tcap[MC_CLASSES];
uint8_t mc_class_small_idx[(1024 >> 4) + 1];
mc_class_check_t mc_class_check[MC_CLASSES];
uint8_t mc_class_large_idx[(MC_SMALL_MAX >> 7) + 1];

void mc_sizeclass_init(void) {
  unsigned c = 1;
  for (uint32_t sz = 16; sz <= 128; sz += 16) mc_class_size[c++] = sz;
  for (uint32_t base = 128; base < MC_SMALL_MAX; base *= 2) {
    for (uint32_t k = 1; k <= 4; k++) mc_class_size[c++] = base + k * (base / 4);
  }
  /* c == MC_CLASSES here: 8 + 4*8 = 40 classes */
  for (unsigned i = 1; i < MC_CLASSES; i++) {
    uint32_t sz = mc_class_size[i];
    size_t pages = (sz * 8 + MC_PAGE_SIZE - 1) / MC_PAGE_SIZE;
    if (pages < 1) pages = 1;
    if (sz <= 1024) {
      /* fewer span turns for the smallest objects (MC_SPAN_MAX_OBJECTS objects, up to
       * 32 KiB), two pages for the others: a class being filled and drained at once
       * holds about one span of slack per shard, which is peak RSS */
      size_t want = sz <= 128 ? (size_t)MC_SPAN_MAX_OBJECTS * sz / MC_PAGE_SIZE : 2;
      if (want > pages) pages = want;
    }
    while (((pages * MC_PAGE_SIZE) % sz) > (pages * MC_PAGE_SIZE) / 8) pages++;
    mc_class_pages[i] = (uint16_t)pages;
    mc_class_recip[i] = (uint32_t)((((uint64_t)1 << 32) + sz - 1) / sz);
    /* the page map entry holds a page's index in its span in 8 bits */
    if (pages > 255) mc_fatal("size class span too long for the page map ", NULL, (long)i, "at most 255 pages");
    mc_class_check[i].magic = UINT64_MAX / sz + 1;
    mc_class_check[i].end = (uint32_t)((pages * MC_PAGE_SIZE) / sz * sz);
    uint32_t batch = (uint32_t)(MC_BATCH_BYTES / sz);
    if (batch < 2) batch = 2;
    if (batch > 64) batch = 64;
    mc_class_batch[i] = (uint16_t)batch;
    size_t cap = (size_t)MC_OPT(MC_OPT_TCACHE_BYTES) / 4 / sz;
    if (cap > (sz <= 128 ? 512u : 256u)) cap = sz <= 128 ? 512 : 256; /* slot arrays of 4 / 2 KiB */
    if (cap < 2 * (size_t)batch) cap = 2 * (size_t)batch;
    mc_class_tcap[i] = (uint16_t)cap;
  }
  unsigned cls = 1;
  for (size_t i = 0; i <= (1024 >> 4); i++) {
    size_t sz = i << 4;
    while (mc_class_size[cls] < sz) cls++;
    mc_class_small_idx[i] = (uint8_t)cls;
  }
  cls = 1;
  for (size_t i = 0; i <= (MC_SMALL_MAX >> 7); i++) {
    size_t sz = i << 7;
    while (mc_class_size[cls] < sz) cls++;
    mc_class_large_idx[i] = (uint8_t)cls;
  }
}
