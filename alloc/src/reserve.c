/* reserve.c — Hermes reservation (Middleware'21 §3.2, Algorithms 1-2, §4).
 * A management thread wakes every MEMCOLO_RESERVE_INTERVAL_US (2 ms) and
 *   1. reads the demand of the last interval: small demand, how far the bytes of the
 *      spans the front end holds ("small", < 128 KiB requests) rose above their
 *      high-water mark of the last second (memory given back and taken again within it
 *      is still backed: no demand on the reserve), and the bytes of large requests;
 *   2. Algorithm 1: keeps pre-faulted free memory in the page heap at up to
 *      RSV_THR = max(RSV_FACTOR x small demand, min_rsv), adding one 2 MiB huge page
 *      at a time while a whole one fits below RSV_THR (gradual reservation: allocations
 *      never wait for a whole refill; the reserve never exceeds RSV_THR), and trims
 *      what exceeds TRIM_THR = TRIM_FACTOR x RSV_THR back to the OS, and what exceeds
 *      RSV_THR in a round without small demand;
 *   3. Algorithm 2: keeps a segregated pool of pre-faulted large blocks (>= 128 KiB,
 *      bucket = MIN(size / 128 KiB, 8), formula (1)) at max(RSV_FACTOR x large demand,
 *      rate x horizon) in blocks of the recent average large request, trimming above
 *      TRIM_THR;
 *   4. once a second: the periodic release (release.c) sparing the reservation, and
 *      background THP (collapsing dense huge pages, pageheap.c) when idle.
 * The same thread runs without the reservation (class be, elastic, none) once the heap
 * holds MC_MGMT_AUTOSTART_HP huge pages, waking every 50 ms for step 4 only.
 * Beyond Hermes: (a) "rate x horizon": the pool also holds MEMCOLO_RSV_HORIZON_MS
 * (100 ms) of the demand rate (bytes/us, weighted over ~32 ms). RSV_FACTOR x one 2 ms
 * interval is ~4 ms of demand; under memory pressure a pre-fault waits for reclaim
 * and the thread for a CPU (10-50 ms stalls measured on 2 CPUs beside a swapping BE
 * job), and the application, late after a stall of its own, catches up back to back:
 * a reserve of a few ms ran dry (paced 1 GB/s under anonymous pressure: 6-15 % of 256
 * KiB requests missed with 20 ms, 2-4 % with 100-150 ms). (b) The thread runs at
 * MEMCOLO_MGMT_NICE (-10) while reserving: at the process's nice it got about half a
 * CPU beside a BE job and 42-55 % of the requests missed; at -10, 3-10 %.
 * (c) Pooled blocks are mlocked until handed out (MEMCOLO_MLOCK, Hermes §4; munlocked
 * by this thread in its next round): under anonymous pressure a pre-faulted block that
 * nobody touched yet is the coldest memory of its group, and reclaim swapped pooled
 * blocks out before their allocation came (MEMCOLO_RSV_TRACE: 0.5-30 ms allocations
 * while the pool held 40 MiB and had missed 3 times). (d) A request that finds the pool
 * empty while a block is being pre-faulted waits for that block (at most 2 ms) instead
 * of faulting fresh pages at its own priority beside it.
 * (e) Back-off (MEMCOLO_RSV_BACKOFF): when requests miss the empty pool for 3 rounds in
 * a row while the thread that missed is itself busy (running or runnable in
 * /proc/self/task/TID/stat, or waiting on the pool), the fill is not keeping up and
 * pre-faulting only takes CPU from the application: under anonymous pressure a miss
 * faults (and reclaims) beside this thread at nice -10 on the same CPU, and back to back
 * 256 KiB misses took 1.4-6.5 ms at p99 against 0.4-1.6 ms for the peers, which fault
 * alone. Backed off, the thread stops pre-faulting (1; 2: keeps pre-faulting at the
 * process's nice) and no request waits for a block in flight, until the application
 * is found idle twice in a row (it sleeps: its idle CPU is the fill's) or a round sees
 * no large demand. Off by default since (g): with the fill SCHED_IDLE while the
 * application is busy, backing off only starved the fill (anonymous pressure, 3 paired
 * runs: b2b p99 1917-2985 us off against 3319-4126 on; paced 1 ms p99 4.2-10.2 against
 * 12.1-18.3 us in 2 of 3 runs, 5.2 ms in both in the third).
 * (f) Stepping aside (MEMCOLO_RSV_YIELD_US): at nice -10 (weight 9548 against 1024) a
 * management thread that shares a CPU with the application gets ~9 of every 10
 * scheduler ticks (4 ms at HZ=250) while it is behind; and the processes of one session
 * share one autogroup, so the nice takes CPU from the application alone, never from a BE
 * job in another session. With the other CPU busy, back-to-back 256 KiB runs had one
 * allocation of 36 ms (9 ticks) per run, the application runnable (sched_switch
 * prev_state R, not D: no lock) while this thread filled. So the thread pre-faults in
 * steps of at most 256 KiB (os.c) and, every 200 us, looks whether the application
 * thread it serves (the last to ask for a large block) is runnable on its own CPU
 * (/proc/self/task/TID/stat) and has not run since (schedstat); after 200 us of that it
 * sleeps 200 us: the application's wait is bounded, and the two share the CPU fairly
 * (the application's run_delay would not do: it grows only once it runs). One A/B,
 * 3 interleaved runs each, the other CPU taken by a spinner in its own session (busy
 * 0.99): max 36.1 / 36.1 / 36.3 ms without (YIELD_US=0), 0.94 / 0.93 / 0.91 ms with 200
 * us (p99 0.70-0.74 ms: the fill's share of the CPU is now spread over ~1 % of the
 * allocations; 2.5 ms with 2000 us), p50 1.5-2.1 us in both.
 * (g) SCHED_IDLE while the application is busy (MEMCOLO_RSV_YIELD_MODE=3, the default):
 * stepping aside bounded the wait but cost the p99 (file b2b p99 726 us against the
 * peers' 197: ~10 % of the allocations waited 0.6-0.7 ms), and with autogroups a
 * runnable management thread at nice -10 on the *other* CPU drew ~9/10 of the
 * session's weight there, so the application waited 20-68 ms behind another session's
 * spinner on its own CPU (sched_switch, a filling thread moved off its CPU by affinity,
 * mode 2). Back to back on a machine with no idle CPU the fill cannot get ahead without
 * taking the application's CPU: the same faults, either inside the allocations (peers)
 * or as the thread's preemptions (~10 % of them at 0.6 ms). So once the thread it serves
 * has been runnable at 3 looks in a row (back to back, not a paced request), the fill
 * runs SCHED_IDLE (only CPU time nobody wants; no request waits for its block in
 * flight) until it is found not runnable. A/B, b2b 256 KiB with a spinner on the other
 * CPU (3 runs, busy 0.93-0.97): p99 664-689 us / max 0.73-4.8 ms with mode 0, 274-298
 * us / 0.38-0.54 ms with SCHED_IDLE at once (glibc 182-397, jemalloc 149-206 us), p50 1.3
 * against 89-91 us; anonymous pressure, b2b p99 5464-7102 us against 1370-2192 (jemalloc
 * 1301-9501), paced p99 unchanged in kind (bench/alloc/RESULTS.md, 20261121T124328Z).
 * A `top` notification (agent.c) suspends the reservation for MEMCOLO_TOP_HOLD_S.
 * Pre-faulting uses MADV_POPULATE_WRITE (mlock for pooled blocks), outside every
 * lock. Large requests take a pooled block (best fit in their bucket, then the next
 * buckets, then the largest block grown in place) or fall back to the page heap. */
#define _GNU_SOURCE /* sched_getcpu */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

volatile int mc_reserve_on;
volatile int mc_reserve_thread_running;
uint64_t mc_demand_large_bytes, mc_demand_large_count;
uint64_t mc_small_span_bytes, mc_small_span_peak;

static pthread_mutex_t mc_pool_lock = PTHREAD_MUTEX_INITIALIZER;
/* the block the management thread is pre-faulting now (pages; 0 = none): a request
 * that finds the pool empty waits for it rather than faulting fresh pages itself */
static pthread_cond_t mc_pool_pushed = PTHREAD_COND_INITIALIZER;
static size_t mc_pool_inflight_pages;
static uint64_t mc_pool_waits;
/* With MEMCOLO_MLOCK, pooled blocks are mlocked while they wait (Hermes §4): under
 * anonymous pressure a pre-faulted block that nobody has touched yet is the coldest
 * memory of the group, and reclaim swapped pooled blocks out before their allocation
 * came. Blocks handed out are munlocked by the management thread, not on the
 * allocation path (munlock takes the mmap lock for writing): a queue of them. */
#define MC_UNLOCK_QUEUE 512
static struct { uintptr_t start; size_t bytes; } mc_unlock_q[MC_UNLOCK_QUEUE];
static unsigned mc_unlock_n;
static mc_span_t *mc_pool[MC_POOL_BUCKETS + 1];
static size_t mc_pool_total_bytes;
static uint64_t mc_pool_hits, mc_pool_misses, mc_prefaulted_bytes;
static size_t mc_rsv_target_bytes, mc_pool_target_bytes;
static uint64_t mc_resume_at_ms; /* nonzero: suspended by `top` until then */
/* back-off (e): set by the management thread; the thread that last found the pool
 * empty; the requests waiting on the pool now (under mc_pool_lock) */
static volatile int mc_rsv_backoff;
static volatile pid_t mc_pool_empty_tid;
static unsigned mc_pool_waiting;
static uint64_t mc_backoff_episodes, mc_backoff_rounds;
/* stepping aside (f): the application thread served last (0 = none yet), the times the
 * fill stepped aside; each thread's own id, cached (gettid is a system call) */
static volatile pid_t mc_rsv_client_tid;
/* 1 while the management thread runs SCHED_IDLE (MEMCOLO_RSV_YIELD_MODE=3): no request
 * waits for its block in flight then (it may get no CPU) */
static volatile int mc_mgmt_idle;
/* 1 while the management thread pre-faults pooled large blocks (Algorithm 2): only that
 * fill goes SCHED_IDLE for a busy application. The page heap's fill (Algorithm 1) keeps
 * its priority: 1 KiB requests every 1 us keep the application runnable all the time,
 * and with that fill idle under anonymous pressure the 1 KiB paced p99.9 went from
 * 7.3-7.5 us to 422-1093 us (3 paired runs; jemalloc 401-1247 us). */
static int mc_fill_pool;
static uint64_t mc_rsv_yields;
static __thread pid_t mc_tl_tid;

static inline pid_t self_tid(void) {
  if (mc_unlikely(mc_tl_tid == 0)) mc_tl_tid = (pid_t)syscall(SYS_gettid);
  return mc_tl_tid;
}

/* MEMCOLO_RSV_TRACE=1: one sample per round of the management thread, printed as CSV
 * on stderr at exit (for matching the application's slow allocations with the reserve
 * levels: was the pool at its target when misses began, did the fill keep up?). */
typedef struct {
  uint64_t t_us, heap_free, heap_target, pool, pool_target, prefaulted, demand, pool_misses, round_us, yields;
} mc_rsv_sample_t;
#define MC_RSV_TRACE_MAX 16384
static mc_rsv_sample_t *mc_rsv_trace;
static uint32_t mc_rsv_trace_n;
static uint64_t mc_rsv_demand_total, mc_rsv_trace_t0;

static void rsv_trace_dump(void) {
  if (mc_rsv_trace == NULL) return;
  char line[256], *b;
  /* the origin of t_us on CLOCK_MONOTONIC, to line the rounds up with the application's
   * own timestamps (bench/alloc/hermes_bench.c's HERMES_RAW) */
  b = line;
  memcpy(b, "rsv_trace_t0_mono_us,", 21);
  b = mc_fmt_u64(b + 21, mc_rsv_trace_t0);
  *b++ = '\n';
  *b = 0;
  mc_write_str(2, line);
  mc_write_str(2, "rsv_trace,t_us,heap_free,heap_target,pool,pool_target,prefaulted,demand,pool_misses,round_us,yields\n");
  for (uint32_t i = 0; i < mc_rsv_trace_n && i < MC_RSV_TRACE_MAX; i++) {
    const uint64_t *f = &mc_rsv_trace[i].t_us;
    b = line;
    memcpy(b, "rsv_trace", 9);
    b += 9;
    for (int k = 0; k < 10; k++) { *b++ = ','; b = mc_fmt_u64(b, f[k]); }
    *b++ = '\n';
    *b = 0;
    mc_write_str(2, line);
  }
}

__attribute__((destructor)) static void rsv_trace_at_exit(void) { rsv_trace_dump(); }

static void rsv_trace_add(uint64_t heap_free, uint64_t heap_target, uint64_t pool, uint64_t pool_target,
                          uint64_t round_us) {
  if (!MC_OPT(MC_OPT_RSV_TRACE)) return;
  if (mc_rsv_trace == NULL) {
    mc_rsv_trace = (mc_rsv_sample_t *)mc_os_meta_alloc(sizeof(mc_rsv_sample_t) * MC_RSV_TRACE_MAX);
    if (mc_rsv_trace == NULL) return;
    mc_rsv_trace_t0 = mc_now_us();
  }
  if (mc_rsv_trace_n >= MC_RSV_TRACE_MAX) return;
  mc_rsv_sample_t *x = &mc_rsv_trace[mc_rsv_trace_n];
  *x = (mc_rsv_sample_t){mc_now_us() - mc_rsv_trace_t0, heap_free, heap_target, pool, pool_target,
                         __atomic_load_n(&mc_prefaulted_bytes, __ATOMIC_RELAXED), mc_rsv_demand_total,
                         __atomic_load_n(&mc_pool_misses, __ATOMIC_RELAXED), round_us, mc_rsv_yields};
  __atomic_store_n(&mc_rsv_trace_n, mc_rsv_trace_n + 1, __ATOMIC_RELEASE);
}

static inline unsigned pool_bucket(size_t bytes) {
  size_t b = bytes / MC_POOL_MIN_BYTES;
  return (unsigned)(b < MC_POOL_BUCKETS ? b : MC_POOL_BUCKETS);
}

void mc_reserve_lock(void) { pthread_mutex_lock(&mc_pool_lock); }
void mc_reserve_unlock(void) { pthread_mutex_unlock(&mc_pool_lock); }

size_t mc_reserve_target_bytes(void) { return mc_reserve_on ? mc_rsv_target_bytes : 0; }

static mc_span_t *pool_take_locked(size_t pages) {
  size_t bytes = pages << MC_PAGE_SHIFT;
  for (unsigned b = pool_bucket(bytes); b <= MC_POOL_BUCKETS; b++) {
    mc_span_t *best = NULL, **link = NULL;
    for (mc_span_t **l = &mc_pool[b]; *l; l = &(*l)->next) {
      mc_span_t *s = *l;
      if (s->pages >= pages && (!best || s->pages < best->pages)) { best = s; link = l; if (s->pages == pages) break; }
    }
    if (best) {
      *link = best->next;
      mc_pool_total_bytes -= (size_t)best->pages << MC_PAGE_SHIFT;
      return best;
    }
  }
  return NULL;
}

void *mc_pool_alloc(size_t pages) {
  pid_t me = self_tid();
  if (mc_rsv_client_tid != me) mc_rsv_client_tid = me;
  pthread_mutex_lock(&mc_pool_lock);
  mc_span_t *s = pool_take_locked(pages);
  if (s == NULL) mc_pool_empty_tid = me;
  if (s == NULL && mc_pool_inflight_pages >= pages && !mc_rsv_backoff && !mc_mgmt_idle) {
    /* the pool is empty and a block is being pre-faulted right now: waiting for it
     * costs at most the rest of that block's faults, done by the management thread at
     * its priority; faulting a block here would charge (and under pressure reclaim)
     * alongside it, at the application's priority */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 2 * 1000 * 1000;
    if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    mc_pool_waits++;
    mc_pool_waiting++;
    while (s == NULL && mc_pool_inflight_pages >= pages) {
      if (pthread_cond_timedwait(&mc_pool_pushed, &mc_pool_lock, &dl) != 0) break;
      s = pool_take_locked(pages);
    }
    mc_pool_waiting--;
    if (s == NULL) s = pool_take_locked(pages);
  }
  if (s == NULL) {
    /* the largest pooled block, grown in place (its own pages are already faulted) */
    mc_span_t *big = NULL, **link = NULL;
    for (int b = MC_POOL_BUCKETS; b >= 0 && !big; b--) {
      for (mc_span_t **l = &mc_pool[b]; *l; l = &(*l)->next) {
        if (!big || (*l)->pages > big->pages) { big = *l; link = l; }
      }
    }
    if (big) {
      *link = big->next;
      mc_pool_total_bytes -= (size_t)big->pages << MC_PAGE_SHIFT;
      pthread_mutex_unlock(&mc_pool_lock);
      if (mc_heap_try_grow(big, pages)) { s = big; goto got; }
      pthread_mutex_lock(&mc_pool_lock);
      big->next = mc_pool[pool_bucket((size_t)big->pages << MC_PAGE_SHIFT)];
      mc_pool[pool_bucket((size_t)big->pages << MC_PAGE_SHIFT)] = big;
      mc_pool_total_bytes += (size_t)big->pages << MC_PAGE_SHIFT;
    }
    mc_pool_misses++;
    pthread_mutex_unlock(&mc_pool_lock);
    return NULL;
  }
  pthread_mutex_unlock(&mc_pool_lock);
got:
  __atomic_fetch_add(&mc_pool_hits, 1, __ATOMIC_RELAXED);
  if (s->locked) {
    s->locked = 0;
    pthread_mutex_lock(&mc_pool_lock);
    bool queued = mc_unlock_n < MC_UNLOCK_QUEUE;
    if (queued) mc_unlock_q[mc_unlock_n++] = (typeof(mc_unlock_q[0])){s->start, (size_t)s->pages << MC_PAGE_SHIFT};
    pthread_mutex_unlock(&mc_pool_lock);
    if (!queued) mc_os_unlock((void *)s->start, (size_t)s->pages << MC_PAGE_SHIFT);
  }
  s->pooled = 0;
  if (s->pages > pages) mc_heap_shrink(s, pages);
  mc_pagemap_set(s->start, s); /* its leaf exists: the block was mapped before */
  return (void *)s->start;
}

bool mc_pool_free(mc_span_t *s) {
  size_t bytes = (size_t)s->pages << MC_PAGE_SHIFT;
  if (bytes < MC_POOL_MIN_BYTES || s->pages > MC_REGION_PAGES) return false;
  pthread_mutex_lock(&mc_pool_lock);
  size_t trim = mc_pool_target_bytes * (size_t)MC_OPT(MC_OPT_TRIM_FACTOR_PCT) / 100;
  if (mc_pool_total_bytes + bytes > trim) { pthread_mutex_unlock(&mc_pool_lock); return false; }
  mc_pagemap_set(s->start, NULL);
  s->pooled = 1;
  unsigned b = pool_bucket(bytes);
  s->next = mc_pool[b];
  mc_pool[b] = s;
  mc_pool_total_bytes += bytes;
  pthread_mutex_unlock(&mc_pool_lock);
  return true;
}

static void pool_push(mc_span_t *s) {
  pthread_mutex_lock(&mc_pool_lock);
  if (!mc_reserve_on) {
    /* turned off while this block was being pre-faulted: the pool stays empty */
    mc_pool_inflight_pages = 0;
    pthread_cond_broadcast(&mc_pool_pushed);
    pthread_mutex_unlock(&mc_pool_lock);
    s->kind = MC_SPAN_LARGE;
    if (s->locked) { s->locked = 0; mc_os_unlock((void *)s->start, (size_t)s->pages << MC_PAGE_SHIFT); }
    mc_heap_free(s);
    return;
  }
  s->pooled = 1;
  unsigned b = pool_bucket((size_t)s->pages << MC_PAGE_SHIFT);
  s->next = mc_pool[b];
  mc_pool[b] = s;
  mc_pool_total_bytes += (size_t)s->pages << MC_PAGE_SHIFT;
  mc_pool_inflight_pages = 0;
  pthread_cond_broadcast(&mc_pool_pushed);
  pthread_mutex_unlock(&mc_pool_lock);
}

/* removes the largest block while the pool exceeds limit; returns bytes removed */
static size_t pool_trim(size_t limit) {
  size_t done = 0;
  for (;;) {
    pthread_mutex_lock(&mc_pool_lock);
    if (mc_pool_total_bytes <= limit) { pthread_mutex_unlock(&mc_pool_lock); break; }
    mc_span_t *s = NULL;
    for (int b = MC_POOL_BUCKETS; b >= 0 && !s; b--) {
      if (mc_pool[b]) { s = mc_pool[b]; mc_pool[b] = s->next; }
    }
    if (s) mc_pool_total_bytes -= (size_t)s->pages << MC_PAGE_SHIFT;
    pthread_mutex_unlock(&mc_pool_lock);
    if (!s) break;
    s->pooled = 0;
    s->next = NULL;
    s->kind = MC_SPAN_LARGE;
    done += (size_t)s->pages << MC_PAGE_SHIFT;
    if (s->locked) { s->locked = 0; mc_os_unlock((void *)s->start, (size_t)s->pages << MC_PAGE_SHIFT); }
    mc_heap_free(s);
  }
  return done;
}

size_t mc_pool_drain(void) { return pool_trim(0); }

/* munlocks the pooled blocks handed out since the last round (MEMCOLO_MLOCK) */
static void unlock_handed_out(void) {
  typeof(mc_unlock_q[0]) q[64];
  for (;;) {
    unsigned n = 0;
    pthread_mutex_lock(&mc_pool_lock);
    while (mc_unlock_n > 0 && n < 64) q[n++] = mc_unlock_q[--mc_unlock_n];
    pthread_mutex_unlock(&mc_pool_lock);
    if (n == 0) return;
    for (unsigned i = 0; i < n; i++) mc_os_unlock((void *)q[i].start, q[i].bytes);
  }
}

/* The management thread's CPU priority follows the reservation: at MEMCOLO_MGMT_NICE
 * while it is on, at the process's nice otherwise. Pre-faulting is the LC service's
 * own work done ahead of it; at the same nice as a BE job's threads it got about half
 * a CPU beside them and fell behind. Lowering nice below the process's needs
 * CAP_SYS_NICE (or RLIMIT_NICE): without, the thread keeps the process's, silently. */
static void mgmt_set_priority(bool reserving) {
  static int applied = 0; /* 1: at MEMCOLO_MGMT_NICE */
  static int base_nice = 0;
  if ((int)reserving == applied) return;
  pid_t tid = self_tid();
  if (reserving) {
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, (id_t)tid);
    if (errno != 0) return;
    base_nice = cur;
    if (setpriority(PRIO_PROCESS, (id_t)tid, (int)MC_OPT(MC_OPT_MGMT_NICE)) != 0) {
      applied = 1; /* not permitted: do not try again every interval */
      base_nice = cur;
      return;
    }
  } else {
    setpriority(PRIO_PROCESS, (id_t)tid, base_nice);
  }
  applied = reserving;
}

/* A /proc/self/task/TID/<name> file, kept open between readings of the same thread;
 * dev/ino identify it, so that a descriptor number the application closed and reused
 * (closefrom, a daemon closing every descriptor) is never read or closed as ours. */
struct task_file {
  int fd;
  pid_t tid;
  dev_t dev;
  ino_t ino;
};

/* Reads /proc/self/task/TID/NAME afresh (pread at offset 0) into buf, NUL-terminated,
 * opening it when tf holds no descriptor, another thread's, or a number that no longer
 * names the file it opened (then left alone: it is the application's now); returns the
 * bytes read, or -1 when it cannot be opened or read (the thread exited), the descriptor
 * then closed. Allocates nothing. */
static ssize_t task_file_read(struct task_file *tf, pid_t tid, const char *name, char *buf,
                              size_t len) {
  struct stat st;
  if (tf->fd >= 0 && (fstat(tf->fd, &st) != 0 || st.st_dev != tf->dev || st.st_ino != tf->ino))
    tf->fd = -1; /* not ours any more: reopen, never close */
  if (tid != tf->tid || tf->fd < 0) {
    if (tf->fd >= 0) close(tf->fd);
    char path[64];
    static const char pre[] = "/proc/self/task/";
    memcpy(path, pre, sizeof(pre) - 1);
    char *e = mc_fmt_u64(path + sizeof(pre) - 1, (uint64_t)tid);
    *e++ = '/';
    memcpy(e, name, strlen(name) + 1);
    tf->fd = open(path, O_RDONLY | O_CLOEXEC);
    tf->tid = tid;
    if (tf->fd < 0) return -1;
    if (fstat(tf->fd, &st) != 0) {
      close(tf->fd);
      tf->fd = -1;
      return -1;
    }
    tf->dev = st.st_dev;
    tf->ino = st.st_ino;
  }
  ssize_t n = pread(tf->fd, buf, len - 1, 0);
  if (n <= 0) {
    close(tf->fd);
    tf->fd = -1;
    return -1;
  }
  buf[n] = 0;
  return n;
}

/* The state field (3) of /proc/self/task/TID/stat as read into buf: a pointer to it, NULL
 * if the text has no "(comm) X" shape. */
static char *task_stat_state(char *buf) {
  char *c = strrchr(buf, ')');
  return c == NULL || c[1] != ' ' || c[2] == 0 ? NULL : c + 2;
}

/* 1 if thread `tid` of this process is running or runnable (state R of
 * /proc/self/task/TID/stat), 0 if not, -1 if unknown. Allocates nothing. */
static int thread_runnable(pid_t tid) {
  struct task_file tf = {-1, 0, 0, 0};
  char buf[512];
  ssize_t n = task_file_read(&tf, tid, "stat", buf, sizeof(buf));
  if (tf.fd >= 0) close(tf.fd);
  if (n < 0) return -1;
  char *c = task_stat_state(buf);
  return c == NULL ? -1 : *c == 'R';
}

/* The state (field 3: 'R' running or runnable, 'S', 'D', ...) of thread tid of this
 * process, and in *cpu the CPU it last ran on (field 39, processor), from
 * /proc/self/task/TID/stat; 0 if unknown. Allocates nothing. */
static char client_state(pid_t tid, long *cpu) {
  static struct task_file tf = {-1, 0, 0, 0};
  char buf[512];
  if (task_file_read(&tf, tid, "stat", buf, sizeof(buf)) < 0) return 0;
  char *c = task_stat_state(buf);
  if (c == NULL) return 0;
  char st = *c;
  for (int f = 3; f < 39 && *c; f++) { /* from field 3 to field 39 */
    while (*c && *c != ' ') c++;
    if (*c == ' ') c++;
  }
  if (*c < '0' || *c > '9') return 0;
  long v = 0;
  for (; *c >= '0' && *c <= '9'; c++) v = v * 10 + (*c - '0');
  *cpu = v;
  return st;
}

/* run time so far (ns, /proc/self/task/TID/schedstat field 1) of thread tid, -1 if
 * unknown: unchanged between two readings = it has not run in between */
static int64_t client_exec_ns(pid_t tid) {
  static struct task_file tf = {-1, 0, 0, 0};
  char buf[96];
  if (task_file_read(&tf, tid, "schedstat", buf, sizeof(buf)) < 0) return -1;
  int64_t v = 0;
  for (char *c = buf; *c >= '0' && *c <= '9'; c++) v = v * 10 + (*c - '0');
  return v;
}

/* Stepping aside (f), between two pre-fault steps of at most MC_POPULATE_STEP (os.c):
 * looks whether the application thread served last waits for this thread's CPU
 * (runnable there); with MEMCOLO_RSV_YIELD_WAIT_US > 0 at most every 200 us, and only
 * once it has waited that long without running (schedstat), otherwise at every step.
 * Then, by MEMCOLO_RSV_YIELD_MODE: 0 sleeps MEMCOLO_RSV_YIELD_US, 1 sched_yield()s,
 * 2 moves this thread off that CPU (affinity: the process's CPUs but the
 * application's) until the application is found not runnable. A no-op on any thread
 * but the management thread. Allocates nothing. */
static __thread int mc_tl_is_mgmt;
static cpu_set_t mc_mgmt_cpus; /* the management thread's CPUs at its start */
static int mc_mgmt_moved;      /* 1: restricted to the CPUs but the application's */

static void mgmt_restore_cpus(void) {
  if (!mc_mgmt_moved) return;
  mc_mgmt_moved = 0;
  sched_setaffinity(0, sizeof(mc_mgmt_cpus), &mc_mgmt_cpus);
}

/* mode 2: leave `cpu` if another CPU of the process's is allowed; false if none */
static bool mgmt_leave_cpu(long cpu) {
  cpu_set_t set = mc_mgmt_cpus;
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  CPU_CLR((int)cpu, &set);
  if (CPU_COUNT(&set) == 0) return false;
  if (sched_setaffinity(0, sizeof(set), &set) != 0) return false;
  mc_mgmt_moved = 1;
  return true;
}

/* mode 3: SCHED_IDLE while the application thread is runnable (busy), so that the fill
 * takes only CPU time that nobody else wants; the thread's nice (MEMCOLO_MGMT_NICE) is
 * kept for when it goes back to SCHED_OTHER. With autogroups a runnable thread of the
 * process draws the group's weight to its CPU in proportion to its own weight: at nice
 * -10 on another CPU it left the application's CPU ~1/10 of the group's weight, and the
 * application waited 20-68 ms behind a spinner of another session (sched_switch). */
#define MC_BUSY_LOOKS 3
static void mgmt_set_idle(bool idle) {
  if ((int)idle == mc_mgmt_idle) return;
  struct sched_param sp = {0};
  int nice = 0;
  if (!idle) {
    errno = 0;
    nice = getpriority(PRIO_PROCESS, 0);
    if (errno != 0) nice = 0;
  }
  if (sched_setscheduler(0, idle ? SCHED_IDLE : SCHED_OTHER, &sp) != 0) return;
  if (!idle) setpriority(PRIO_PROCESS, 0, nice);
  mc_mgmt_idle = idle;
}

void mc_reserve_yield_point(void) {
  static uint64_t last_us, wait_since_us;
  static int64_t wait_exec_ns;
  static unsigned busy_looks;
  long limit_us = MC_OPT(MC_OPT_RSV_YIELD_US), wait_us = MC_OPT(MC_OPT_RSV_YIELD_WAIT_US);
  long mode = MC_OPT(MC_OPT_RSV_YIELD_MODE);
  pid_t tid = mc_rsv_client_tid;
  if (!mc_tl_is_mgmt || limit_us <= 0 || tid == 0) return;
  uint64_t now = mc_now_us();
  if (wait_us > 0 && now - last_us < 200) return;
  last_us = now;
  long cpu = -1;
  char st = client_state(tid, &cpu);
  if (mode == 3 && st != 0 && mc_fill_pool) {
    /* busy = runnable at MC_BUSY_LOOKS looks in a row (>= 200 us apart with a
     * YIELD_WAIT_US, else one pre-fault step): back to back, not a paced request */
    busy_looks = st == 'R' ? busy_looks + 1 : 0;
    mgmt_set_idle(busy_looks >= MC_BUSY_LOOKS);
    if (mc_mgmt_idle) return; /* the scheduler prefers the application to us now */
  }
  if (st != 'R') {
    wait_since_us = 0;
    if (st != 0) mgmt_restore_cpus(); /* it sleeps: its CPU is free for the fill again */
    return;
  }
  int mine = sched_getcpu();
  if (mine < 0 || cpu != mine) { wait_since_us = 0; return; }
  if (wait_us > 0) {
    int64_t ex = client_exec_ns(tid);
    if (wait_since_us == 0 || ex != wait_exec_ns) { /* waiting since (about) now */
      wait_since_us = now;
      wait_exec_ns = ex;
      return;
    }
    if (now - wait_since_us < (uint64_t)wait_us) return;
  }
  __atomic_fetch_add(&mc_rsv_yields, 1, __ATOMIC_RELAXED);
  if (mode == 1) {
    sched_yield();
  } else if (mode != 2 || !mgmt_leave_cpu(cpu)) {
    struct timespec ts = {(time_t)(limit_us / 1000000), (long)(limit_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
  }
  wait_since_us = 0;
  last_us = mc_now_us();
}

/* MEMCOLO_MGMT_SLICE_US: the calling thread's EEVDF slice (Linux >= 6.12 takes
 * sched_attr.sched_runtime of a SCHED_OTHER thread as its slice, clamped to 0.1-100 ms;
 * commit "sched/eevdf: Use sched_attr::sched_runtime to set request/slice suggestion").
 * Older kernels ignore or refuse it: nothing else changes. */
static void mgmt_set_slice(void) {
  long us = MC_OPT(MC_OPT_MGMT_SLICE_US);
  if (us <= 0) return;
  struct {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
  } a = {48, 0 /* SCHED_OTHER */, 0, 0, 0, (uint64_t)us * 1000, 0, 0};
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, 0);
  if (errno != 0) return;
  a.nice = nice;
  syscall(SYS_sched_setattr, 0, &a, 0);
}

/* Back-off (e), once per round: returns whether the thread is backed off now. */
static bool backoff_update(size_t large_demand, size_t block_bytes) {
  static uint64_t last_misses;
  static unsigned busy_miss_rounds, idle_rounds;
  long mode = MC_OPT(MC_OPT_RSV_BACKOFF);
  if (mode == 0) return false;
  uint64_t misses = __atomic_load_n(&mc_pool_misses, __ATOMIC_RELAXED);
  bool missed = misses > last_misses;
  last_misses = misses;
  pid_t tid = mc_pool_empty_tid;
  if (!mc_rsv_backoff) {
    bool empty = __atomic_load_n(&mc_pool_total_bytes, __ATOMIC_RELAXED) < block_bytes;
    if (!missed || !empty || tid == 0) { busy_miss_rounds = 0; return false; }
    bool busy = __atomic_load_n(&mc_pool_waiting, __ATOMIC_RELAXED) > 0 || thread_runnable(tid) == 1;
    busy_miss_rounds = busy ? busy_miss_rounds + 1 : 0;
    if (busy_miss_rounds >= 3) {
      mc_rsv_backoff = 1;
      mc_backoff_episodes++;
      busy_miss_rounds = idle_rounds = 0;
    }
    return mc_rsv_backoff;
  }
  mc_backoff_rounds++;
  bool busy = tid != 0 && (__atomic_load_n(&mc_pool_waiting, __ATOMIC_RELAXED) > 0 || thread_runnable(tid) != 0);
  idle_rounds = busy ? 0 : idle_rounds + 1;
  if (idle_rounds >= 2 || large_demand == 0) {
    mc_rsv_backoff = 0;
    idle_rounds = 0;
  }
  return mc_rsv_backoff;
}

/* The small spans' high-water mark over the last second, in 100 ms buckets: memory the
 * program held within it and gave back is still backed (the huge page cache keeps the
 * demand that left in the last 1-2 s, pageheap.c cache_insert), so only growth above
 * it is demand on the reserve. */
#define MC_SMALL_HW_BUCKETS 10
#define MC_SMALL_HW_BUCKET_MS 100

static void *mc_reserve_main(void *arg) {
  (void)arg;
  mc_tl_is_mgmt = 1;
  if (sched_getaffinity(0, sizeof(mc_mgmt_cpus), &mc_mgmt_cpus) != 0) CPU_ZERO(&mc_mgmt_cpus);
  mgmt_set_slice();
  uint64_t interval_us = (uint64_t)MC_OPT(MC_OPT_RESERVE_INTERVAL_US);
  double factor = (double)MC_OPT(MC_OPT_RSV_FACTOR_PCT) / 100.0;
  double trim_factor = (double)MC_OPT(MC_OPT_TRIM_FACTOR_PCT) / 100.0;
  size_t min_rsv = (size_t)MC_OPT(MC_OPT_MIN_RSV_BYTES);
  double avg_large_bytes = 0;
  uint64_t last_second_ms = mc_now_ms(), large_idle_intervals = 1u << 30;
  struct timespec ts = {.tv_sec = (time_t)(interval_us / 1000000u), .tv_nsec = (long)(interval_us % 1000000u) * 1000};
  struct timespec idle = {0, 50 * 1000 * 1000}; /* without reservation: periodic work only */
  size_t demand_last_interval = 0;
  uint64_t small_start = __atomic_load_n(&mc_small_span_bytes, __ATOMIC_RELAXED);
  uint64_t small_hw[MC_SMALL_HW_BUCKETS] = {0}, small_hw_epoch = mc_now_ms() / MC_SMALL_HW_BUCKET_MS;
  /* demand rates (bytes/us), exponentially weighted with time constant RATE_TAU_US */
  const double rate_tau_us = 32000.0;
  double horizon_us = (double)MC_OPT(MC_OPT_RSV_HORIZON_MS) * 1000.0;
  double rate_large = 0;
  uint64_t last_us = mc_now_us();
  while (mc_reserve_thread_running) {
    uint64_t resume = __atomic_load_n(&mc_resume_at_ms, __ATOMIC_ACQUIRE);
    if (resume != 0 && mc_now_ms() >= resume &&
        __atomic_compare_exchange_n(&mc_resume_at_ms, &resume, 0, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      mc_reserve_on = 1; /* the hold after a `top` notification is over */
    }
    if (!mc_reserve_on) {
      mgmt_set_priority(false);
      mc_rsv_backoff = 0;
      nanosleep(mc_resume_at_ms ? &ts : &idle, NULL);
      goto periodic;
    }
    /* small demand: how far the small spans in use rose in the interval above their
     * level at its start and their high-water mark of the last second (a span given
     * back and taken again is no demand) */
    uint64_t small_now = __atomic_load_n(&mc_small_span_bytes, __ATOMIC_RELAXED);
    uint64_t small_peak = __atomic_exchange_n(&mc_small_span_peak, small_now, __ATOMIC_RELAXED);
    if (small_peak < small_now) small_peak = small_now;
    uint64_t base = small_start, epoch = mc_now_ms() / MC_SMALL_HW_BUCKET_MS;
    if (epoch != small_hw_epoch) {
      for (uint64_t e = small_hw_epoch + 1; e <= epoch && e <= small_hw_epoch + MC_SMALL_HW_BUCKETS; e++)
        small_hw[e % MC_SMALL_HW_BUCKETS] = 0;
      small_hw_epoch = epoch;
    }
    for (unsigned i = 0; i < MC_SMALL_HW_BUCKETS; i++)
      if (small_hw[i] > base) base = small_hw[i];
    size_t small = small_peak > base ? (size_t)(small_peak - base) : 0;
    if (small_peak > small_hw[epoch % MC_SMALL_HW_BUCKETS]) small_hw[epoch % MC_SMALL_HW_BUCKETS] = small_peak;
    small_start = small_now;
    size_t large = __atomic_exchange_n(&mc_demand_large_bytes, 0, __ATOMIC_RELAXED);
    size_t nlarge = __atomic_exchange_n(&mc_demand_large_count, 0, __ATOMIC_RELAXED);
    demand_last_interval = small + large;
    mc_rsv_demand_total += small + large;
    uint64_t now_us = mc_now_us();
    double dt_us = now_us > last_us ? (double)(now_us - last_us) : 1.0;
    last_us = now_us;
    double w = dt_us / (dt_us + rate_tau_us);
    rate_large += w * ((double)large / dt_us - rate_large);
    if (nlarge) {
      double avg = (double)large / (double)nlarge;
      avg_large_bytes = avg_large_bytes == 0 ? avg : 0.5 * avg_large_bytes + 0.5 * avg;
      large_idle_intervals = 0;
    } else {
      large_idle_intervals++;
    }
    size_t block_pages = (size_t)(avg_large_bytes + (double)MC_PAGE_SIZE - 1) >> MC_PAGE_SHIFT;
    bool backed_off = backoff_update(large, block_pages << MC_PAGE_SHIFT);
    bool fill = !backed_off || MC_OPT(MC_OPT_RSV_BACKOFF) == 2;
    mgmt_set_priority(!backed_off);
    mc_heap_va_prepare(); /* address space ahead: allocations never wait in mmap */
    /* Algorithm 1: the main heap */
    /* Hermes' bound, no horizon here: with 100 ms of the demand rate the heap's reserve
     * reached 13-100 MiB on bursty small-object programs whose live memory was 3-10 MiB
     * (bench/alloc/bursty.c), and the memory a burst freed stayed resident up to
     * TRIM_THR = 4x that */
    size_t rsv = (size_t)(factor * (double)small);
    if (rsv < min_rsv) rsv = min_rsv;
    __atomic_store_n(&mc_rsv_target_bytes, rsv, __ATOMIC_RELAXED);
    int guard = 64, progress = 0;
    mgmt_set_idle(false);
    while (fill && mc_reserve_on && mc_heap_backed_free_bytes() + MC_HUGE_SIZE <= rsv && guard-- > 0) {
      if (!mc_heap_prefault_one_hugepage()) break;
      progress = 1;
      __atomic_fetch_add(&mc_prefaulted_bytes, MC_HUGE_SIZE, __ATOMIC_RELAXED);
      mc_reserve_yield_point();
    }
    /* Surplus: the heap's free backed memory above RSV_THR goes at once, beyond a huge
     * page of slack: whole free huge pages of the cache first, then the free pages of
     * huge pages in use, as periodic release takes them (never breaking a nearly full
     * huge page). Hermes keeps what lies between RSV_THR and TRIM_THR while demand goes
     * on (its hysteresis; TRIM_THR still bounds the pool): after a burst the target fell
     * back to min_rsv while the memory the burst used and freed stayed, undeclared, as
     * long as the program went on allocating. A program whose bursts never pause
     * (bench/alloc/bursty.c mstress, 4 threads) then ran with 1.86-2.1x glibc's peak RSS
     * outside the reservation on a quiet machine (5 runs: 24-27 MiB, glibc 12.9; the
     * reserve trace: 18.7 MiB free backed against a 5 MiB target to the end); whole
     * huge pages alone at once, 15-24 MiB; with their free pages, 14.7-16.0 MiB, but
     * with no slack a producer/consumer program's system time was 2-3x (each page
     * released is faulted again by the next fill); with a huge page of slack
     * 15.1-16.0 MiB and the system time as before. */
    size_t fb = mc_heap_backed_free_bytes();
    if (fb > rsv + MC_HUGE_SIZE) {
      size_t keep = rsv + MC_HUGE_SIZE, excess = fb - keep;
      pthread_mutex_lock(&mc_heap.lock);
      /* the cache keeps what `keep` leaves beside the free pages of huge pages in use,
       * in whole huge pages, rounded down */
      size_t cache = mc_heap.cache_backed_n * MC_HUGE_SIZE, other = fb > cache ? fb - cache : 0;
      size_t protect = keep > other ? (keep - other) / MC_HUGE_SIZE * MC_HUGE_SIZE : 0;
      size_t done = mc_heap_release_locked(excess, true, protect);
      if (done < excess) mc_heap_release_periodic_locked(excess - done, protect);
      pthread_mutex_unlock(&mc_heap.lock);
    }
    unlock_handed_out();
    /* Algorithm 2: the pool of large blocks */
    size_t pool_target = (size_t)(factor * (double)large);
    if ((double)pool_target < rate_large * horizon_us) pool_target = (size_t)(rate_large * horizon_us);
    if (large_idle_intervals < 500 && pool_target < min_rsv) pool_target = min_rsv; /* ~1 s of memory */
    mc_pool_target_bytes = pool_target;
    if (fill && block_pages > 0 && block_pages <= MC_REGION_PAGES && ((block_pages << MC_PAGE_SHIFT) >= MC_POOL_MIN_BYTES)) {
      guard = 256;
      mc_fill_pool = 1;
      while (mc_reserve_on && __atomic_load_n(&mc_pool_total_bytes, __ATOMIC_RELAXED) < pool_target && guard-- > 0) {
        mc_span_t *s = mc_heap_alloc(block_pages, MC_SPAN_LARGE, 0);
        if (s == NULL) break;
        mc_pagemap_set(s->start, NULL);
        pthread_mutex_lock(&mc_pool_lock);
        mc_pool_inflight_pages = block_pages;
        pthread_mutex_unlock(&mc_pool_lock);
        s->locked = mc_os_populate_locked((void *)s->start, block_pages << MC_PAGE_SHIFT);
        __atomic_fetch_add(&mc_prefaulted_bytes, block_pages << MC_PAGE_SHIFT, __ATOMIC_RELAXED);
        pool_push(s);
        progress = 1;
        mc_reserve_yield_point();
      }
      mc_fill_pool = 0;
    }
    pool_trim((size_t)(trim_factor * (double)pool_target));
    rsv_trace_add(mc_heap_backed_free_bytes(), rsv, __atomic_load_n(&mc_pool_total_bytes, __ATOMIC_RELAXED), pool_target,
                  mc_now_us() - now_us);
    /* behind on either reserve: go round again at once instead of sleeping */
    if (!progress || (mc_heap_backed_free_bytes() + MC_HUGE_SIZE > rsv &&
                      __atomic_load_n(&mc_pool_total_bytes, __ATOMIC_RELAXED) >= pool_target)) {
      mgmt_restore_cpus();
      nanosleep(&ts, NULL);
    }
  periodic:;
    uint64_t now = mc_now_ms();
    if (now - last_second_ms >= 1000) {
      last_second_ms = now;
      pthread_mutex_lock(&mc_heap.lock);
      mc_release_tick_locked(now, mc_reserve_target_bytes() + mc_pool_total_bytes);
      pthread_mutex_unlock(&mc_heap.lock);
      /* background THP (os.c): collapse dense huge pages, never while the reservation
       * is serving demand (it must keep up, and a collapse holds the mmap lock). With
       * the reservation (class lc) only free pre-faulted huge pages are collapsed, never
       * ones holding live allocations: the application's accesses to a huge page being
       * collapsed wait for the copy, and Redis under class lc, pinned to one CPU at 2,000
       * requests/s with no memory pressure, stalled 10-16 ms in most seconds (p99.9
       * 5.6-11 ms) against max 1.7-2.2 ms (p99.9 0.7-1.0 ms) without background THP
       * (bench colocation --levels 0 --modes alloc, 3 runs each). */
      /* (the reserve is full when no whole huge page fits below its target) */
      if (!mc_reserve_on) mc_heap_collapse_pass(20000, true, false);
      else if (demand_last_interval == 0 && mc_heap_backed_free_bytes() + MC_HUGE_SIZE > mc_reserve_target_bytes())
        mc_heap_collapse_pass(10000, false, true);
    }
  }
  return NULL;
}

/* Starts the management thread (once); false if it could not start. */
static volatile int mc_mgmt_no_autostart;
static bool mc_mgmt_start(void) {
  if (__atomic_exchange_n(&mc_reserve_thread_running, 1, __ATOMIC_ACQ_REL)) return true;
  if (!mc_thread_start(mc_reserve_main, 256 << 10)) {
    mc_reserve_thread_running = 0;
    return false;
  }
  return true;
}

/* Without the reservation, the management thread is started once the heap holds a few
 * huge pages, for the periodic release and background THP (small processes never
 * start it; a forked child never does by itself). */
int mc_mgmt_start_wanted;

void mc_mgmt_maybe_start(void) {
  if (mc_reserve_thread_running || mc_mgmt_no_autostart) return;
  if (!mc_os_thp_background()) return;
  if (!mc_mgmt_start()) mc_mgmt_no_autostart = 1;
}

/* Unit tests that move the release clock by hand (mc_fake_now_ms) and tick the
 * release themselves: a management thread started behind them would run the periodic
 * release on the same fake clock and change the free memory they count. */
void mc_mgmt_autostart_off(void) { mc_mgmt_no_autostart = 1; }

void mc_reserve_start(void) {
  mc_ensure_init();
  mc_reserve_on = 1;
  if (!mc_mgmt_start()) {
    mc_reserve_on = 0;
    mc_warn("could not start the reservation thread; running without reservation");
  }
}

/* `top` (M3 §5.1): the reservation goes, its pooled blocks return to the page heap, and
 * the management thread turns it back on hold_ms after the last such call. */
void mc_reserve_suspend(uint64_t hold_ms) {
  if (!mc_reserve_on && __atomic_load_n(&mc_resume_at_ms, __ATOMIC_ACQUIRE) == 0) return;
  __atomic_store_n(&mc_resume_at_ms, mc_now_ms() + (hold_ms ? hold_ms : 1), __ATOMIC_RELEASE);
  mc_reserve_on = 0;
  mc_pool_drain();
}

bool mc_reserve_suspended(void) { return __atomic_load_n(&mc_resume_at_ms, __ATOMIC_ACQUIRE) != 0; }

void mc_reserve_after_fork_child(void) {
  /* the management thread does not exist in the child */
  mc_reserve_thread_running = 0;
  mc_reserve_on = 0;
  mc_resume_at_ms = 0;
  mc_mgmt_no_autostart = 1;
  pthread_mutex_init(&mc_pool_lock, NULL);
  pthread_cond_init(&mc_pool_pushed, NULL);
  mc_pool_inflight_pages = 0;
  mc_tl_tid = 0; /* this thread's id in the child is not the parent's */
  mc_rsv_client_tid = 0;
  mc_mgmt_idle = 0;
}

void mc_reserve_stats(memcolo_stats_t *st) {
  st->reservation_on = (uint32_t)mc_reserve_on;
  st->reserve_target_bytes = mc_reserve_target_bytes();
  st->prefaulted_bytes = mc_prefaulted_bytes;
  st->pool_bytes = mc_pool_total_bytes;
  st->pool_hits = mc_pool_hits;
  st->pool_misses = mc_pool_misses;
}

MC_EXPORT int memcolo_set_reservation(int on) {
  int prev = mc_reserve_on;
  __atomic_store_n(&mc_resume_at_ms, 0, __ATOMIC_RELEASE);
  if (on) mc_reserve_start();
  else { mc_reserve_on = 0; mc_pool_drain(); }
  return prev;
}
