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
 * stalls included); 0 never asks for huge pages. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
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

/* A collapse succeeded: the kernel has MADV_COLLAPSE, and a later EINVAL is about
 * that range (a VM_NOHUGEPAGE area, say), not about the advice. */
static int mc_collapse_worked;

/* MADV_COLLAPSE failed with EINVAL before any had succeeded: no such advice
 * (Linux < 6.1) */
static void collapse_unsupported(long err) {
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
bool mc_os_collapse(void *p) {
  if (!mc_thp_collapse) return false;
  if (mc_thp_flip) madvise(p, MC_HUGE_SIZE, MADV_HUGEPAGE);
  int rc = madvise(p, MC_HUGE_SIZE, MADV_COLLAPSE);
  int err = rc != 0 ? errno : 0;
  if (mc_thp_flip) madvise(p, MC_HUGE_SIZE, MADV_NOHUGEPAGE);
  if (rc == 0) __atomic_store_n(&mc_collapse_worked, 1, __ATOMIC_RELAXED);
  else if (err == EINVAL && !__atomic_load_n(&mc_collapse_worked, __ATOMIC_RELAXED))
    collapse_unsupported(err);
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

void mc_os_warn_once(int *flag, const char *msg, long err) {
  if (__atomic_exchange_n(flag, 1, __ATOMIC_RELAXED)) return;
  char buf[32];
  mc_write_str(2, "memcolo: warning: ");
  mc_write_str(2, msg);
  mc_write_str(2, " (errno ");
  mc_fmt_u64(buf, (uint64_t)err);
  mc_write_str(2, buf);
  mc_write_str(2, "); continuing with plain page faults\n");
}

void *mc_os_map_huge(size_t bytes) {
  size_t len = bytes + MC_HUGE_SIZE;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
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
    mc_mlock_works = 0;
    mc_os_warn_once(&mc_warned_mlock, "mlock of reserved memory failed (RLIMIT_MEMLOCK?)", err);
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
      if (errno == EINVAL || errno == ENOSYS) {
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
  void *hole = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (hole == MAP_FAILED) return NULL;
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
    void *p = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { pthread_mutex_unlock(&mc_meta_lock); return NULL; }
    cur = (uintptr_t)p;
    end = cur + chunk;
  }
  void *r = (void *)cur;
  cur += bytes;
  pthread_mutex_unlock(&mc_meta_lock);
  return r;
}
