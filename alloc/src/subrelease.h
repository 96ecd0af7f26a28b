/* subrelease.h — TCMalloc's adaptive huge-page subrelease decisions (Maas et al.,
 * "Adaptive Hugepage Subrelease for Non-moving Memory Allocators in Warehouse-Scale
 * Computers", ISMM'21 §3-4) as a value: everything the decisions remember lives in one
 * mc_subrelease_t passed by pointer. No globals, no locks, no system calls, no clock:
 * the caller passes the time (ms, any monotonic origin > 0) and the page heap's state
 * (used and free-but-mapped pages, 4 KiB each) into every call, and carries out the
 * release it is told to. libmemcolo keeps one process-wide instance under mc_heap.lock
 * (release.c, which includes subrelease.c so that the page heap's calls inline);
 * memcolo-sim keeps one per simulated heap (crates/memcolo-sim/src/heap.rs)
 * through a Rust binding of this same file.
 *
 *   - Time series of 1 s epochs; each records the minimum and maximum of used and of
 *     free-but-mapped pages seen at page heap changes (constant time, §3.3).
 *   - Realized fragmentation: the minimum free-and-mapped memory over the last
 *     T_schedule (§3.2).
 *   - Periodic release at release_rate_bytes per second that never takes mapped memory
 *     below the peak demand (used pages) of the last Delta = skip_subrelease_s (§4.1).
 *   - Correctness of skipped releases (§4.2): each epoch keeps the pages it did not
 *     release and the demand at that time; a later epoch whose peak demand exceeds it
 *     within Delta confirms them (partially), and what is left when the decision falls
 *     out of Delta counts as incorrect.
 *
 * Settings are plain fields the caller may change between calls (libmemcolo copies its
 * MEMCOLO_* options in before each call). A zeroed struct (or mc_sr_init) is a fresh
 * instance; the first call that passes the time starts epoch 0 at it. */
#ifndef MEMCOLO_SUBRELEASE_H
#define MEMCOLO_SUBRELEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MC_SR_PAGE_SHIFT 12 /* 4 KiB pages: the unit of every page count here */
#define MC_SR_EPOCHS 1024   /* ring length; T_schedule and Delta are at most this (s) */
#define MC_SR_WINDOW_MAX 900 /* largest T_schedule or Delta honoured, seconds */

typedef struct {
  size_t min_used, max_used, min_free, max_free; /* pages */
  size_t skipped_pending, decision_used;         /* pages */
} mc_sr_epoch_t;

typedef struct mc_subrelease_s {
  /* settings */
  uint64_t skip_subrelease_s;  /* Delta, seconds, 0..MC_SR_WINDOW_MAX (0 = off) */
  uint64_t t_schedule_s;       /* realized fragmentation window, seconds, 1..MC_SR_WINDOW_MAX */
  uint64_t release_rate_bytes; /* periodic release, bytes per second (0 = none) */
  /* state */
  mc_sr_epoch_t ring[MC_SR_EPOCHS];
  uint64_t epoch_cur;     /* seconds since epoch_base_ms */
  uint64_t epoch_base_ms; /* 0: not started */
  uint64_t epoch_count;
  uint64_t last_release_ms;
  uint64_t release_carry_bytes;
  uint64_t skipped_pages, correct_pages, incorrect_pages; /* the §4.2 tracker */
  size_t rec_used, rec_free; /* pages, as last recorded */
} mc_subrelease_t;

/* What mc_sr_stats reports, pages. */
typedef struct {
  size_t realized_fragmentation_pages; /* least free-and-mapped over the last T_schedule */
  uint64_t skipped_pages;              /* releases skipped under the peak of Delta */
  uint64_t correct_pages;              /* ... confirmed by demand coming back within Delta */
  uint64_t incorrect_pages;            /* ... not confirmed before they fell out of Delta */
} mc_sr_stats_t;

/* Bytes of an mc_subrelease_t, for callers that hold it as opaque storage aligned to 8
 * bytes (the Rust binding). */
size_t mc_sr_size(void);

/* A fresh instance with these settings (the ring and counters zeroed). */
void mc_sr_init(mc_subrelease_t *sr, uint64_t skip_subrelease_s, uint64_t t_schedule_s,
                uint64_t release_rate_bytes);

/* Moves the epoch series to now_ms (closing epochs and judging skipped releases as
 * they fall out of Delta); used/free: the heap's state now. */
void mc_sr_advance(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages);

/* Records the heap's state in the current epoch (no advance): after a change made at
 * the time of the last advance. */
void mc_sr_note(mc_subrelease_t *sr, size_t used, size_t free_pages);

/* A page heap change at now_ms: advance, then note. */
void mc_sr_record(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages);

/* Peak used pages over the last Delta epochs (the current one included), at least
 * `used`. Advances to now_ms. */
size_t mc_sr_peak_used(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages);

/* Peak used pages over the current and the previous epoch, at least `used`. */
size_t mc_sr_recent_peak_used(const mc_subrelease_t *sr, size_t used);

/* Milliseconds since the last periodic release decision (0 before the first advance). */
uint64_t mc_sr_since_release_ms(const mc_subrelease_t *sr, uint64_t now_ms);

/* The periodic release at now_ms: the budget accrued at release_rate_bytes since the
 * previous decision, capped at the free pages, less what the peak of Delta and
 * protect_pages forbid (the part forbidden by Delta is a skipped release, tracked).
 * Returns false when there was nothing to decide (no rate, or a budget under a page);
 * else true with *pages the pages to release now (possibly 0), after which the caller
 * releases them and calls mc_sr_note with the new state. */
bool mc_sr_release_budget(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages,
                          size_t protect_pages, size_t *pages);

/* A release of `pages` skipped outside the periodic release (a freed block kept mapped
 * under the peak of Delta), tracked like the periodic release's own (§4.2). */
void mc_sr_skipped(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages,
                   size_t pages);

/* Realized fragmentation and the tracker's counters at now_ms. */
void mc_sr_stats(mc_subrelease_t *sr, uint64_t now_ms, size_t used, size_t free_pages,
                 mc_sr_stats_t *out);

/* Restarts the series and zeroes the counters (tests); settings are kept. */
void mc_sr_reset(mc_subrelease_t *sr);

#endif
