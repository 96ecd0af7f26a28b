/* stats.c — telemetry: memcolo_stats() snapshot and the report printed at exit with
 * MEMCOLO_STATS=1 (or by memcolo_stats_print). Formatting is done by hand (no stdio
 * inside the allocator). */
#include <string.h>
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
  out->malloc_calls_slow = __atomic_load_n(&mc_stat_slow_calls, __ATOMIC_RELAXED);
  out->large_allocs = __atomic_load_n(&mc_stat_large_allocs, __ATOMIC_RELAXED);
  out->threads_active = mc_tcache_count();
  mc_agent_stats(out);
  return 0;
}

void mc_agent_stats_publish(bool force) { (void)force; }
void mc_agent_stats_unpublish(void) {}
void mc_agent_stats_after_fork_child(void) {}

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
}
