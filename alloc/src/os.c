/* os.c — the OS layer: anonymous mappings aligned to 2 MiB huge pages, transparent
 * huge pages (THP), release (MADV_DONTNEED), pre-faulting (MADV_POPULATE_WRITE, Linux >=
 * 5.14; falls back to touching each page) and optional mlock. Failures of the optional
 * calls degrade to plain faulting with a single warning; only mmap failure is an error.
 *
 * THP and the allocation path. A huge page faulted by the application costs the
 * allocation the kernel's whole huge page allocation: zeroing 2 MiB and, with
 * /sys/kernel/mm/transparent_hugepage/defrag at `madvise` (the common default) on a
 * MADV_HUGEPAGE region, direct compaction; in a VM whose host takes back idle guest
 * memory, also the host's faults on 2 MiB of fresh memory (milliseconds here). So in
 * the default mode (MEMCOLO_THP=1, "background") heap memory is never MADV_HUGEPAGE on
 * the allocation path: the application faults 4 KiB pages (or finds them pre-faulted
 * by the reservation), and the management thread turns dense, resident huge pages into
 * THPs with MADV_COLLAPSE (Linux >= 6.1), off every allocation's path. With THP
 * `enabled` = always, heap memory is mapped MADV_NOHUGEPAGE (or the kernel would fault
 * huge pages anyway) and a collapse flips the range to MADV_HUGEPAGE around the call.
 * Where MADV_COLLAPSE is missing, memory is MADV_HUGEPAGE'd at mmap when `defrag` does
 * not compact on faults (`defer`, `never`), and left to 4 KiB pages otherwise.
 * MEMCOLO_THP=2 is the plain design (MADV_HUGEPAGE at mmap: huge pages at first touch,
 * stalls included); 0 never asks for huge pages.
 *
 * Refusals. mmap can fail for a moment without the system being out of memory: under
 * pressure in the process's memory cgroup the kernel's own allocations for a new
 * mapping (its VMA and maple tree nodes, charged to the cgroup) fail with ENOMEM until
 * reclaim catches up, and EAGAIN/EINTR are transient by definition. One such failure
 * used to become a NULL from malloc (CPython died at start-up with MemoryError:
 * test/faults.sh injects it). So every mapping is retried MC_OS_MAP_TRIES times with a
 * short backoff (about 30 ms in all) before it counts as refused; a refusal is counted
 * (memcolo_stats' os_refusals) and, with MEMCOLO_VERBOSE=1, said on stderr with the
 * errno. Optional calls (THP advice, pre-faulting, mlock, MADV_COLLAPSE) never make an
 * allocation fail, and their transient errors are not taken for missing support. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/* pre-faulting goes in steps of this much: between steps, the management thread may step
 * aside for the application (reserve.c, mc_reserve_yield_point); ~60-100 us each here */
#define MC_POPULATE_STEP ((size_t)256 << 10)

/* The length of the pre-fault step at `off` of `bytes`; before every step but the
 * first, the management thread's yield point. */
static size_t populate_step(size_t bytes, size_t off) {
  if (off) mc_reserve_yield_point();
  return bytes - off < MC_POPULATE_STEP ? bytes - off : MC_POPULATE_STEP;
}

/* mmap tries before a refusal, and the sleep before each retry (us, doubling) */
#define MC_OS_MAP_TRIES 6
#define MC_OS_MAP_BACKOFF_US 1000

uint64_t mc_os_refusals; /* mappings refused after every retry */

static void os_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* One line on stderr (MEMCOLO_VERBOSE=1), for the first 8 refusals: what was refused,
 * how large, the errno, after how many tries. */
static void os_refused(const char *what, size_t bytes, int err) {
  uint64_t n = __atomic_add_fetch(&mc_os_refusals, 1, __ATOMIC_RELAXED);
  if (!MC_OPT(MC_OPT_VERBOSE) || n > 8) return;
  static const char *const parts[] = {"memcolo: warning: the system refused ", " of ", " bytes (errno ",
                                      ") after ", " tries; the allocation returns NULL\n"};
  char b[4][24];
  mc_fmt_u64(b[1], (uint64_t)bytes);
  mc_fmt_u64(b[2], (uint64_t)err);
  mc_fmt_u64(b[3], MC_OS_MAP_TRIES);
  mc_write_str(2, parts[0]);
  mc_write_str(2, what);
  mc_write_str(2, parts[1]);
  mc_write_str(2, b[1]);
  mc_write_str(2, parts[2]);
  mc_write_str(2, b[2]);
  mc_write_str(2, parts[3]);
  mc_write_str(2, b[3]);
  mc_write_str(2, parts[4]);
}

/* An anonymous private mapping of len bytes (prot, MAP_NORESERVE), tried up to `tries`
 * times with backoff while the kernel says ENOMEM, EAGAIN or EINTR; NULL (errno set)
 * when refused, counted and said (os_refused) unless `what` is NULL (the caller has a
 * fallback). */
static void *os_mmap(size_t len, int prot, const char *what, int tries) {
  long backoff = MC_OS_MAP_BACKOFF_US / 8;
  int err = 0;
  for (int t = 0; t < tries; t++) {
    if (t) { os_sleep_us(backoff); backoff *= 2; }
    void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) return p;
    err = errno;
    if (err != ENOMEM && err != EAGAIN && err != EINTR) break;
  }
  if (what != NULL) os_refused(what, len, err);
  errno = err;
  return NULL;
}

static int mc_warned_thp, mc_warned_populate, mc_warned_mlock, mc_warned_collapse;
static volatile int mc_populate_works = 1, mc_mlock_works = 1;
static pthread_mutex_t mc_meta_lock = PTHREAD_MUTEX_INITIALIZER;

/* what mappings get, decided once (mc_os_thp_init) */
static int mc_thp_map_advice;       /* 0, MADV_HUGEPAGE or MADV_NOHUGEPAGE at mmap */
static volatile int mc_thp_collapse; /* 1: the management thread collapses huge pages */
static int mc_thp_flip;             /* collapse flips NOHUGEPAGE -> HUGEPAGE -> NOHUGEPAGE */
static int mc_thp_fault_time;       /* huge pages come at first touch (intact == THP) */

/* the [bracketed] word of a /sys/kernel/mm/transparent_hugepage file, or "" */
static void read_thp_setting(const char *path, char *out, size_t cap) {
  char buf[128];
  out[0] = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return;
  buf[n] = 0;
  char *a = strchr(buf, '['), *b = a ? strchr(a, ']') : NULL;
  if (a == NULL || b == NULL || (size_t)(b - a - 1) >= cap) return;
  memcpy(out, a + 1, (size_t)(b - a - 1));
  out[b - a - 1] = 0;
}

void mc_os_thp_init(void) {
  char enabled[32], defrag[32];
  read_thp_setting("/sys/kernel/mm/transparent_hugepage/enabled", enabled, sizeof(enabled));
  read_thp_setting("/sys/kernel/mm/transparent_hugepage/defrag", defrag, sizeof(defrag));
  long mode = MC_OPT(MC_OPT_THP);
  if (mode == 0 || strcmp(enabled, "never") == 0 || enabled[0] == 0) {
    /* no THP: with `always`, keep the kernel from faulting huge pages behind our back */
    mc_thp_map_advice = strcmp(enabled, "always") == 0 ? MADV_NOHUGEPAGE : 0;
    return;
  }
  if (mode == 2) {
    mc_thp_map_advice = MADV_HUGEPAGE;
    mc_thp_fault_time = 1;
    return;
  }
  mc_thp_collapse = 1;
  if (strcmp(enabled, "always") == 0) {
    mc_thp_map_advice = MADV_NOHUGEPAGE;
    mc_thp_flip = 1;
  }
  (void)defrag;
}

/* 1 if the running kernel is at least major.minor (uname), 0 if older, -1 if unknown */
static int kernel_at_least(int major, int minor) {
  struct utsname u;
  if (uname(&u) != 0) return -1;
  const char *c = u.release;
  int v[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    if (*c < '0' || *c > '9') return -1;
    while (*c >= '0' && *c <= '9') v[i] = v[i] * 10 + (*c++ - '0');
    if (i == 0 && *c++ != '.') return -1;
  }
  return v[0] > major || (v[0] == major && v[1] >= minor);
}

/* MADV_COLLAPSE said EINVAL. On Linux >= 6.1 that is about the range (a VMA that
 * cannot hold a THP now), and EAGAIN, EBUSY, ENOMEM are transient (the huge page
 * allocation or the isolation of a page failed): the next pass tries again. Only a
 * kernel older than 6.1 lacks the advice; then collapsing stops, and with `defrag` at
 * defer or never, huge pages come at first touch instead. */
static void collapse_failed(int err) {
  if (err != EINVAL || kernel_at_least(6, 1) != 0) return;
  char defrag[32];
  mc_thp_collapse = 0;
  read_thp_setting("/sys/kernel/mm/transparent_hugepage/defrag", defrag, sizeof(defrag));
  if (strcmp(defrag, "defer") == 0 || strcmp(defrag, "never") == 0) {
    /* faults do not compact: huge pages at first touch are cheap enough */
    mc_thp_map_advice = MADV_HUGEPAGE;
    mc_thp_fault_time = 1;
    mc_os_warn_once(&mc_warned_collapse, "MADV_COLLAPSE not supported (Linux < 6.1); huge pages at first touch", err);
  } else {
    mc_os_warn_once(&mc_warned_collapse, "MADV_COLLAPSE not supported (Linux < 6.1) and THP faults would compact; no huge pages", err);
  }
}

bool mc_os_thp_background(void) { return mc_thp_collapse; }
bool mc_os_thp_at_fault(void) { return mc_thp_fault_time; }

/* Makes the huge page at p (2 MiB-aligned) a THP; the range is populated as a whole.
 * Blocks for the kernel's huge page allocation: call it from the management thread. */
uint64_t mc_os_collapse_calls;

bool mc_os_collapse(void *p) {
  if (!mc_thp_collapse) return false;
  __atomic_fetch_add(&mc_os_collapse_calls, 1, __ATOMIC_RELAXED);
  if (mc_thp_flip) madvise(p, MC_HUGE_SIZE, MADV_HUGEPAGE);
  int rc = madvise(p, MC_HUGE_SIZE, MADV_COLLAPSE);
  int err = rc != 0 ? errno : 0;
  if (mc_thp_flip) madvise(p, MC_HUGE_SIZE, MADV_NOHUGEPAGE);
  if (rc != 0) collapse_failed(err);
  return rc == 0;
}

/* resident 4 KiB pages of the huge page at p (mincore), 0 on error */
unsigned mc_os_resident_pages(void *p) {
  unsigned char vec[MC_HP_PAGES];
  if (mincore(p, MC_HUGE_SIZE, vec) != 0) return 0;
  unsigned n = 0;
  for (unsigned i = 0; i < MC_HP_PAGES; i++) n += vec[i] & 1;
  return n;
}

/* The first time only, and only with MEMCOLO_VERBOSE=1: nothing on the program's
 * stderr unless asked for. */
void mc_os_warn_once(int *flag, const char *msg, long err) {
  if (__atomic_exchange_n(flag, 1, __ATOMIC_RELAXED) || !MC_OPT(MC_OPT_VERBOSE)) return;
  char buf[32];
  mc_write_str(2, "memcolo: warning: ");
  mc_write_str(2, msg);
  mc_write_str(2, " (errno ");
  mc_fmt_u64(buf, (uint64_t)err);
  mc_write_str(2, buf);
  mc_write_str(2, "); continuing with plain page faults\n");
}

static void *map_huge(size_t bytes, bool fallible) {
  size_t len = bytes + MC_HUGE_SIZE;
  void *p = fallible ? os_mmap(len, PROT_READ | PROT_WRITE, NULL, 1)
                     : os_mmap(len, PROT_READ | PROT_WRITE, "a mapping", MC_OS_MAP_TRIES);
  if (p == NULL) return NULL;
  uintptr_t a = (uintptr_t)p;
  uintptr_t aligned = (a + MC_HUGE_SIZE - 1) & ~(uintptr_t)(MC_HUGE_SIZE - 1);
  if (aligned > a) munmap(p, aligned - a);
  uintptr_t end = a + len, want_end = aligned + bytes;
  if (end > want_end) munmap((void *)want_end, end - want_end);
  if (mc_thp_map_advice != 0 && madvise((void *)aligned, bytes, mc_thp_map_advice) != 0) {
    mc_os_warn_once(&mc_warned_thp, "MADV_HUGEPAGE/NOHUGEPAGE failed (no THP?)", errno);
  }
  __atomic_fetch_add(&mc_heap.os_mmap_calls, 1, __ATOMIC_RELAXED);
  return (void *)aligned;
}

void *mc_os_map_huge(size_t bytes) { return map_huge(bytes, false); }
void *mc_os_map_huge_try(size_t bytes) { return map_huge(bytes, true); }

void mc_os_unmap(void *p, size_t bytes) {
  if (bytes) munmap(p, bytes);
}

void mc_os_release(void *p, size_t bytes) {
  if (bytes == 0) return;
  if (MC_OPT(MC_OPT_MLOCK) && mc_mlock_works) munlock(p, bytes);
  madvise(p, bytes, MADV_DONTNEED);
}

/* Pre-faults [p, p+bytes) and mlocks it (Hermes §4: reserved memory is never swapped
 * out before it is used) when MEMCOLO_MLOCK is on and mlock works; true if locked. The
 * caller munlocks (mc_os_unlock) when the memory is handed out. mlock needs
 * CAP_IPC_LOCK or room in RLIMIT_MEMLOCK; the first failure turns it off with a warning. */
bool mc_os_populate_locked(void *p, size_t bytes) {
  if (bytes == 0) return false;
  if (MC_OPT(MC_OPT_MLOCK) && mc_mlock_works) {
    size_t off = 0;
    for (; off < bytes; off += MC_POPULATE_STEP) /* mlock faults the pages in */
      if (mlock((char *)p + off, populate_step(bytes, off)) != 0) break;
    if (off >= bytes) return true;
    int err = errno;
    if (off) munlock(p, off);
    /* EAGAIN: some pages could not be locked now (pressure); this block is only
     * pre-faulted. ENOMEM, EPERM: over RLIMIT_MEMLOCK or not permitted, for good. */
    if (err != EAGAIN) {
      mc_mlock_works = 0;
      mc_os_warn_once(&mc_warned_mlock, "mlock of reserved memory failed (RLIMIT_MEMLOCK?)", err);
    }
  }
  mc_os_populate(p, bytes);
  return false;
}

void mc_os_unlock(void *p, size_t bytes) {
  if (bytes && mc_mlock_works) munlock(p, bytes);
}

/* Pre-faults [p, p+bytes): MADV_POPULATE_WRITE, or a write to each page; in steps of
 * MC_POPULATE_STEP with the management thread's yield point between them (reserve.c:
 * it steps aside while the application waits for its CPU). */
void mc_os_populate(void *p, size_t bytes) {
  if (bytes == 0) return;
  size_t off = 0;
  if (mc_populate_works) {
    for (; off < bytes; off += MC_POPULATE_STEP) {
      if (madvise((char *)p + off, populate_step(bytes, off), MADV_POPULATE_WRITE) == 0) continue;
      /* EINVAL means a kernel without the advice (< 5.14) only there; otherwise the
       * failure is this range's, now (ENOMEM, EFAULT, EINTR, EAGAIN under pressure) */
      if ((errno == EINVAL || errno == ENOSYS) && kernel_at_least(5, 14) == 0) {
        mc_populate_works = 0;
        mc_os_warn_once(&mc_warned_populate, "MADV_POPULATE_WRITE not supported", errno);
        break;
      }
      return; /* ENOMEM/EFAULT under pressure: leave the rest to demand faults */
    }
    if (off >= bytes) return;
  }
  /* fallback: write each page (the memory is free and ours) */
  for (; off < bytes; off += MC_PAGE_SIZE) {
    volatile char *c = (volatile char *)p + off;
    *c = 0;
  }
}

void *mc_os_remap(void *p, size_t old_bytes, size_t new_bytes) {
  /* reserve a 2 MiB-aligned hole, then move the pages there without copying */
  size_t len = new_bytes + MC_HUGE_SIZE;
  void *hole = os_mmap(len, PROT_NONE, NULL, 1);
  if (hole == NULL) return NULL;
  uintptr_t a = (uintptr_t)hole;
  uintptr_t aligned = (a + MC_HUGE_SIZE - 1) & ~(uintptr_t)(MC_HUGE_SIZE - 1);
  void *q = mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)aligned);
  if (q == MAP_FAILED) { munmap(hole, len); return NULL; }
  if (aligned > a) munmap(hole, aligned - a);
  uintptr_t end = a + len, want_end = aligned + new_bytes;
  if (end > want_end) munmap((void *)want_end, end - want_end);
  if (mc_thp_map_advice != 0) madvise(q, new_bytes, mc_thp_map_advice);
  return q;
}

/* Internal metadata: bump allocation from 2 MiB chunks, zeroed, never returned. */
void *mc_os_meta_alloc(size_t bytes) {
  static uintptr_t cur, end;
  bytes = (bytes + 63) & ~(size_t)63;
  pthread_mutex_lock(&mc_meta_lock);
  if (cur + bytes > end) {
    size_t chunk = bytes > MC_HUGE_SIZE ? ((bytes + MC_HUGE_SIZE - 1) & ~(MC_HUGE_SIZE - 1)) : MC_HUGE_SIZE;
    void *p = os_mmap(chunk, PROT_READ | PROT_WRITE, "metadata", MC_OS_MAP_TRIES);
    if (p == NULL) { pthread_mutex_unlock(&mc_meta_lock); return NULL; }
    cur = (uintptr_t)p;
    end = cur + chunk;
  }
  void *r = (void *)cur;
  cur += bytes;
  pthread_mutex_unlock(&mc_meta_lock);
  return r;
}
