/* release.c — adaptive huge-page subrelease (TCMalloc, ISMM'21 §3-4) for the process:
 * the decisions (epoch series, realized fragmentation over T_schedule, the periodic
 * release under the peak of Delta = MEMCOLO_SKIP_SUBRELEASE_S at MEMCOLO_RELEASE_RATE
 * bytes/s, the skipped-release tracker) are subrelease.c's on one process-wide
 * mc_subrelease_t, fed with mc_heap's used and free-but-mapped pages; this file carries
 * the releases out on the page heap and keeps the clocks (mc_now_*).
 * All under mc_heap.lock. */
#include <time.h>

#include "internal.h"
/* The decisions are compiled into this file (one translation unit, so the calls at
 * every page heap change inline as they did before the split); memcolo-sim compiles
 * subrelease.c on its own. */
#include "subrelease.c"

_Static_assert(MC_SR_PAGE_SHIFT == MC_PAGE_SHIFT, "subrelease.c counts the page heap's pages");

/* The one instance of the process: settings copied in from MEMCOLO_* before each use. */
static mc_subrelease_t mc_sr;

static inline mc_subrelease_t *sr(void) {
  mc_sr.skip_subrelease_s = (uint64_t)MC_OPT(MC_OPT_SKIP_SUBRELEASE_S);
  mc_sr.t_schedule_s = (uint64_t)MC_OPT(MC_OPT_T_SCHEDULE_S);
  long rate = MC_OPT(MC_OPT_RELEASE_RATE_BYTES);
  mc_sr.release_rate_bytes = rate > 0 ? (uint64_t)rate : 0;
  return &mc_sr;
}

uint64_t mc_fake_now_ms;

uint64_t mc_now_ms(void) {
  if (mc_unlikely(mc_fake_now_ms != 0)) return mc_fake_now_ms;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t mc_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t mc_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

extern volatile int mc_reserve_thread_running;

void mc_release_on_heap_change_locked(uint64_t now_ms) {
  mc_sr_record(sr(), now_ms, mc_heap.used_pages, mc_heap.free_backed_pages);
  if (!mc_reserve_thread_running && mc_sr_since_release_ms(&mc_sr, now_ms) >= 1000)
    mc_release_tick_locked(now_ms, 0);
}

/* The peak of used pages over the current and the previous 1 s epoch: demand that
 * went away this recently is likely to come back (the huge page cache keeps it). */
size_t mc_release_recent_peak_used_locked(void) {
  return mc_sr_recent_peak_used(&mc_sr, mc_heap.used_pages);
}

size_t mc_release_peak_used_pages_locked(uint64_t now_ms) {
  return mc_sr_peak_used(sr(), now_ms, mc_heap.used_pages, mc_heap.free_backed_pages);
}

void mc_release_tick_locked(uint64_t now_ms, size_t protect_bytes) {
  size_t pages;
  if (!mc_sr_release_budget(sr(), now_ms, mc_heap.used_pages, mc_heap.free_backed_pages,
                            protect_bytes >> MC_PAGE_SHIFT, &pages))
    return;
  if (pages) mc_heap_release_periodic_locked(pages << MC_PAGE_SHIFT, protect_bytes);
  mc_sr_note(&mc_sr, mc_heap.used_pages, mc_heap.free_backed_pages);
}

/* A release skipped outside the periodic release (a freed large block kept mapped under
 * the peak of Delta, pageheap.c): tracked like the periodic release's own (§4.2). */
void mc_release_skipped_locked(size_t pages) {
  mc_sr_skipped(sr(), mc_now_ms(), mc_heap.used_pages, mc_heap.free_backed_pages, pages);
}

void mc_release_stats_locked(memcolo_stats_t *st) {
  mc_sr_stats_t s;
  mc_sr_stats(sr(), mc_now_ms(), mc_heap.used_pages, mc_heap.free_backed_pages, &s);
  st->realized_fragmentation_bytes = (uint64_t)s.realized_fragmentation_pages << MC_PAGE_SHIFT;
  st->skipped_subrelease_bytes = s.skipped_pages << MC_PAGE_SHIFT;
  st->skipped_correct_bytes = s.correct_pages << MC_PAGE_SHIFT;
  st->skipped_incorrect_bytes = s.incorrect_pages << MC_PAGE_SHIFT;
}

void mc_release_test_reset_locked(void) { mc_sr_reset(&mc_sr); }
