/* test_reserve.c — Hermes reservation (run with MEMCOLO_CLASS=lc): the management
 * thread pre-faults min_rsv, the pool of large blocks serves paced 256 KiB requests,
 * blocks from the pool are usable and calloc'ed ones zeroed, an agent-style release
 * returns memory, a forked child runs without the reservation, and the management
 * thread runs at MEMCOLO_MGMT_NICE while reserving (when permitted). No timing asserts:
 * the waits are bounded polls on counters. */
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memcolo.h"
#include "test.h"

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* how many of this process's threads run at `nice` (from /proc/self/task/TID/stat) */
static int threads_at_nice(long nice) {
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = 0;
    char *c = strrchr(buf, ')'); /* fields after the command name; nice is field 19 */
    long v = 0;
    int field = 2;
    for (char *t = c ? strtok(c + 1, " ") : NULL; t != NULL; t = strtok(NULL, " ")) {
      if (++field == 19) { v = strtol(t, NULL, 10); break; }
    }
    if (field == 19 && v == nice) n++;
  }
  closedir(d);
  return n;
}

/* whether this process may lower a thread's nice (CAP_SYS_NICE or RLIMIT_NICE) */
static int may_lower_nice(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(setpriority(PRIO_PROCESS, 0, -1) == 0 ? 0 : 1);
  int ws = 0;
  waitpid(pid, &ws, 0);
  return WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
}

int main(void) {
  memcolo_stats_t st;
  MC_API(free)(MC_API(malloc)(1));
  memcolo_stats(&st);
  mc_t_current = "reservation_on";
  CHECK(st.reservation_on == 1);
  /* min_rsv (5 MiB) in whole huge pages, never above it: more than 3 MiB free */
  for (int i = 0; i < 1000 && (memcolo_stats(&st), st.free_backed_bytes < (3u << 20)); i++) sleep_ms(10);
  mc_t_current = "prefaulted_min_rsv";
  CHECK(st.prefaulted_bytes >= (2u << 20));
  CHECK(st.free_backed_bytes >= (3u << 20));
  CHECK(st.free_backed_bytes <= (5u << 20));
  /* the reservation's footprint, apart from used bytes: min_rsv's pre-faulted huge
   * pages at least, never more than the pool and the target */
  mc_t_current = "reserved_bytes";
  CHECK(st.version == MEMCOLO_STATS_VERSION && st.version >= 3);
  CHECK(st.reserved_bytes >= (3u << 20));
  CHECK(st.reserved_bytes <= st.pool_bytes + st.reserve_target_bytes);
  CHECK(st.reserved_bytes <= st.pool_bytes + st.free_backed_bytes);

  /* Bounded on bursty demand: small objects (4 MiB) allocated and freed in cycles with
   * the same peak are demand in the first cycle only (growth above the last second's
   * high-water mark): during the cycles the target stays near min_rsv (RSV_FACTOR x the
   * demand of the last interval + min_rsv; 1 MiB of slack for objects that the caches
   * hold across cycles), and once they stop the free memory above the target is
   * trimmed back to it (one huge page of slack). The cycles run for at most 300 ms,
   * within the second of the high-water mark. Before: every span taken was demand, and
   * the target reached 2x a cycle plus 100 ms of the rate. */
  {
    enum { OBJS = 16384, OBJ = 256 };
    static void *objs[OBJS];
    const size_t min_rsv = 5u << 20;
    for (int i = 0; i < OBJS; i++) objs[i] = MC_API(malloc)(OBJ);
    for (int i = 0; i < OBJS; i++) MC_API(free)(objs[i]);
    sleep_ms(50); /* the first cycle's demand leaves the last interval */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t max_target = 0;
    int cycles = 0;
    do {
      for (int i = 0; i < OBJS; i++) {
        objs[i] = MC_API(malloc)(OBJ);
        memset(objs[i], 1, OBJ);
      }
      for (int i = 0; i < OBJS; i++) MC_API(free)(objs[i]);
      memcolo_stats(&st);
      if (st.reserve_target_bytes > max_target) max_target = st.reserve_target_bytes;
      cycles++;
      clock_gettime(CLOCK_MONOTONIC, &t1);
    } while ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 300);
    mc_t_current = "bursty_target_bounded";
    CHECK(cycles > 0);
    if (max_target > min_rsv + (1u << 20)) fprintf(stderr, "  target %zu KiB over %d cycles\n", max_target >> 10, cycles);
    CHECK(max_target <= min_rsv + (1u << 20));
    for (int i = 0; i < 500 && (memcolo_stats(&st), st.free_backed_bytes > st.reserve_target_bytes + (2u << 20)); i++)
      sleep_ms(10);
    mc_t_current = "bursty_surplus_trimmed";
    if (st.free_backed_bytes > st.reserve_target_bytes + (2u << 20))
      fprintf(stderr, "  free backed %zu KiB, target %zu KiB\n", (size_t)(st.free_backed_bytes >> 10),
              (size_t)(st.reserve_target_bytes >> 10));
    CHECK(st.free_backed_bytes <= st.reserve_target_bytes + (2u << 20));
  }

  /* the management thread runs at MEMCOLO_MGMT_NICE (default -10) while it reserves,
   * where the process may lower a nice; never the application's threads */
  mc_t_current = "mgmt_nice";
  if (may_lower_nice()) {
    for (int i = 0; i < 500 && threads_at_nice(-10) < 1; i++) sleep_ms(10);
    CHECK(threads_at_nice(-10) == 1);
  } else {
    CHECK(threads_at_nice(-10) == 0);
  }
  CHECK(getpriority(PRIO_PROCESS, 0) == 0);

  /* paced large requests: the pool starts serving them */
  enum { N = 3000 };
  static void *blocks[N];
  int n = 0;
  for (; n < N; n++) {
    blocks[n] = MC_API(malloc)(256 << 10);
    memset(blocks[n], 7, 256 << 10);
    sleep_ms(1);
    memcolo_stats(&st);
    if (st.pool_hits > 20) { n++; break; }
  }
  mc_t_current = "pool_hits";
  CHECK(st.pool_hits > 20);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    unsigned char *c = (unsigned char *)blocks[i];
    if (c[0] != 7 || c[(256 << 10) - 1] != 7) bad++;
  }
  CHECK(bad == 0);
  for (int i = 0; i < n; i++) MC_API(free)(blocks[i]);
  /* calloc from reserved/pooled memory is zero */
  for (int i = 0; i < 50; i++) {
    unsigned char *c = (unsigned char *)MC_API(calloc)(1, 256 << 10);
    size_t nz = 0;
    for (size_t k = 0; k < (256u << 10); k += 511) nz += c[k] != 0;
    if (nz) bad++;
    blocks[i] = c;
  }
  mc_t_current = "calloc_zero";
  CHECK(bad == 0);
  for (int i = 0; i < 50; i++) MC_API(free)(blocks[i]);

  /* fork: the child has no management thread and no reservation */
  pid_t pid = fork();
  if (pid == 0) {
    memcolo_stats_t cs;
    void *p = MC_API(malloc)(300 << 10);
    memset(p, 1, 300 << 10);
    MC_API(free)(p);
    memcolo_stats(&cs);
    _exit(cs.reservation_on == 0 ? 0 : 1);
  }
  int ws = 0;
  waitpid(pid, &ws, 0);
  mc_t_current = "fork_child";
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);

  /* the agent's "top": drop the reservation and release */
  memcolo_set_reservation(0);
  size_t got = memcolo_release(MEMCOLO_LEVEL_TOP, 0);
  memcolo_stats(&st);
  mc_t_current = "release_top";
  CHECK(got > 0);
  CHECK(st.reservation_on == 0);
  CHECK(st.pool_bytes == 0);
  /* without the reservation the thread is back at the process's nice */
  mc_t_current = "mgmt_nice_restored";
  for (int i = 0; i < 500 && threads_at_nice(-10) > 0; i++) sleep_ms(10);
  CHECK(threads_at_nice(-10) == 0);
  TEST_END();
}
