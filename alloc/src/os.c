/* os.c — the OS layer: anonymous mappings aligned to 2 MiB huge pages, MADV_HUGEPAGE,
 * release (MADV_DONTNEED), pre-faulting (MADV_POPULATE_WRITE, Linux >= 5.14; falls back
 * to touching each page) and optional mlock. Failures of the optional calls degrade
 * to plain faulting with a single warning; only mmap failure is an error (NULL). */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static int mc_warned_thp, mc_warned_populate, mc_warned_mlock;
static volatile int mc_populate_works = 1, mc_mlock_works = 1;
static pthread_mutex_t mc_meta_lock = PTHREAD_MUTEX_INITIALIZER;

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
  if (MC_OPT(MC_OPT_THP) && madvise((void *)aligned, bytes, MADV_HUGEPAGE) != 0) {
    mc_os_warn_once(&mc_warned_thp, "MADV_HUGEPAGE failed (no THP?)", errno);
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

void mc_os_populate(void *p, size_t bytes) {
  if (bytes == 0) return;
  if (MC_OPT(MC_OPT_MLOCK) && mc_mlock_works) {
    if (mlock(p, bytes) == 0) return; /* mlock faults the pages in */
    mc_mlock_works = 0;
    mc_os_warn_once(&mc_warned_mlock, "mlock of reserved memory failed (RLIMIT_MEMLOCK?)", errno);
  }
  if (mc_populate_works) {
    if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
    if (errno == EINVAL || errno == ENOSYS) {
      mc_populate_works = 0;
      mc_os_warn_once(&mc_warned_populate, "MADV_POPULATE_WRITE not supported", errno);
    } else {
      return; /* ENOMEM/EFAULT under pressure: leave the rest to demand faults */
    }
  }
  /* fallback: write each page (the memory is free and ours) */
  for (size_t off = 0; off < bytes; off += MC_PAGE_SIZE) {
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
  if (MC_OPT(MC_OPT_THP)) madvise(q, new_bytes, MADV_HUGEPAGE);
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
