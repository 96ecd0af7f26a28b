/* release.c — adaptive huge-page subrelease (TCMalloc, ISMM'21 §3-4).
 *   - Time series of 1 s epochs; each records the minimum and maximum of used and of
 *     free-but-mapped pages seen at page heap changes (constant time, §3.3).
 *   - Realized fragmentation: the minimum free-and-mapped memory over the last
 *     T_schedule (§3.2).
 *   - Periodic release at MEMCOLO_RELEASE_RATE bytes/s that never takes mapped memory
 *     below the peak demand of the last Delta = MEMCOLO_SKIP_SUBRELEASE_S (§4.1).
 *   - Correctness of skipped releases (§4.2): each epoch keeps the pages it did not
 *     release and the demand at that time; a later epoch whose peak demand exceeds it
 *     within Delta confirms them (partially), and what is left when the decision falls
 *     out of Delta counts as incorrect.
 * All under mc_heap.lock. */
#include <time.h>

#include "internal.h"

#define MC_EPOCHS 1024 /* >= T_schedule and Delta, in seconds (both capped at 900) */

typedef struct {
  size_t min_used, max_used, min_free, max_free; /* pages */
  size_t skipped_pending, decision_used;         /* pages */
} mc_epoch_t;

static mc_epoch_t mc_ring[MC_EPOCHS];
static uint64_t mc_epoch_cur;   /* seconds since mc_epoch_base */
static uint64_t mc_epoch_base_ms, mc_epoch_count;
static uint64_t mc_last_release_ms;
static uint64_t mc_release_carry_bytes;
static uint64_t mc_skipped_pages, mc_correct_pages, mc_incorrect_pages;
static size_t mc_rec_used, mc_rec_free; /* pages, as last recorded (epoch_record) */

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

static inline mc_epoch_t *epoch_at(uint64_t e) { return &mc_ring[e % MC_EPOCHS]; }

/* closes epoch `closing`: confirms earlier skipped releases against its peak */
static void tracker_close_epoch(uint64_t closing) {
  uint64_t delta = (uint64_t)MC_OPT(MC_OPT_SKIP_SUBRELEASE_S);
  size_t peak = epoch_at(closing)->max_used;
  uint64_t lo = closing > delta ? closing - delta : 0;
  if (closing >= delta && delta > 0) {
    mc_epoch_t *old = epoch_at(closing - delta);
    if (old->skipped_pending) { mc_incorrect_pages += old->skipped_pending; old->skipped_pending = 0; }
    lo++;
  }
  for (uint64_t e = lo; e < closing; e++) {
    mc_epoch_t *ep = epoch_at(e);
    if (ep->skipped_pending && peak > ep->decision_used) {
      size_t ok = peak - ep->decision_used;
      if (ok > ep->skipped_pending) ok = ep->skipped_pending;
      ep->skipped_pending -= ok;
      mc_correct_pages += ok;
    }
  }
}

static void epoch_advance(uint64_t now_ms) {
  if (mc_epoch_base_ms == 0) {
    mc_epoch_base_ms = now_ms ? now_ms : 1;
    mc_last_release_ms = now_ms;
    mc_epoch_t *ep = epoch_at(0);
    ep->min_used = ep->max_used = mc_heap.used_pages;
    ep->min_free = ep->max_free = mc_heap.free_backed_pages;
    mc_rec_used = mc_heap.used_pages;
    mc_rec_free = mc_heap.free_backed_pages;
    mc_epoch_count = 1;
    return;
  }
  uint64_t e = (now_ms - mc_epoch_base_ms) / 1000u;
  if (e <= mc_epoch_cur) return;
  uint64_t from = mc_epoch_cur;
  if (e - from > MC_EPOCHS) from = e - MC_EPOCHS;
  /* The epochs that begin now start from the state that lasted across their boundary:
   * the one last recorded. A change calls in here after it is made, so the current
   * state alone would start the new epoch after the change and lose the state it
   * replaced (a free at 1.2 s made epoch 1's minimum the memory free after it). Changes
   * that are not recorded (releases outside mc_release_on_heap_change_locked) are
   * covered by taking the current state too. */
  size_t u0 = mc_heap.used_pages, f0 = mc_heap.free_backed_pages;
  size_t umin = u0 < mc_rec_used ? u0 : mc_rec_used, umax = u0 > mc_rec_used ? u0 : mc_rec_used;
  size_t fmin = f0 < mc_rec_free ? f0 : mc_rec_free, fmax = f0 > mc_rec_free ? f0 : mc_rec_free;
  for (uint64_t k = from; k < e; k++) {
    if (k >= mc_epoch_cur) tracker_close_epoch(k);
    mc_epoch_t *n = epoch_at(k + 1);
    n->min_used = umin;
    n->max_used = umax;
    n->min_free = fmin;
    n->max_free = fmax;
    n->skipped_pending = 0;
    n->decision_used = 0;
  }
  mc_epoch_count += e - mc_epoch_cur;
  mc_epoch_cur = e;
}

static void epoch_record(void) {
  mc_epoch_t *ep = epoch_at(mc_epoch_cur);
  size_t u = mc_heap.used_pages, f = mc_heap.free_backed_pages;
  if (u < ep->min_used) ep->min_used = u;
  if (u > ep->max_used) ep->max_used = u;
  if (f < ep->min_free) ep->min_free = f;
  if (f > ep->max_free) ep->max_free = f;
  mc_rec_used = u;
  mc_rec_free = f;
}

extern volatile int mc_reserve_thread_running;

void mc_release_on_heap_change_locked(uint64_t now_ms) {
  epoch_advance(now_ms);
  epoch_record();
  if (!mc_reserve_thread_running && now_ms - mc_last_release_ms >= 1000) mc_release_tick_locked(now_ms, 0);
}

/* The peak of used pages over the current and the previous 1 s epoch: demand that
 * went away this recently is likely to come back (the huge page cache keeps it). */
size_t mc_release_recent_peak_used_locked(void) {
  size_t peak = mc_heap.used_pages;
  if (mc_epoch_count == 0) return peak;
  size_t m = epoch_at(mc_epoch_cur)->max_used;
  if (m > peak) peak = m;
  if (mc_epoch_cur > 0) {
    m = epoch_at(mc_epoch_cur - 1)->max_used;
    if (m > peak) peak = m;
  }
  return peak;
}

size_t mc_release_peak_used_pages_locked(uint64_t now_ms) {
  epoch_advance(now_ms);
  uint64_t delta = (uint64_t)MC_OPT(MC_OPT_SKIP_SUBRELEASE_S);
  size_t peak = mc_heap.used_pages;
  uint64_t n = delta < mc_epoch_count ? delta : mc_epoch_count;
  for (uint64_t i = 0; i < n && i <= mc_epoch_cur; i++) {
    size_t m = epoch_at(mc_epoch_cur - i)->max_used;
    if (m > peak) peak = m;
  }
  return peak;
}

void mc_release_tick_locked(uint64_t now_ms, size_t protect_bytes) {
  epoch_advance(now_ms);
  uint64_t dt = now_ms - mc_last_release_ms;
  mc_last_release_ms = now_ms;
  long rate = MC_OPT(MC_OPT_RELEASE_RATE_BYTES);
  if (rate <= 0) return;
  mc_release_carry_bytes += (uint64_t)rate * dt / 1000u;
  size_t want = (size_t)(mc_release_carry_bytes >> MC_PAGE_SHIFT);
  size_t free_pages = mc_heap.free_backed_pages;
  if (want > free_pages) { want = free_pages; mc_release_carry_bytes = (uint64_t)want << MC_PAGE_SHIFT; }
  if (want == 0) return;
  size_t allowed = free_pages;
  if (MC_OPT(MC_OPT_SKIP_SUBRELEASE_S) > 0) {
    size_t peak = mc_release_peak_used_pages_locked(now_ms);
    size_t mapped = mc_heap.used_pages + free_pages;
    allowed = mapped > peak ? mapped - peak : 0;
  }
  size_t protect = protect_bytes >> MC_PAGE_SHIFT;
  allowed = allowed > protect ? allowed - protect : 0;
  size_t doit = want < allowed ? want : allowed;
  if (doit < want && MC_OPT(MC_OPT_SKIP_SUBRELEASE_S) > 0) {
    size_t skipped = want - doit;
    mc_skipped_pages += skipped;
    mc_epoch_t *ep = epoch_at(mc_epoch_cur);
    ep->skipped_pending += skipped;
    ep->decision_used = mc_heap.used_pages;
  }
  size_t done = doit ? mc_heap_release_periodic_locked(doit << MC_PAGE_SHIFT, protect_bytes) : 0;
  /* skipped or done, the budget of this period is spent */
  (void)done;
  mc_release_carry_bytes = 0;
  epoch_record();
}

/* A release skipped outside the periodic release (a freed large block kept mapped under
 * the peak of Delta, pageheap.c): tracked like the periodic release's own (§4.2). */
void mc_release_skipped_locked(size_t pages) {
  epoch_advance(mc_now_ms());
  mc_skipped_pages += pages;
  mc_epoch_t *ep = epoch_at(mc_epoch_cur);
  ep->skipped_pending += pages;
  ep->decision_used = mc_heap.used_pages;
}

void mc_release_stats_locked(memcolo_stats_t *st) {
  epoch_advance(mc_now_ms());
  uint64_t window = (uint64_t)MC_OPT(MC_OPT_T_SCHEDULE_S);
  uint64_t n = window < mc_epoch_count ? window : mc_epoch_count;
  size_t minf = mc_heap.free_backed_pages;
  for (uint64_t i = 0; i < n && i <= mc_epoch_cur; i++) {
    size_t f = epoch_at(mc_epoch_cur - i)->min_free;
    if (f < minf) minf = f;
  }
  st->realized_fragmentation_bytes = (uint64_t)minf << MC_PAGE_SHIFT;
  st->skipped_subrelease_bytes = mc_skipped_pages << MC_PAGE_SHIFT;
  st->skipped_correct_bytes = mc_correct_pages << MC_PAGE_SHIFT;
  st->skipped_incorrect_bytes = mc_incorrect_pages << MC_PAGE_SHIFT;
}

void mc_release_test_reset_locked(void) {
  mc_epoch_base_ms = 0;
  mc_epoch_cur = 0;
  mc_epoch_count = 0;
  mc_skipped_pages = mc_correct_pages = mc_incorrect_pages = 0;
  mc_release_carry_bytes = 0;
  for (unsigned i = 0; i < MC_EPOCHS; i++) mc_ring[i].skipped_pending = 0; /* decisions made before */
}
