/* subrelease.c — TCMalloc's adaptive huge-page subrelease decisions (ISMM'21 §3-4) on
 * a state passed by pointer; see subrelease.h. Plain C11, no dependency beyond the C
 * headers: compiled into libmemcolo and, unchanged, into memcolo-sim (build.rs). */
#include "subrelease.h"

#include <string.h>

static inline mc_sr_epoch_t *epoch_at(mc_subrelease_t *sr, uint64_t e) {
  return &sr->ring[e % MC_SR_EPOCHS];
}

static inline const mc_sr_epoch_t *epoch_at_c(const mc_subrelease_t *sr, uint64_t e) {
  return &sr->ring[e % MC_SR_EPOCHS];
}

static uint64_t window(uint64_t s) { return s > MC_SR_WINDOW_MAX ? MC_SR_WINDOW_MAX : s; }

size_t mc_sr_size(void) { return sizeof(mc_subrelease_t); }

void mc_sr_init(mc_subrelease_t *sr, uint64_t skip_subrelease_s, uint64_t t_schedule_s,
                uint64_t release_rate_bytes) {
  memset(sr, 0, sizeof *sr);
  sr->skip_subrelease_s = skip_subrelease_s;
  sr->t_schedule_s = t_schedule_s;
  sr->release_rate_bytes = release_rate_bytes;
}

void mc_sr_reset(mc_subrelease_t *sr) {
  mc_sr_init(sr, sr->skip_subrelease_s, sr->t_schedule_s, sr->release_rate_bytes);
}

/* closes epoch `closing`: confirms earlier skipped releases against its peak */
static void tracker_close_epoch(mc_subrelease_t *sr, uint64_t closing) {
  uint64_t delta = window(sr->skip_subrelease_s);
  size_t peak = epoch_at(sr, closing)->max_used;
  uint64_t lo = closing > delta ? closing - delta : 0;
  if (closing >= delta && delta > 0) {
    mc_sr_epoch_t *old = epoch_at(sr, closing - delta);
    if (old->skipped_pending) {
      sr->incorrect_pages += old->skipped_pending;
      old->skipped_pending = 0;
    }
    lo++;
  }
  for (uint64_t e = lo; e < closing; e++) {
    mc_sr_epoch_t *ep = epoch_at(sr, e);
    if (ep->skipped_pending && peak > ep->decision_used) {
      size_t ok = peak - ep->decision_used;
      if (ok > ep->skipped_pending) ok = ep->skipped_pending;
      ep->skipped_pending -= ok;
      sr->correct_pages += ok;
    }
  }
}

void mc_sr_advance(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages) {
  if (sr->epoch_base_ms == 0) {
    sr->epoch_base_ms = now_ms ? now_ms : 1;
    sr->last_release_ms = now_ms;
    mc_sr_epoch_t *ep = epoch_at(sr, 0);
    ep->min_used = ep->max_used = used;
    ep->min_free = ep->max_free = free_pages;
    sr->rec_used = used;
    sr->rec_free = free_pages;
    sr->epoch_count = 1;
    return;
  }
  uint64_t e = (now_ms - sr->epoch_base_ms) / 1000u;
  if (e <= sr->epoch_cur) return;
  uint64_t from = sr->epoch_cur;
  if (e - from > MC_SR_EPOCHS) from = e - MC_SR_EPOCHS;
  /* The epochs that begin now start from the state that lasted across their boundary:
   * the one last recorded. A change is recorded after it is made, so the current
   * state alone would start the new epoch after the change and lose the state it
   * replaced (a free at 1.2 s made epoch 1's minimum the memory free after it). Changes
   * that are not recorded (a release the caller did not note) are covered by taking
   * the current state too. */
  size_t u0 = used, f0 = free_pages;
  size_t umin = u0 < sr->rec_used ? u0 : sr->rec_used, umax = u0 > sr->rec_used ? u0 : sr->rec_used;
  size_t fmin = f0 < sr->rec_free ? f0 : sr->rec_free, fmax = f0 > sr->rec_free ? f0 : sr->rec_free;
  for (uint64_t k = from; k < e; k++) {
    if (k >= sr->epoch_cur) tracker_close_epoch(sr, k);
    mc_sr_epoch_t *n = epoch_at(sr, k + 1);
    n->min_used = umin;
    n->max_used = umax;
    n->min_free = fmin;
    n->max_free = fmax;
    n->skipped_pending = 0;
    n->decision_used = 0;
  }
  sr->epoch_count += e - sr->epoch_cur;
  sr->epoch_cur = e;
}

void mc_sr_note(mc_subrelease_t *sr, size_t used, size_t free_pages) {
  mc_sr_epoch_t *ep = epoch_at(sr, sr->epoch_cur);
  if (used < ep->min_used) ep->min_used = used;
  if (used > ep->max_used) ep->max_used = used;
  if (free_pages < ep->min_free) ep->min_free = free_pages;
  if (free_pages > ep->max_free) ep->max_free = free_pages;
  sr->rec_used = used;
  sr->rec_free = free_pages;
}

void mc_sr_record(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages) {
  mc_sr_advance(sr, now_ms, used, free_pages);
  mc_sr_note(sr, used, free_pages);
}

size_t mc_sr_recent_peak_used(const mc_subrelease_t *sr, size_t used) {
  size_t peak = used;
  if (sr->epoch_count == 0) return peak;
  size_t m = epoch_at_c(sr, sr->epoch_cur)->max_used;
  if (m > peak) peak = m;
  if (sr->epoch_cur > 0) {
    m = epoch_at_c(sr, sr->epoch_cur - 1)->max_used;
    if (m > peak) peak = m;
  }
  return peak;
}

size_t mc_sr_peak_used(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages) {
  mc_sr_advance(sr, now_ms, used, free_pages);
  uint64_t delta = window(sr->skip_subrelease_s);
  size_t peak = used;
  uint64_t n = delta < sr->epoch_count ? delta : sr->epoch_count;
  for (uint64_t i = 0; i < n && i <= sr->epoch_cur; i++) {
    size_t m = epoch_at(sr, sr->epoch_cur - i)->max_used;
    if (m > peak) peak = m;
  }
  return peak;
}

uint64_t mc_sr_since_release_ms(const mc_subrelease_t *sr, uint64_t now_ms) {
  if (sr->epoch_base_ms == 0) return 0;
  return now_ms - sr->last_release_ms;
}

bool mc_sr_release_budget(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages,
                          size_t protect_pages, size_t *pages) {
  *pages = 0;
  mc_sr_advance(sr, now_ms, used, free_pages);
  uint64_t dt = now_ms - sr->last_release_ms;
  sr->last_release_ms = now_ms;
  uint64_t rate = sr->release_rate_bytes;
  if (rate == 0) return false;
  sr->release_carry_bytes += rate * dt / 1000u;
  size_t want = (size_t)(sr->release_carry_bytes >> MC_SR_PAGE_SHIFT);
  if (want > free_pages) {
    want = free_pages;
    sr->release_carry_bytes = (uint64_t)want << MC_SR_PAGE_SHIFT;
  }
  if (want == 0) return false;
  size_t allowed = free_pages;
  if (sr->skip_subrelease_s > 0) {
    size_t peak = mc_sr_peak_used(sr, now_ms, used, free_pages);
    size_t mapped = used + free_pages;
    allowed = mapped > peak ? mapped - peak : 0;
  }
  allowed = allowed > protect_pages ? allowed - protect_pages : 0;
  size_t doit = want < allowed ? want : allowed;
  if (doit < want && sr->skip_subrelease_s > 0) {
    size_t skipped = want - doit;
    sr->skipped_pages += skipped;
    mc_sr_epoch_t *ep = epoch_at(sr, sr->epoch_cur);
    ep->skipped_pending += skipped;
    ep->decision_used = used;
  }
  /* skipped or done, the budget of this period is spent */
  sr->release_carry_bytes = 0;
  *pages = doit;
  return true;
}

void mc_sr_skipped(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages,
                   size_t pages) {
  mc_sr_advance(sr, now_ms, used, free_pages);
  sr->skipped_pages += pages;
  mc_sr_epoch_t *ep = epoch_at(sr, sr->epoch_cur);
  ep->skipped_pending += pages;
  ep->decision_used = used;
}

void mc_sr_stats(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages,
                 mc_sr_stats_t *out) {
  mc_sr_advance(sr, now_ms, used, free_pages);
  uint64_t w = window(sr->t_schedule_s);
  uint64_t n = w < sr->epoch_count ? w : sr->epoch_count;
  size_t minf = free_pages;
  for (uint64_t i = 0; i < n && i <= sr->epoch_cur; i++) {
    size_t f = epoch_at(sr, sr->epoch_cur - i)->min_free;
    if (f < minf) minf = f;
  }
  out->realized_fragmentation_pages = minf;
  out->skipped_pages = sr->skipped_pages;
  out->correct_pages = sr->correct_pages;
  out->incorrect_pages = sr->incorrect_pages;
}
