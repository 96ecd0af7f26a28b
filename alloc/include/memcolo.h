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

#define MEMCOLO_STATS_VERSION 1

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
  double   hugepage_coverage;      /* share of used bytes on intact huge pages, 0..1 */
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

/* Releases up to target_bytes (0 = as much as possible) of free memory to the OS, as
 * demanded by memory pressure at `level`; ignores the skip-subrelease interval Delta.
 * Returns the bytes released. */
size_t memcolo_release(memcolo_level_t level, size_t target_bytes);

/* Turns Hermes reservation on (1) or off (0) at run time; returns the previous state.
 * Starts the management thread when needed. */
int memcolo_set_reservation(int on);

/* The allow-rate gate (M3 §4.2): the bytes per second of growth the agent currently
 * allows this process (0 = unlimited). Applications that can defer growth poll it. */
uint64_t memcolo_allow_rate_bytes_per_s(void);

#ifdef __cplusplus
}
#endif
#endif /* MEMCOLO_H */
