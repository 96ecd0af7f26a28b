/* stats.c — telemetry: memcolo_stats() snapshot, the report printed at exit with
 * MEMCOLO_STATS=1 (or by memcolo_stats_print), and the stats file that `memcolo
 * alloc-stats PID` reads: while the process is registered with the agent, the agent
 * thread rewrites <directory of the agent's socket>/alloc/<pid>.json once a second
 * (temporary file + rename, so a reader never sees half a file). Format, version 1:
 *   {"v":1,"pid":P,"starttime_ticks":T,"uid":U,"updated_unix_ms":M,"stats":{...}}
 * where "stats" holds every field of memcolo_stats_t under its C name (sizes in bytes,
 * hugepage_coverage in 0..1) and starttime_ticks is /proc/PID/stat field 22, so that a
 * reader can tell a live process from a reused pid. The directory is created with mode
 * 1777 (sticky, like /tmp) when missing; the file is removed at exit. Formatting is
 * done by hand (no stdio inside the allocator). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

MC_EXPORT int memcolo_stats(memcolo_stats_t *out) {
  if (out == NULL) return -1;
  mc_ensure_init();
  memset(out, 0, sizeof(*out));
  out->version = MEMCOLO_STATS_VERSION;
  pthread_mutex_lock(&mc_heap.lock);
  mc_heap_stats_locked(out);
  mc_release_stats_locked(out);
  pthread_mutex_unlock(&mc_heap.lock);
  mc_reserve_stats(out);
  if (out->reservation_on) {
    /* Algorithm 1 keeps the heap's free backed memory (pre-faulted huge pages of the
     * cache and the free pages of the huge pages in use alike) at the target: that is
     * the reserve, up to its target; above it is surplus (trimmed above TRIM_THR) */
    uint64_t fb = out->free_backed_bytes;
    uint64_t heap_rsv = fb < out->reserve_target_bytes ? fb : out->reserve_target_bytes;
    out->reserved_bytes = out->pool_bytes + heap_rsv;
  }
  uint64_t slow, large;
  mc_tcache_sum_stats(&slow, &large);
  out->malloc_calls_slow = slow;
  out->large_allocs = large;
  out->threads_active = mc_tcache_count();
  mc_agent_stats(out);
  return 0;
}

/* ------------------------------------------------------------ the stats file */
static char sf_path[512], sf_tmp[512];
static pid_t sf_pid;            /* the process that wrote sf_path (0: none) */
static uint64_t sf_starttime;
static char sf_buf[4096];
static int sf_warned;
static volatile int sf_closed; /* set at exit: no more writes */

static char *put(char *b, const char *s) {
  size_t l = strlen(s);
  memcpy(b, s, l);
  return b + l;
}
static char *put_kv(char *b, const char *key, uint64_t v) {
  *b++ = '"';
  b = put(b, key);
  b = put(b, "\":");
  b = mc_fmt_u64(b, v);
  *b++ = ',';
  return b;
}

/* a share in 0..1 as a decimal with 6 digits */
static char *put_share(char *b, const char *key, double v) {
  double c = v < 0 ? 0 : (v > 1 ? 1 : v);
  uint64_t ppm = (uint64_t)(c * 1e6 + 0.5);
  *b++ = '"';
  b = put(b, key);
  b = put(b, "\":");
  b = mc_fmt_u64(b, ppm / 1000000u);
  *b++ = '.';
  char frac[24];
  mc_fmt_u64(frac, ppm % 1000000u + 1000000u); /* leading zeros: "1xxxxxx" */
  b = put(b, frac + 1);
  *b++ = ',';
  return b;
}

/* /proc/self/stat field 22 (start time in clock ticks after boot) */
static uint64_t self_starttime(void) {
  char buf[1024];
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  if (p == NULL) return 0;
  /* after ") " come fields 3.. ; field 22 is the 20th of them */
  int field = 2;
  for (p++; *p && field < 22; p++) {
    if (*p == ' ') field++;
  }
  uint64_t v = 0;
  while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
  return v;
}

static bool sf_prepare(void) {
  pid_t pid = getpid();
  if (sf_pid == pid) return true;
  const char *sock = mc_agent_socket_path();
  const char *slash = strrchr(sock, '/');
  size_t dl = slash ? (size_t)(slash - sock) : 0;
  if (dl + 40 >= sizeof(sf_path)) return false;
  char *b = sf_path;
  if (dl == 0) b = put(b, slash ? "" : ".");
  else { memcpy(b, sock, dl); b += dl; }
  b = put(b, "/alloc");
  *b = 0;
  if (mkdir(sf_path, 01777) == 0) chmod(sf_path, 01777); /* mkdir's mode passes the umask */
  char num[24];
  mc_fmt_u64(num, (uint64_t)pid);
  char *t = sf_tmp;
  memcpy(t, sf_path, (size_t)(b - sf_path)); t += b - sf_path;
  t = put(t, "/.");
  t = put(t, num);
  t = put(t, ".json.tmp");
  *t = 0;
  b = put(b, "/");
  b = put(b, num);
  b = put(b, ".json");
  *b = 0;
  sf_starttime = self_starttime();
  sf_pid = pid;
  return true;
}

/* Rewrites the stats file (the agent thread, once a second while registered). */
void mc_agent_stats_publish(bool force) {
  (void)force;
  if (sf_closed || !sf_prepare()) return;
  memcolo_stats_t st;
  memcolo_stats(&st);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char *b = sf_buf;
  b = put(b, "{\"v\":1,");
  b = put_kv(b, "pid", (uint64_t)sf_pid);
  b = put_kv(b, "starttime_ticks", sf_starttime);
  b = put_kv(b, "uid", (uint64_t)getuid());
  b = put_kv(b, "updated_unix_ms", (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
  b = put(b, "\"stats\":{");
  b = put_kv(b, "version", st.version);
  b = put_kv(b, "reservation_on", st.reservation_on);
  b = put_kv(b, "mapped_bytes", st.mapped_bytes);
  b = put_kv(b, "used_bytes", st.used_bytes);
  b = put_kv(b, "free_backed_bytes", st.free_backed_bytes);
  b = put_kv(b, "released_bytes", st.released_bytes);
  b = put_kv(b, "hugepages_total", st.hugepages_total);
  b = put_kv(b, "hugepages_broken", st.hugepages_broken);
  b = put_share(b, "hugepage_coverage", st.hugepage_coverage);
  b = put_kv(b, "hugepages_thp", st.hugepages_thp);
  b = put_share(b, "thp_coverage", st.thp_coverage);
  b = put_kv(b, "released_total_bytes", st.released_total_bytes);
  b = put_kv(b, "subreleased_bytes", st.subreleased_bytes);
  b = put_kv(b, "realized_fragmentation_bytes", st.realized_fragmentation_bytes);
  b = put_kv(b, "average_fragmentation_bytes", st.average_fragmentation_bytes);
  b = put_kv(b, "skipped_subrelease_bytes", st.skipped_subrelease_bytes);
  b = put_kv(b, "skipped_correct_bytes", st.skipped_correct_bytes);
  b = put_kv(b, "skipped_incorrect_bytes", st.skipped_incorrect_bytes);
  b = put_kv(b, "reserve_target_bytes", st.reserve_target_bytes);
  b = put_kv(b, "prefaulted_bytes", st.prefaulted_bytes);
  b = put_kv(b, "pool_bytes", st.pool_bytes);
  b = put_kv(b, "reserved_bytes", st.reserved_bytes);
  b = put_kv(b, "reserve_hits", st.reserve_hits);
  b = put_kv(b, "reserve_misses", st.reserve_misses);
  b = put_kv(b, "pool_hits", st.pool_hits);
  b = put_kv(b, "pool_misses", st.pool_misses);
  b = put_kv(b, "malloc_calls_slow", st.malloc_calls_slow);
  b = put_kv(b, "large_allocs", st.large_allocs);
  b = put_kv(b, "os_mmap_calls", st.os_mmap_calls);
  b = put_kv(b, "threads_active", st.threads_active);
  b = put_kv(b, "agent_registered", st.agent_registered);
  b = put_kv(b, "agent_registrations", st.agent_registrations);
  b = put_kv(b, "agent_notifications", st.agent_notifications);
  b = put_kv(b, "agent_released_bytes", st.agent_released_bytes);
  b[-1] = '}';
  b = put(b, "}\n");
  int fd = open(sf_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    if (!__atomic_exchange_n(&sf_warned, 1, __ATOMIC_RELAXED) && MC_OPT(MC_OPT_VERBOSE)) {
      mc_write_str(2, "memcolo: warning: cannot write the stats file for `memcolo alloc-stats` in ");
      mc_write_str(2, sf_path);
      mc_write_str(2, " (its directory must exist and be writable; mode 1777 like /tmp)\n");
    }
    return;
  }
  size_t n = (size_t)(b - sf_buf);
  const char *w = sf_buf;
  bool ok = true;
  while (n > 0) {
    ssize_t r = write(fd, w, n);
    if (r < 0) { if (errno == EINTR) continue; ok = false; break; }
    w += r;
    n -= (size_t)r;
  }
  close(fd);
  if (!ok || sf_closed || rename(sf_tmp, sf_path) != 0) unlink(sf_tmp);
}

/* Removes the stats file of this process (at exit). */
void mc_agent_stats_unpublish(void) {
  if (sf_pid != 0 && sf_pid == getpid()) {
    sf_closed = 1;
    unlink(sf_path);
    sf_pid = 0;
  }
}

/* A forked child has its own pid: it must not remove its parent's file. */
void mc_agent_stats_after_fork_child(void) { sf_pid = 0; }

static void line(int fd, const char *name, uint64_t v, const char *unit) {
  char buf[128], *b = buf;
  size_t n = strlen(name);
  memcpy(b, name, n); b += n;
  *b++ = ' ';
  b = mc_fmt_u64(b, v);
  if (unit) { *b++ = ' '; n = strlen(unit); memcpy(b, unit, n); b += n; }
  *b++ = '\n';
  *b = 0;
  mc_write_str(fd, buf);
}

MC_EXPORT void memcolo_stats_print(int fd) {
  memcolo_stats_t st;
  memcolo_stats(&st);
  mc_write_str(fd, "memcolo: allocator report\n");
  line(fd, "  mapped", st.mapped_bytes >> 10, "KiB");
  line(fd, "  used", st.used_bytes >> 10, "KiB");
  line(fd, "  free_backed (average fragmentation)", st.free_backed_bytes >> 10, "KiB");
  line(fd, "  released (address space not backed)", st.released_bytes >> 10, "KiB");
  line(fd, "  hugepages", st.hugepages_total, NULL);
  line(fd, "  hugepages_broken", st.hugepages_broken, NULL);
  line(fd, "  hugepage_coverage_permille", (uint64_t)(st.hugepage_coverage * 1000.0 + 0.5), NULL);
  line(fd, "  hugepages_thp", st.hugepages_thp, NULL);
  line(fd, "  thp_coverage_permille", (uint64_t)(st.thp_coverage * 1000.0 + 0.5), NULL);
  line(fd, "  realized_fragmentation", st.realized_fragmentation_bytes >> 10, "KiB");
  line(fd, "  released_total", st.released_total_bytes >> 10, "KiB");
  line(fd, "  subreleased", st.subreleased_bytes >> 10, "KiB");
  line(fd, "  skipped_subrelease", st.skipped_subrelease_bytes >> 10, "KiB");
  line(fd, "  skipped_correct", st.skipped_correct_bytes >> 10, "KiB");
  line(fd, "  skipped_incorrect", st.skipped_incorrect_bytes >> 10, "KiB");
  line(fd, "  reservation_on", st.reservation_on, NULL);
  line(fd, "  reserve_target", st.reserve_target_bytes >> 10, "KiB");
  line(fd, "  prefaulted", st.prefaulted_bytes >> 10, "KiB");
  line(fd, "  pool", st.pool_bytes >> 10, "KiB");
  line(fd, "  reserved (apart from used)", st.reserved_bytes >> 10, "KiB");
  line(fd, "  reserve_hits", st.reserve_hits, NULL);
  line(fd, "  reserve_misses", st.reserve_misses, NULL);
  line(fd, "  pool_hits", st.pool_hits, NULL);
  line(fd, "  pool_misses", st.pool_misses, NULL);
  line(fd, "  malloc_slow_calls", st.malloc_calls_slow, NULL);
  line(fd, "  large_allocs", st.large_allocs, NULL);
  line(fd, "  os_mmap_calls", st.os_mmap_calls, NULL);
  line(fd, "  threads", st.threads_active, NULL);
  line(fd, "  agent_registered", st.agent_registered, NULL);
  line(fd, "  agent_notifications", st.agent_notifications, NULL);
  line(fd, "  agent_released", st.agent_released_bytes >> 10, "KiB");
}

__attribute__((destructor)) static void mc_stats_at_exit(void) {
  if (mc_initialized && MC_OPT(MC_OPT_STATS)) memcolo_stats_print(2);
  mc_agent_stats_unpublish();
}
