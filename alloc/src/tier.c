/* tier.c — tiered regions (MaxMem §3.3, libMaxMem): large anonymous mappings handed
 * to the memcolo agent, which keeps their hot pages in local memory and the rest in
 * a slow tier (compressed memory, a memory server), through userfaultfd.
 *
 * Opt in with MEMCOLO_TIER=1. Then an mmap(NULL, len, PROT_READ|PROT_WRITE,
 * MAP_PRIVATE|MAP_ANONYMOUS[|MAP_NORESERVE], -1, 0) called by the program (not by
 * libmemcolo itself) with len >= MEMCOLO_TIER_THRESHOLD (default 1g, as the paper) is
 * backed by a memfd mapped MAP_SHARED (so the agent can read pages out and punch them
 * out of memory), registered with a new userfaultfd (MISSING + WP), and both
 * descriptors are sent to the agent's tiering socket with SCM_RIGHTS
 * (docs/protocol.md §11: tier_register). If anything fails (no agent, no
 * userfaultfd permission), the call falls back to a plain mapping: tiering is never
 * a reason for mmap to fail.
 *
 * Semantics the program relies on, on a tiered region:
 *   - zero fill: untouched pages read as zeros (the agent maps zero pages);
 *   - madvise(MADV_DONTNEED | MADV_FREE | MADV_REMOVE): becomes MADV_REMOVE (hole
 *     punched in the memfd, and a UFFD remove event the agent reads before the call
 *     returns), so the pages read as zeros afterwards, as on private memory;
 *   - munmap of the whole region: tier_unregister, answered once the agent stopped
 *     managing it; of a part: MADV_REMOVE of that part, then the unmap;
 *   - mremap: refused with ENOMEM and one warning (realloc falls back to a copy);
 *   - fork: the region is MADV_DONTFORK — a MAP_SHARED memfd would otherwise be
 *     shared with the child instead of copied — so the child does not inherit it
 *     (an access there is a SIGSEGV), said once on stderr in the child.
 * Each region also gets a shadow memfd (its length plus a control page; see "the
 * shadow" below), sent as a third descriptor: the agent keeps there the copies of
 * pages it unmaps for sampling, and the process journals its removals there, so that
 * a region whose slow tier outlives the agent (a memory server: the agent answers
 * "durable") survives the agent's death. If the agent's connection closes without
 * "tier_released" (the agent died holding pages of the process's regions): with
 * every region durable, faults wait on the userfaultfd this library kept, and the
 * regions are handed to the next agent that listens with "tier_recover" (the same
 * descriptors and region id; MEMCOLO_TIER_RECOVER_S, default 60 s); otherwise, or
 * when that fails or times out, the process is stopped (SIGKILL) with the reason on
 * stderr: its evicted pages are gone with the agent and it must never read zeros in
 * their place. After "tier_released" (a clean stop: the agent brought every page
 * back first) the regions are plain shared memory, and the library hands each one to
 * the next agent that listens (retrying 100 ms doubling to 5 s): a new userfaultfd,
 * the same memfd, the target the old agent last had (tier_released carries it), and
 * the new agent takes the pages it finds there as resident. A region partly unmapped
 * meanwhile, or refused by the new agent, stays plain.
 *
 * Options (environment; defined in options.c's table, documented in README.md):
 * MEMCOLO_TIER, MEMCOLO_TIER_THRESHOLD, MEMCOLO_TIER_RECOVER_S, MEMCOLO_T_MISS,
 * MEMCOLO_TIER_SOCKET (by default tier.sock beside MEMCOLO_SOCKET), MEMCOLO_VERBOSE.
 *
 * The file keeps no allocator state (of the library it uses only options.c, which
 * needs nothing but libc): tier.c and options.c may be built alone as a preload
 * library (bench/tiering's tests do). It never calls malloc; mmap and friends of its
 * own go straight to the system calls. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#ifndef MADV_REMOVE
#define MADV_REMOVE 9
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MC_TIER_API __attribute__((visibility("default")))
#define MC_TIER_MAX_REGIONS 64
#define MC_TIER_PAGE 4096UL

typedef struct {
  uintptr_t start;
  size_t len;
  size_t unmapped;  /* bytes unmapped piecewise */
  int uffd;         /* kept open: faults wait, never see zeros, if the agent dies */
  int memfd;        /* kept open: handed to the next agent after a clean stop */
  int shadow;       /* the region's shadow memfd (len + one control page), -1 if none */
  unsigned char *journal; /* the shadow's control page, mapped here; NULL if none */
  uint64_t id;      /* the agent's id of the region (its key in the slow tier) */
  uint64_t slow_instance; /* which incarnation of the slow tier holds its pages */
  int durable;      /* the agent said its pages outlive it: recover it after a crash */
  int recover;      /* its agent died: to be handed to the next one with tier_recover */
  int managed;      /* 0 once the agent released it: plain shared memory */
  int stay_plain;   /* not handed over again (an agent refused it, or part was unmapped) */
  int used;
} mc_tier_region_t;

static struct {
  int enabled, verbose;
  size_t threshold;
  char t_miss[32];
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  uintptr_t self_lo, self_hi;
  pthread_mutex_t lock;     /* the region table, the connection */
  pthread_mutex_t req_lock; /* one request at a time */
  pthread_mutex_t handover_lock; /* a region handed over again vs. its munmap (taken first) */
  pthread_cond_t reply_cv;
  int fd;                   /* the tiering socket, -1 when not connected */
  unsigned long gen;        /* connection generation */
  char reply[512];
  int reply_ready;
  int released;
  int recovering;           /* a thread runs recover_regions() */
  unsigned recover_s;       /* MEMCOLO_TIER_RECOVER_S: how long to wait for a new agent */
  int nregions;
  int warned_mremap, warned_connect;
  mc_tier_region_t regions[MC_TIER_MAX_REGIONS];
} T = {.fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER, .req_lock = PTHREAD_MUTEX_INITIALIZER,
       .handover_lock = PTHREAD_MUTEX_INITIALIZER, .reply_cv = PTHREAD_COND_INITIALIZER};

/* ---------------------------------------------------------------- system calls */

static void *raw_mmap(void *a, size_t l, int p, int f, int fd, off_t o) {
  return (void *)syscall(SYS_mmap, a, l, p, f, fd, o);
}
static int raw_munmap(void *a, size_t l) { return (int)syscall(SYS_munmap, a, l); }
static int raw_madvise(void *a, size_t l, int adv) { return (int)syscall(SYS_madvise, a, l, adv); }

static void say(const char *fmt, ...) {
  if (!T.verbose) return;
  char buf[400];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) {
    if (n > (int)sizeof buf - 1) n = sizeof buf - 1;
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
  }
}

/* ------------------------------------------------------------ who is calling */

static int find_self(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  uintptr_t me = (uintptr_t)data, lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if (a < lo) lo = a;
    if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
  }
  if (me >= lo && me < hi) {
    T.self_lo = lo;
    T.self_hi = hi;
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- the shadow */

/* A region's shadow (crates/memcolo-tier/src/shadow.rs): a memfd of the region's
 * length plus one control page. The agent writes there the copies of pages it unmaps
 * for sampling, and the control page is the remove journal: before an madvise that
 * frees pages of a durable region, the range goes to a free slot (state 0 -> 1,
 * range, -> 2 with release order), and the agent frees the slot once the range's
 * copies are dropped. A new agent taking the region over after a crash applies the
 * slots still pending, so a copy the dead agent had not dropped yet is never brought
 * back. Little-endian, as the agent reads it. */
#define MC_SHADOW_SLOTS 64
#define MC_SHADOW_SLOT0 64
#define MC_SHADOW_SLOT_BYTES 32

/* A new shadow for a region of len bytes: 0 with the memfd and its mapped control
 * page, -1 (nothing left open) on failure. */
static int shadow_create(size_t len, int *fd_out, unsigned char **journal_out) {
  int fd = (int)syscall(SYS_memfd_create, "memcolo-shadow", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)(len + MC_TIER_PAGE)) != 0) { close(fd); return -1; }
  /* The agent maps the control page: it refuses a shadow this process could shrink
   * under that mapping (which would crash the agent with SIGBUS). */
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) { close(fd); return -1; }
  void *j = raw_mmap(NULL, MC_TIER_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)len);
  if (j == MAP_FAILED) { close(fd); return -1; }
  uint64_t slots = MC_SHADOW_SLOTS;
  memcpy(j, "MCSHADW1", 8);
  memcpy((char *)j + 8, &slots, 8);
  *fd_out = fd;
  *journal_out = j;
  return 0;
}

/* Journals the removal of region offsets [first, end) (page aligned: the kernel
 * removes whole pages) before its madvise; returns the slot, or NULL if none is free
 * (the agent clears them as it reads the remove events, so that means it is far
 * behind): the removal still happens; only an agent crash before it handled that
 * event could then bring back the range's old copies. */
static uint64_t *journal_remove(unsigned char *j, uint64_t first, uint64_t end) {
  static int warned;
  for (int k = 0; k < MC_SHADOW_SLOTS; k++) {
    uint64_t *slot = (uint64_t *)(j + MC_SHADOW_SLOT0 + MC_SHADOW_SLOT_BYTES * k);
    uint64_t free_state = 0;
    if (__atomic_compare_exchange_n(&slot[0], &free_state, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      slot[1] = first;
      slot[2] = end;
      __atomic_store_n(&slot[0], 2, __ATOMIC_RELEASE);
      return slot;
    }
  }
  if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    say("memcolo: the remove journal of a tiered region is full; a removal goes unjournaled\n");
  return NULL;
}

/* MADV_REMOVE of [lo, hi) in a region starting at rs, journaled first when the
 * region has a journal. An madvise refused outright (EINVAL, EACCES: no remove event
 * was raised, so the agent never saw the slot) takes its slot back: a pending slot
 * would make a new agent free pages that were never freed. (ENOMEM: the mapped parts
 * were removed, the rest is not mapped.) */
/* Journal pages are unmapped (a whole region's munmap) under the write side; writers
 * of slots hold the read side and check first that the page is still the region's:
 * an madvise racing a munmap of the same region then skips the journal instead of
 * writing into an unmapped page. Never held across the madvise itself. */
static pthread_rwlock_t journal_lock = PTHREAD_RWLOCK_INITIALIZER;

static mc_tier_region_t *find(uintptr_t a, size_t len);

/* Whether journal is still the control page of the region holding lo; the read side
 * of journal_lock held. */
static int journal_live(unsigned char *journal, uintptr_t lo) {
  pthread_mutex_lock(&T.lock);
  mc_tier_region_t *r = find(lo, 1);
  int live = r != NULL && r->journal == journal;
  pthread_mutex_unlock(&T.lock);
  return live;
}

static int remove_range(unsigned char *journal, uintptr_t rs, uintptr_t lo, uintptr_t hi) {
  uint64_t *slot = NULL;
  if (hi <= lo) return raw_madvise((void *)lo, 0, MADV_REMOVE);
  if (journal != NULL && (lo & (MC_TIER_PAGE - 1)) == 0) {
    pthread_rwlock_rdlock(&journal_lock);
    if (journal_live(journal, lo))
      slot = journal_remove(journal, lo - rs, ((hi + MC_TIER_PAGE - 1) & ~(MC_TIER_PAGE - 1)) - rs);
    pthread_rwlock_unlock(&journal_lock);
  }
  int rc = raw_madvise((void *)lo, hi - lo, MADV_REMOVE);
  if (rc != 0 && slot != NULL && errno != ENOMEM) {
    int e = errno;
    uint64_t pending = 2;
    pthread_rwlock_rdlock(&journal_lock);
    if (journal_live(journal, lo))
      __atomic_compare_exchange_n(&slot[0], &pending, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&journal_lock);
    errno = e;
  }
  return rc;
}

static void shadow_close(mc_tier_region_t *r) {
  if (r->journal != NULL) {
    pthread_rwlock_wrlock(&journal_lock);
    raw_munmap(r->journal, MC_TIER_PAGE);
    pthread_rwlock_unlock(&journal_lock);
  }
  if (r->shadow >= 0) close(r->shadow);
  r->journal = NULL;
  r->shadow = -1;
}

/* ---------------------------------------------------------------- the link */

static void stop_process(const char *why) {
  char buf[300];
  int n = snprintf(buf, sizeof buf, "memcolo: %s; stopping the process (its evicted pages cannot come back)\n", why);
  if (n > 0) { ssize_t w = write(2, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1)); (void)w; }
  kill(getpid(), SIGKILL);
}

static void hand_over_again(void);
static void recover_regions(void);

/* tier_released may carry the process's target as the agent last had it (changed live
 * with `memcolo tier target`, perhaps), and tier_target_set pushes each change: the
 * regions are handed to the next agent with it, after a clean stop or a crash. Only a
 * plain number is taken; T.lock held. */
static void keep_target(const char *line, size_t len) {
  const char *k = memmem(line, len, "\"t_miss\":", 9);
  if (k == NULL) return;
  const char *v = k + 9, *end = line + len;
  size_t n = 0;
  while (v + n < end && n < sizeof T.t_miss - 1 && strchr("0123456789.eE-+", v[n]) != NULL && v[n]) n++;
  if (n == 0 || (v + n < end && v[n] != ',' && v[n] != '}')) return;
  memcpy(T.t_miss, v, n);
  T.t_miss[n] = 0;
}

/* Reads the agent's lines: replies go to the waiting request, "tier_released" marks
 * every region plain memory (then handed to the next agent), end of stream without
 * it recovers durable regions with the next agent or stops the process. */
static void *reader(void *arg) {
  int fd = (int)(intptr_t)arg;
  char buf[1024];
  size_t have = 0;
  for (;;) {
    ssize_t n = recv(fd, buf + have, sizeof buf - 1 - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += (size_t)n;
    char *nl;
    while ((nl = memchr(buf, '\n', have)) != NULL) {
      size_t len = (size_t)(nl - buf);
      pthread_mutex_lock(&T.lock);
      if (memmem(buf, len, "\"tier_target_set\"", 17) != NULL) {
        /* A push, not an answer: the target a new agent gets after a crash. */
        keep_target(buf, len);
      } else if (memmem(buf, len, "\"tier_released\"", 15) != NULL) {
        T.released = 1;
        keep_target(buf, len);
        /* (A region still waiting for recovery after an earlier agent's crash is
         * not this agent's to release: its pages are on the memory server.) */
        for (int i = 0; i < MC_TIER_MAX_REGIONS; i++)
          if (T.regions[i].used && T.regions[i].managed && !T.regions[i].recover) {
            T.regions[i].managed = 0;
            close(T.regions[i].uffd);
            T.regions[i].uffd = -1;
          }
      } else {
        size_t c = len < sizeof T.reply - 1 ? len : sizeof T.reply - 1;
        memcpy(T.reply, buf, c);
        T.reply[c] = 0;
        T.reply_ready = 1;
        pthread_cond_broadcast(&T.reply_cv);
      }
      pthread_mutex_unlock(&T.lock);
      have -= len + 1;
      memmove(buf, nl + 1, have);
    }
    if (have == sizeof buf - 1) have = 0; /* an overlong line: drop it */
  }
  pthread_mutex_lock(&T.lock);
  int managed = 0, fragile = 0, start_recovery = 0;
  for (int i = 0; i < MC_TIER_MAX_REGIONS; i++) {
    if (!T.regions[i].used || !T.regions[i].managed) continue;
    managed++;
    if (!T.regions[i].durable) fragile++;
  }
  int released = T.released;
  if (T.fd == fd) {
    close(fd);
    T.fd = -1;
    T.gen++;
  }
  if (managed && !released && !fragile) {
    /* Every region's pages outlive the agent: wait for the next one to take them. */
    for (int i = 0; i < MC_TIER_MAX_REGIONS; i++)
      if (T.regions[i].used && T.regions[i].managed) T.regions[i].recover = 1;
    if (!T.recovering) T.recovering = start_recovery = 1;
  }
  T.reply_ready = -1;
  pthread_cond_broadcast(&T.reply_cv);
  pthread_mutex_unlock(&T.lock);
  if (managed && !released && fragile) stop_process("the agent managing this process's tiered memory is gone");
  if (start_recovery) recover_regions();
  if (released) hand_over_again();
  return NULL;
}

/* Connects if needed; T.lock held. */
static int connect_locked(void) {
  if (T.fd >= 0) return 0;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, T.path, sizeof sa.sun_path - 1);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    /* (Not while regions wait for a new agent: they are not plain, and said so.) */
    if (!T.recovering && !T.warned_connect++)
      say("memcolo: tiering socket %s: %s; large mappings stay plain\n", T.path, strerror(errno));
    close(fd);
    return -1;
  }
  pthread_attr_t attr;
  pthread_t th;
  sigset_t all, old;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 64 << 10);
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&th, &attr, reader, (void *)(intptr_t)fd);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (rc != 0) { close(fd); return -1; }
  T.fd = fd;
  T.released = 0;
  return 0;
}

/* Sends one line (with descriptors, if any) and waits for its reply into out. */
static int request(const char *line, const int *fds, int nfds, char *out, size_t outlen) {
  if (nfds > 3) return -1;
  pthread_mutex_lock(&T.req_lock);
  pthread_mutex_lock(&T.lock);
  int rc = -1;
  if (connect_locked() != 0) goto done;
  struct iovec iov = {.iov_base = (void *)line, .iov_len = strlen(line)};
  union { char buf[CMSG_SPACE(sizeof(int) * 3)]; struct cmsghdr align; } u;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    memset(&u, 0, sizeof u);
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  T.reply_ready = 0;
  if (sendmsg(T.fd, &mh, MSG_NOSIGNAL) != (ssize_t)iov.iov_len) goto done;
  while (T.reply_ready == 0) pthread_cond_wait(&T.reply_cv, &T.lock);
  if (T.reply_ready > 0) {
    snprintf(out, outlen, "%s", T.reply);
    rc = 0;
  }
  T.reply_ready = 0;
done:
  pthread_mutex_unlock(&T.lock);
  pthread_mutex_unlock(&T.req_lock);
  return rc;
}

/* ---------------------------------------------------------------- regions */

static mc_tier_region_t *find(uintptr_t a, size_t len) {
  for (int i = 0; i < MC_TIER_MAX_REGIONS; i++) {
    mc_tier_region_t *r = &T.regions[i];
    if (r->used && a < r->start + r->len && a + len > r->start) return r;
  }
  return NULL;
}

/* The region id, durability and slow-tier instance in a tier_registered reply. */
static void parse_registered(const char *reply, mc_tier_region_t *out) {
  const char *k = strstr(reply, "\"region\":");
  out->id = k ? strtoull(k + 9, NULL, 10) : 0;
  k = strstr(reply, "\"slow_instance\":");
  out->slow_instance = k ? strtoull(k + 16, NULL, 10) : 0;
  out->durable = strstr(reply, "\"durable\":true") != NULL;
}

/* Registers [p, p + len) with a new userfaultfd (MISSING + WP) and sends it with the
 * memfd and the shadow (if any, shadow >= 0) to the agent (tier_register). Returns 0
 * with *uffd_out and got's id, durable and slow_instance set once the agent took the
 * region; otherwise the registration is undone (faults that came meanwhile are woken
 * and retried as plain memory) and it returns -1 if userfaultfd failed or the agent
 * refused the region, -2 if no agent answered. */
static int hand_over(uintptr_t p, size_t len, int memfd, int shadow, int *uffd_out, mc_tier_region_t *got) {
  int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  struct uffdio_api api = {.api = UFFD_API,
                           .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_MISSING_SHMEM |
                                       UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_EVENT_REMOVE};
  struct uffdio_register reg = {.range = {.start = p, .len = len},
                                .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
  char line[200], reply[512];
  if (uffd < 0) {
    say("memcolo: no userfaultfd (%s); a %zu-byte mapping stays plain\n", strerror(errno), len);
    return -1;
  }
  if (ioctl(uffd, UFFDIO_API, &api) != 0 || ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) {
    say("memcolo: userfaultfd setup failed (%s); a %zu-byte mapping stays plain\n", strerror(errno), len);
    close(uffd);
    return -1;
  }
  char t_miss[sizeof T.t_miss];
  pthread_mutex_lock(&T.lock); /* tier_released may set it */
  memcpy(t_miss, T.t_miss, sizeof t_miss);
  pthread_mutex_unlock(&T.lock);
  if (t_miss[0])
    snprintf(line, sizeof line, "{\"v\":1,\"type\":\"tier_register\",\"start\":%lu,\"length\":%zu,\"t_miss\":%s}\n",
             (unsigned long)p, len, t_miss);
  else
    snprintf(line, sizeof line, "{\"v\":1,\"type\":\"tier_register\",\"start\":%lu,\"length\":%zu}\n",
             (unsigned long)p, len);
  int fds[3] = {uffd, memfd, shadow};
  int rc = 0;
  if (request(line, fds, shadow >= 0 ? 3 : 2, reply, sizeof reply) != 0) {
    rc = -2;
  } else if (strstr(reply, "\"tier_registered\"") == NULL) {
    say("memcolo: the agent refused a tiered region: %s\n", reply);
    rc = -1;
  }
  if (rc != 0) {
    struct uffdio_range range = {.start = p, .len = len};
    ioctl(uffd, UFFDIO_UNREGISTER, &range);
    close(uffd);
    return rc;
  }
  *uffd_out = uffd;
  parse_registered(reply, got);
  return 0;
}

/* tier_unregister of the region at start, answered once the agent no longer touches
 * it (its pages are not brought back). */
static void unregister_at(uintptr_t start) {
  char line[120], reply[512];
  snprintf(line, sizeof line, "{\"v\":1,\"type\":\"tier_unregister\",\"start\":%lu}\n", (unsigned long)start);
  request(line, NULL, 0, reply, sizeof reply);
}

static void *tier_map(size_t len, int flags) {
  len = (len + MC_TIER_PAGE - 1) & ~(MC_TIER_PAGE - 1);
  int memfd = (int)syscall(SYS_memfd_create, "memcolo-tier", MFD_CLOEXEC);
  if (memfd < 0) return NULL;
  if (ftruncate(memfd, (off_t)len) != 0) { close(memfd); return NULL; }
  void *p = raw_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | (flags & MAP_NORESERVE), memfd, 0);
  if (p == MAP_FAILED) { close(memfd); return NULL; }
  raw_madvise(p, len, MADV_DONTFORK);
  int uffd = -1, shadow = -1;
  unsigned char *journal = NULL;
  mc_tier_region_t got = {0};
  if (shadow_create(len, &shadow, &journal) != 0) say("memcolo: no shadow for a tiered region (%s)\n", strerror(errno));
  if (hand_over((uintptr_t)p, len, memfd, shadow, &uffd, &got) != 0) {
    mc_tier_region_t none = {.shadow = shadow, .journal = journal};
    shadow_close(&none);
    raw_munmap(p, len);
    close(memfd);
    return NULL;
  }
  pthread_mutex_lock(&T.lock);
  mc_tier_region_t *slot = NULL;
  for (int i = 0; i < MC_TIER_MAX_REGIONS && !slot; i++)
    if (!T.regions[i].used) slot = &T.regions[i];
  if (slot) {
    *slot = (mc_tier_region_t){.start = (uintptr_t)p, .len = len, .uffd = uffd, .memfd = memfd,
                               .shadow = shadow, .journal = journal, .id = got.id,
                               .slow_instance = got.slow_instance, .durable = got.durable, .managed = 1,
                               .used = 1};
    T.nregions++;
  }
  pthread_mutex_unlock(&T.lock);
  if (slot) return p;
  /* No slot: hand it back (the agent forgets it) and map plainly. */
  unregister_at((uintptr_t)p);
  close(uffd);
  raw_munmap(p, len);
  close(memfd);
  mc_tier_region_t none = {.shadow = shadow, .journal = journal};
  shadow_close(&none);
  return NULL;
}

/* After a clean stop of the agent: hands every region released to plain memory to
 * the next agent that listens, retrying 100 ms doubling to 5 s while any is left.
 * Runs on the reader thread of the connection that ended. Each region is handed over
 * under handover_lock, which munmap of a tiered range takes first: the range cannot
 * be unmapped (and something else mapped there, or its memfd closed and the number
 * reused) between the look at the table and the agent's answer, so the slot read is
 * still the region when the answer comes. */
static void hand_over_again(void) {
  unsigned delay_ms = 100;
  for (;;) {
    struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    int left = 0;
    for (int i = 0; i < MC_TIER_MAX_REGIONS && left == 0; i++) {
      pthread_mutex_lock(&T.handover_lock);
      pthread_mutex_lock(&T.lock);
      mc_tier_region_t r = T.regions[i];
      int want = r.used && !r.managed && !r.stay_plain && r.memfd >= 0;
      if (want && r.unmapped > 0) {
        /* Registering the whole range would fail on the unmapped part. */
        T.regions[i].stay_plain = 1;
        want = 0;
      }
      pthread_mutex_unlock(&T.lock);
      int uffd = -1;
      mc_tier_region_t got = {0};
      int rc = want ? hand_over(r.start, r.len, r.memfd, r.shadow, &uffd, &got) : -1;
      if (want && rc == -2) {
        left++; /* no agent yet: all of them later */
      } else if (want) {
        pthread_mutex_lock(&T.lock);
        if (rc == 0) {
          T.regions[i].uffd = uffd;
          T.regions[i].id = got.id;
          T.regions[i].slow_instance = got.slow_instance;
          T.regions[i].durable = got.durable;
          T.regions[i].managed = 1;
        } else {
          T.regions[i].stay_plain = 1;
        }
        pthread_mutex_unlock(&T.lock);
        if (rc == 0) say("memcolo: a tiered region of %zu bytes handed to the agent again\n", r.len);
      }
      pthread_mutex_unlock(&T.handover_lock);
    }
    if (left == 0) return;
    if (delay_ms < 5000) delay_ms = delay_ms * 2 > 5000 ? 5000 : delay_ms * 2;
  }
}

/* After the agent died holding pages of durable regions (their slow tier is another
 * process, their stash copies are in their shadows): hands each region to the next
 * agent that listens with tier_recover (the same userfaultfd, which this process kept
 * open so that faults wait meanwhile, the memfd and the shadow), trying every 50 ms
 * (the process's faults wait meanwhile, and a refused connect costs microseconds;
 * a backoff made a 1 s restart cost 1.6 s) for MEMCOLO_TIER_RECOVER_S seconds (60);
 * then, or if the new agent
 * cannot take a region over, the process is stopped. Runs on the reader thread of
 * the connection that ended; a reader whose connection ends meanwhile marks every
 * region for recovery again and leaves the work to this loop. */
static void recover_regions(void) {
  say("memcolo: the tiering agent is gone; waiting up to %u s for a new one to take this process's tiered "
      "memory over\n", T.recover_s);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int left = 0;
    for (int i = 0; i < MC_TIER_MAX_REGIONS; i++) {
      pthread_mutex_lock(&T.handover_lock);
      pthread_mutex_lock(&T.lock);
      mc_tier_region_t r = T.regions[i];
      char t_miss[sizeof T.t_miss];
      memcpy(t_miss, T.t_miss, sizeof t_miss);
      pthread_mutex_unlock(&T.lock);
      if (!(r.used && r.managed && r.recover)) {
        pthread_mutex_unlock(&T.handover_lock);
        continue;
      }
      char line[300], reply[512];
      int n = snprintf(line, sizeof line,
                       "{\"v\":1,\"type\":\"tier_recover\",\"start\":%lu,\"length\":%zu,\"region\":%llu,"
                       "\"slow_instance\":%llu",
                       (unsigned long)r.start, r.len, (unsigned long long)r.id, (unsigned long long)r.slow_instance);
      snprintf(line + n, sizeof line - (size_t)n, t_miss[0] ? ",\"t_miss\":%s}\n" : "}\n", t_miss);
      int fds[3] = {r.uffd, r.memfd, r.shadow};
      if (request(line, fds, 3, reply, sizeof reply) != 0) {
        left++;
      } else if (strstr(reply, "\"code\":\"internal\"") != NULL) {
        left++; /* the agent could not now (its memory server unreachable?): again */
        say("memcolo: recovering a tiered region failed for now: %.300s\n", reply);
      } else if (strstr(reply, "\"tier_registered\"") == NULL) {
        pthread_mutex_unlock(&T.handover_lock);
        char why[400];
        snprintf(why, sizeof why, "the new agent could not take over a tiered region: %.300s", reply);
        stop_process(why);
        return;
      } else {
        pthread_mutex_lock(&T.lock);
        T.regions[i].recover = 0;
        pthread_mutex_unlock(&T.lock);
        say("memcolo: a tiered region of %zu bytes recovered by the new agent\n", r.len);
      }
      pthread_mutex_unlock(&T.handover_lock);
    }
    if (left == 0) {
      pthread_mutex_lock(&T.lock);
      int again = 0;
      for (int i = 0; i < MC_TIER_MAX_REGIONS; i++) again += T.regions[i].used && T.regions[i].managed && T.regions[i].recover;
      if (!again) T.recovering = 0;
      pthread_mutex_unlock(&T.lock);
      if (!again) return;
      continue;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= (time_t)T.recover_s) {
      stop_process("no tiering agent took this process's tiered memory over in time");
      return;
    }
    struct timespec ts = {0, 50 * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
}

/* ---------------------------------------------------------------- interposers */

static int eligible(size_t len, int prot, int flags, int fd, void *addr) {
  const int kind = MAP_ANONYMOUS | MAP_PRIVATE | MAP_SHARED | MAP_FIXED | MAP_FIXED_NOREPLACE |
                   MAP_HUGETLB | MAP_GROWSDOWN | MAP_STACK | MAP_POPULATE;
  return T.enabled && len >= T.threshold && addr == NULL && fd == -1 &&
         (flags & kind) == (MAP_ANONYMOUS | MAP_PRIVATE) && prot == (PROT_READ | PROT_WRITE);
}

MC_TIER_API void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  uintptr_t ra = (uintptr_t)__builtin_return_address(0);
  if (eligible(len, prot, flags, fd, addr) && !(ra >= T.self_lo && ra < T.self_hi)) {
    void *p = tier_map(len, flags);
    if (p != NULL) return p;
  }
  return raw_mmap(addr, len, prot, flags, fd, off);
}

MC_TIER_API void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  uintptr_t ra = (uintptr_t)__builtin_return_address(0);
  if (eligible(len, prot, flags, fd, addr) && !(ra >= T.self_lo && ra < T.self_hi)) {
    void *p = tier_map(len, flags);
    if (p != NULL) return p;
  }
  return raw_mmap(addr, len, prot, flags, fd, off);
}

MC_TIER_API int munmap(void *addr, size_t len) {
  if (__atomic_load_n(&T.nregions, __ATOMIC_ACQUIRE) == 0) return raw_munmap(addr, len);
  uintptr_t a = (uintptr_t)addr;
  pthread_mutex_lock(&T.lock);
  mc_tier_region_t *r = find(a, len);
  pthread_mutex_unlock(&T.lock);
  if (r == NULL) return raw_munmap(addr, len);
  /* A tiered region: not while one is being handed to a new agent (see
   * hand_over_again; that lock comes first), then look again. */
  pthread_mutex_lock(&T.handover_lock);
  pthread_mutex_lock(&T.lock);
  r = find(a, len);
  if (r == NULL) {
    pthread_mutex_unlock(&T.lock);
    pthread_mutex_unlock(&T.handover_lock);
    return raw_munmap(addr, len);
  }
  uintptr_t lo = a > r->start ? a : r->start;
  uintptr_t hi = a + len < r->start + r->len ? a + len : r->start + r->len;
  hi = (hi + MC_TIER_PAGE - 1) & ~(MC_TIER_PAGE - 1);
  int whole = r->unmapped + (hi - lo) >= r->len;
  mc_tier_region_t copy = *r;
  if (whole) {
    r->used = 0;
    T.nregions--;
  } else {
    r->unmapped += hi - lo;
  }
  pthread_mutex_unlock(&T.lock);
  if (!whole) {
    /* The region keeps its descriptors, and is never handed over again whole (it
     * is partly unmapped now): the lock is not needed any more, and must not be
     * held while the remove event waits for an agent to read it, which after a
     * crash only a recovered one does (recover_regions takes the lock). */
    pthread_mutex_unlock(&T.handover_lock);
    /* The agent frees that part (a remove event) before it is unmapped. */
    if (copy.managed) remove_range(copy.durable ? copy.journal : NULL, copy.start, lo, hi);
    return raw_munmap(addr, len);
  }
  if (copy.managed) {
    unregister_at(copy.start);
    close(copy.uffd);
  }
  if (copy.memfd >= 0) close(copy.memfd);
  shadow_close(&copy);
  int rc = raw_munmap(addr, len);
  pthread_mutex_unlock(&T.handover_lock);
  return rc;
}

MC_TIER_API int madvise(void *addr, size_t len, int advice) {
  if (__atomic_load_n(&T.nregions, __ATOMIC_ACQUIRE) == 0 ||
      (advice != MADV_DONTNEED && advice != MADV_FREE && advice != MADV_REMOVE))
    return raw_madvise(addr, len, advice);
  uintptr_t a = (uintptr_t)addr;
  pthread_mutex_lock(&T.lock);
  mc_tier_region_t *r = find(a, len);
  uintptr_t rs = r ? r->start : 0, re = r ? r->start + r->len : 0;
  unsigned char *journal = r && r->managed && r->durable ? r->journal : NULL;
  pthread_mutex_unlock(&T.lock);
  if (r == NULL) return raw_madvise(addr, len, advice);
  /* On the shared memfd, DONTNEED would keep the data: punch it out instead, so the
   * pages read as zeros as on private memory. The parts outside keep the advice. */
  uintptr_t lo = a > rs ? a : rs, end = a + len, hi = end < re ? end : re;
  int rc = 0;
  if (a < lo && raw_madvise(addr, lo - a, advice) != 0) rc = -1;
  /* A durable region's agent may die between reading the remove event and dropping
   * the range's copies: journal it first (see the shadow). */
  if (remove_range(journal, rs, lo, hi) != 0) rc = -1;
  if (hi < end && raw_madvise((void *)hi, end - hi, advice) != 0) rc = -1;
  return rc;
}

MC_TIER_API void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
  void *new_addr = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void *);
    va_end(ap);
  }
  if (__atomic_load_n(&T.nregions, __ATOMIC_ACQUIRE) != 0) {
    pthread_mutex_lock(&T.lock);
    mc_tier_region_t *r = find((uintptr_t)old, old_len ? old_len : 1);
    int warn = r != NULL && !T.warned_mremap++;
    pthread_mutex_unlock(&T.lock);
    if (r != NULL) {
      if (warn) say("memcolo: mremap of a tiered region refused (ENOMEM); callers copy instead\n");
      errno = ENOMEM;
      return MAP_FAILED;
    }
  }
  return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
}

/* ---------------------------------------------------------------- setup */

static void tier_atfork_child(void) {
  int had = 0;
  pthread_mutex_init(&T.lock, NULL);
  pthread_mutex_init(&T.req_lock, NULL);
  pthread_mutex_init(&T.handover_lock, NULL);
  pthread_rwlock_init(&journal_lock, NULL);
  pthread_cond_init(&T.reply_cv, NULL);
  if (T.fd >= 0) close(T.fd);
  T.fd = -1;
  T.gen++;
  T.recovering = 0;
  T.released = 0;
  for (int i = 0; i < MC_TIER_MAX_REGIONS; i++) {
    if (!T.regions[i].used) continue;
    had++;
    if (T.regions[i].uffd >= 0) close(T.regions[i].uffd);
    if (T.regions[i].memfd >= 0) close(T.regions[i].memfd);
    shadow_close(&T.regions[i]);
    T.regions[i].used = 0;
  }
  T.nregions = 0;
  if (had) say("memcolo: %d tiered region(s) are not inherited by this child (MADV_DONTFORK)\n", had);
}

__attribute__((constructor)) static void mc_tier_init(void) {
  mc_options_init();
  T.enabled = MC_OPT(MC_OPT_TIER) != 0;
  T.verbose = MC_OPT(MC_OPT_VERBOSE) != 0;
  if (!T.enabled) return;
  T.threshold = (size_t)MC_OPT(MC_OPT_TIER_THRESHOLD);
  T.recover_s = (unsigned)MC_OPT(MC_OPT_TIER_RECOVER_S);
  const char *e = MC_OPT_STR(MC_OPT_T_MISS);
  if (e != NULL) snprintf(T.t_miss, sizeof T.t_miss, "%s", e);
  e = MC_OPT_STR(MC_OPT_TIER_SOCKET);
  if (e != NULL) {
    snprintf(T.path, sizeof T.path, "%s", e);
  } else {
    const char *s = MC_OPT_STR(MC_OPT_SOCKET);
    const char *slash = strrchr(s, '/');
    int dir = slash ? (int)(slash - s) : 0;
    snprintf(T.path, sizeof T.path, "%.*s%stier.sock", dir, s, slash ? "/" : "");
  }
  dl_iterate_phdr(find_self, (void *)(uintptr_t)&mc_tier_init);
  pthread_atfork(NULL, NULL, tier_atfork_child);
}
