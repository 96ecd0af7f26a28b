/* memcolo.h — public interface of libmemcolo.
 *
 * libmemcolo is a malloc replacement (link it, or LD_PRELOAD build/libmemcolo.so) for
 * latency-critical (LC) services sharing a node with best-effort (BE) jobs:
 *   - a size-class front end with per-thread caches (TCMalloc / mimalloc designs);
 *   - a huge-page-aware page heap: 2 MiB huge pages (MADV_HUGEPAGE), a filler packing
 *     spans of 4 KiB pages onto the fullest huge pages, a cache of free huge pages,
 *     and separate mappings for large blocks;
 *   - adaptive huge-page subrelease (TCMalloc, ISMM'21 §3-4): periodic release never
 *     takes mapped memory below the peak demand of the last interval Delta, realized
 *     fragmentation over T_schedule, and a tracker of skipped-subrelease correctness;
 *   - Hermes reservation (Middleware'21 §3.2, Algorithms 1-2) for processes of class
 *     `lc`: a management thread keeps RSV_FACTOR x the last interval's demand of free
 *     memory pre-faulted (MADV_POPULATE_WRITE) plus a segregated pool of pre-faulted
 *     large blocks (>= 128 KiB).
 *
 * The standard malloc surface (malloc, free, calloc, realloc, reallocarray,
 * posix_memalign, aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size,
 * malloc_trim, mallopt, and the C++ new/delete family) is exported under its usual
 * names and declared by <stdlib.h>/<malloc.h>; this header adds memcolo's own calls.
 * Options are read once from MEMCOLO_* environment variables (see README.md).
 */
#ifndef MEMCOLO_H
#define MEMCOLO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEMCOLO_STATS_VERSION 3 /* 2: agent link and THP counters appended; 3: reserved_bytes */

/* A snapshot of the allocator's telemetry. All sizes in bytes, times in microseconds. */
typedef struct memcolo_stats_s {
  uint32_t version;                /* MEMCOLO_STATS_VERSION */
  uint32_t reservation_on;         /* 1 when Hermes reservation is active (class lc) */
  /* page heap */
  uint64_t mapped_bytes;           /* backed by the OS: in use + free but not released */
  uint64_t used_bytes;             /* in spans handed to the front end or to large blocks */
  uint64_t free_backed_bytes;      /* free in the page heap and still backed (incl. reserve) */
  uint64_t released_bytes;         /* address space held but returned to the OS */
  uint64_t hugepages_total;        /* 2 MiB huge pages owned by the filler and cache */
  uint64_t hugepages_broken;       /* of which partially subreleased (no longer THP-backed) */
  double   hugepage_coverage;      /* share of used bytes on intact (never subreleased) huge
                                      pages, 0..1: ISMM'21's coverage, what subrelease spares */
  /* subrelease (ISMM'21) */
  uint64_t released_total_bytes;   /* given back to the OS since start */
  uint64_t subreleased_bytes;      /* of which from partially used huge pages */
  uint64_t realized_fragmentation_bytes; /* min free-and-mapped over T_schedule (§3.2) */
  uint64_t average_fragmentation_bytes;  /* free-and-mapped now */
  uint64_t skipped_subrelease_bytes;     /* release skipped because of the peak of Delta */
  uint64_t skipped_correct_bytes;        /* of those, confirmed needed again within Delta */
  uint64_t skipped_incorrect_bytes;      /* of those, not needed within Delta */
  /* Hermes reservation */
  uint64_t reserve_target_bytes;   /* current target of pre-faulted free memory */
  uint64_t prefaulted_bytes;       /* pre-faulted by the management thread since start */
  uint64_t pool_bytes;             /* in the segregated pool of large blocks now */
  uint64_t reserve_hits;           /* page-heap requests served from pre-faulted memory */
  uint64_t reserve_misses;         /* page-heap requests that had to fault memory in */
  uint64_t pool_hits;              /* large requests served by the pool */
  uint64_t pool_misses;            /* large requests the pool could not serve */
  /* front end */
  uint64_t malloc_calls_slow;      /* allocations that left the thread cache fast path */
  uint64_t large_allocs;           /* allocations above the largest size class */
  uint64_t os_mmap_calls;          /* mmap calls for heap memory */
  uint64_t threads_active;         /* thread caches alive */
  /* agent link (version 2) */
  uint32_t agent_registered;       /* 1 while registered with the memcolo agent */
  uint32_t reserved0;
  uint64_t agent_registrations;    /* successful registrations (1 + reconnections) */
  uint64_t agent_notifications;    /* low/high/top notifications answered */
  uint64_t agent_released_bytes;   /* released to the OS on the agent's notifications */
  /* transparent huge pages (version 2) */
  uint64_t hugepages_thp;          /* huge pages the kernel backs with a THP (as far as memcolo knows) */
  double   thp_coverage;           /* share of used bytes in the filler on THP-backed huge pages */
  /* Hermes reservation's footprint (version 3) */
  uint64_t reserved_bytes;         /* resident memory the reservation holds now and the
                                      program does not use: the pool (pool_bytes, blocks the
                                      page heap counts in used_bytes) plus the heap's free
                                      backed memory (free_backed_bytes, which Hermes'
                                      Algorithm 1 keeps at its target) up to
                                      reserve_target_bytes; the program's own memory is
                                      used_bytes - pool_bytes. 0 without the reservation */
} memcolo_stats_t;

/* Fills *out with a consistent snapshot; returns 0, or -1 if out is NULL. */
int memcolo_stats(memcolo_stats_t *out);

/* Prints the telemetry report (the same one MEMCOLO_STATS=1 prints at exit) to fd. */
void memcolo_stats_print(int fd);

/* Memory pressure levels, as sent by the memcolo agent (M3 §4). */
typedef enum memcolo_level_e {
  MEMCOLO_LEVEL_LOW = 0,  /* release the cache of free huge pages */
  MEMCOLO_LEVEL_HIGH = 1, /* also subrelease free pages of partially used huge pages */
  MEMCOLO_LEVEL_TOP = 2   /* as high, and drop the reservation */
} memcolo_level_t;

/* Releases free memory to the OS as demanded by memory pressure at `level` (what the
 * agent's notifications do; M3 §4): LOW releases the caches of free huge pages and freed
 * regions beyond the reservation target; HIGH also empties the central caches and
 * subreleases free 4 KiB pages of partially used huge pages up to target_bytes (0 = as
 * much as possible); TOP also drops the Hermes reservation for MEMCOLO_TOP_HOLD_S
 * seconds and releases everything free. Ignores the skip-subrelease interval Delta.
 * Returns the bytes released; an unknown level releases nothing. */
size_t memcolo_release(memcolo_level_t level, size_t target_bytes);

/* An application's own reclamation layer above the allocator (M3 §3-4): called on the
 * agent thread for each notification, before the allocator releases its free memory,
 * with the level and the agent's target in bytes; returns the bytes the application
 * freed (informational). It may call free() and malloc(). NULL removes it. */
typedef size_t (*memcolo_pressure_fn)(memcolo_level_t level, size_t target_bytes, void *arg);
void memcolo_on_pressure(memcolo_pressure_fn fn, void *arg);

/* Turns Hermes reservation on (1) or off (0) at run time; returns the previous state.
 * Starts the management thread when needed. */
int memcolo_set_reservation(int on);

/* The allow-rate gate (M3 §4.2), fed by the agent's high and top notifications with
 * the same formula as the SDKs: rate = min(time since the last high/top notification /
 * (epoch x NUM_epochs), 1), where the epoch is the time the allocator took to handle
 * that notification, but at least MEMCOLO_GATE_MIN_EPOCH_MS (default 1000 ms, one poll
 * of the agent: docs/protocol.md §9; 0 = the handling time alone), and NUM_epochs =
 * MEMCOLO_NUM_EPOCHS (default 5); 0 between the receipt of a notification and the end
 * of its handling; 1 when none came. memcolo_allow_rate returns the rate in [0, 1]. memcolo_allow_admit implements the
 * protocol for an application's own alloc(): it returns 1 for every floor(1/rate)-th
 * call (always 1 at rate 1, never at rate 0), and 0 when the application should evict
 * before it grows. Neither ever blocks; malloc itself is never gated. */
double memcolo_allow_rate(void);
int memcolo_allow_admit(void);

#ifdef __cplusplus
}
#endif
#endif /* MEMCOLO_H */
