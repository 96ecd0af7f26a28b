/* options.c — the one table of libmemcolo's MEMCOLO_* options: every variable the
 * library reads from the environment, each defined once here with its type, default,
 * range and meaning. They are read once, at the first of the allocator's or the
 * tiering constructor's initialization (getenv allocates nothing, so this is safe
 * inside malloc); README.md's options table is generated from this one
 * (test/options_table.sh checks that they agree).
 *
 * Values: integers may carry a k/m/g suffix (x1024^n) and an optional b; MC_OT_X100
 * options also take decimals (1.5) and are kept x100. A value that cannot be read
 * keeps the default, one outside the range is clamped to it; both are said on stderr
 * with MEMCOLO_VERBOSE=1 (by default nothing is written on the program's stderr). */
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static const mc_option_desc_t mc_option_table[MC_OPT__COUNT] = {
  [MC_OPT_CLASS] = {"CLASS", MC_OT_CHOICE, 0, 0, 3, "lc,be,elastic",
    "`lc` turns the Hermes reservation on; `be`, `elastic`"},
  [MC_OPT_RESERVE] = {"RESERVE", MC_OT_INT, -1, -1, 1, NULL,
    "1 forces the Hermes reservation on, 0 off; -1: on for class `lc` only"},
  [MC_OPT_RESERVE_INTERVAL_US] = {"RESERVE_INTERVAL_US", MC_OT_INT, 2000, 100, 10000000, NULL,
    "period of the management thread (Hermes' reservation interval)"},
  [MC_OPT_RSV_FACTOR_PCT] = {"RSV_FACTOR", MC_OT_X100, 200, 0, 10000, NULL,
    "RSV_FACTOR of Hermes §3.2: the reserve is this x the demand of the last interval (decimals allowed: 1.5)"},
  [MC_OPT_MIN_RSV_BYTES] = {"MIN_RSV", MC_OT_BYTES, 5L << 20, 0, LONG_MAX, NULL,
    "min_rsv of Hermes §3.2: the smallest reserve"},
  [MC_OPT_TRIM_FACTOR_PCT] = {"TRIM_FACTOR", MC_OT_X100, 400, 0, 10000, NULL,
    "TRIM_THR = this x the pool's target: pooled blocks above it are unmapped (decimals allowed); the page heap's free memory above its own target goes at once"},
  [MC_OPT_MLOCK] = {"MLOCK", MC_OT_BOOL, 1, 0, 1, NULL,
    "mlock pooled large blocks until they are handed out (Hermes §4; needs CAP_IPC_LOCK or room in RLIMIT_MEMLOCK, else one warning and plain pre-faulting); 0 = never"},
  [MC_OPT_RELEASE_RATE_BYTES] = {"RELEASE_RATE", MC_OT_BYTES, 1L << 20, 0, LONG_MAX, NULL,
    "periodic release, bytes/s"},
  [MC_OPT_SKIP_SUBRELEASE_S] = {"SKIP_SUBRELEASE_S", MC_OT_INT, 60, 0, 900, NULL,
    "Delta of the skip-subrelease policy (0 = off)"},
  [MC_OPT_T_SCHEDULE_S] = {"T_SCHEDULE_S", MC_OT_INT, 300, 1, 900, NULL,
    "window of realized fragmentation"},
  [MC_OPT_HP_CACHE_BYTES] = {"HP_CACHE", MC_OT_BYTES, 16L << 20, 0, LONG_MAX, NULL,
    "backed free huge pages kept (plus the reserve and the demand that left in the last 1-2 s)"},
  [MC_OPT_TCACHE_BYTES] = {"TCACHE", MC_OT_BYTES, 2L << 20, 0, LONG_MAX, NULL,
    "per-thread cache budget"},
  [MC_OPT_THP] = {"THP", MC_OT_INT, 1, 0, 2, NULL,
    "1: huge pages made THPs by the management thread (MADV_COLLAPSE of dense, resident huge pages; with the LC reservation only free pre-faulted ones, never pages in use, whose accesses would wait for the copy; never a THP fault on the allocation path); 2: MADV_HUGEPAGE at mmap (THP faults, with their stalls, on the allocation path); 0: none"},
  [MC_OPT_STATS] = {"STATS", MC_OT_BOOL, 0, 0, 1, NULL,
    "1: the telemetry report on stderr at exit"},
  [MC_OPT_VERBOSE] = {"VERBOSE", MC_OT_BOOL, 0, 0, 1, NULL,
    "1: warnings on stderr (options that cannot be read, refused memory, missing kernel features, the agent link); 0: nothing on the program's stderr"},
  [MC_OPT_AGENT] = {"AGENT", MC_OT_BOOL, 1, 0, 1, NULL,
    "with a class set, link to the memcolo agent (0 = standalone)"},
  [MC_OPT_NUM_EPOCHS] = {"NUM_EPOCHS", MC_OT_INT, 5, 1, 1000, NULL,
    "allow-rate gate: NUM_epochs (M3 §4.2)"},
  [MC_OPT_GATE_MIN_EPOCH_MS] = {"GATE_MIN_EPOCH_MS", MC_OT_INT, 1000, 0, 3600000, NULL,
    "allow-rate gate: the epoch is at least this long, one poll of the agent (docs/protocol.md §9); 0 = the handling time alone"},
  [MC_OPT_TOP_HOLD_S] = {"TOP_HOLD_S", MC_OT_INT, 10, 0, 86400, NULL,
    "seconds without reservation after a `top` notification"},
  [MC_OPT_MGMT_NICE] = {"MGMT_NICE", MC_OT_INT, -10, -20, 19, NULL,
    "nice of the management thread while it reserves (below the process's needs CAP_SYS_NICE; else it keeps the process's, silently)"},
  [MC_OPT_RSV_HORIZON_MS] = {"RSV_HORIZON_MS", MC_OT_INT, 100, 0, 10000, NULL,
    "the pool of large blocks also holds this many ms of the measured large demand rate (0 = Hermes' RSV_FACTOR x last interval alone); the page heap's reserve is Hermes' alone"},
  [MC_OPT_RSV_TRACE] = {"RSV_TRACE", MC_OT_BOOL, 0, 0, 1, NULL,
    "1: the management thread's rounds (time, pre-faulted heap and pool against their targets, cumulative demand, pre-faulted bytes, pool misses, round length, times it stepped aside) as `rsv_trace,` CSV lines on stderr at exit, up to 16384, after a line with their origin on CLOCK_MONOTONIC"},
  [MC_OPT_RSV_BACKOFF] = {"RSV_BACKOFF", MC_OT_INT, 0, 0, 2, NULL,
    "(default 0 since the SCHED_IDLE fill, which covers a busy application; A/B under anonymous pressure, 3 paired runs: b2b p99 1917-2985 us with 0 against 3319-4126 with 1, paced 1 ms p99 4.2-10.2 us against 12.1-18.3 in 2 of 3, the third 5.2 ms in both) while requests miss the empty pool and the thread that missed is itself busy (runnable, or waiting on the pool) for 3 rounds: 1 = the management thread stops pre-faulting (and drops its nice) until that thread is found idle twice or a round has no large demand; 2 = keeps pre-faulting at the process's nice; 0 = never; requests never wait for a block in flight while backed off"},
  [MC_OPT_RSV_YIELD_US] = {"RSV_YIELD_US", MC_OT_INT, 200, 0, 1000000, NULL,
    "while pre-faulting (in steps of at most 256 KiB), the management thread looks every 200 us whether the application thread it serves is runnable on its own CPU and has not run since; after this long it sleeps as long (bounds the application's wait for the thread's CPU; 0 = never)"},
  [MC_OPT_RSV_YIELD_WAIT_US] = {"RSV_YIELD_WAIT_US", MC_OT_INT, 200, 0, 1000000, NULL,
    "how long the application thread must have waited for the management thread's CPU before the fill steps aside (0 = at the first pre-fault step that finds it waiting; the looks are then at every step, else every 200 us)"},
  [MC_OPT_RSV_YIELD_MODE] = {"RSV_YIELD_MODE", MC_OT_INT, 3, 0, 3, NULL,
    "how the fill steps aside: 0 sleeps `RSV_YIELD_US`; 1 sched_yield; 2 moves to the process's other CPUs (affinity) while the application thread is runnable; 3 as 0, and SCHED_IDLE while the application thread is busy (runnable at 3 looks in a row: back to back), so the fill takes only CPU time nobody else wants"},
  [MC_OPT_MGMT_SLICE_US] = {"MGMT_SLICE_US", MC_OT_INT, 0, 0, 100000, NULL,
    "the management thread's EEVDF slice (sched_setattr `sched_runtime`, Linux >= 6.12, 100..100000 us); 0 = the kernel's base slice"},
  [MC_OPT_SOCKET] = {"SOCKET", MC_OT_PATH, 0, 0, 0, "/run/memcolo/agent.sock",
    "the agent's Unix socket (docs/protocol.md)"},
  [MC_OPT_TIER] = {"TIER", MC_OT_BOOL, 0, 0, 1, NULL,
    "1: MaxMem tiering (§3.3): the program's large anonymous mappings (at least `TIER_THRESHOLD`) are handed to the agent's tiering socket, which keeps their hot pages local and the rest in a slow tier; falls back to a plain mapping when it cannot (no agent, no userfaultfd permission)"},
  [MC_OPT_TIER_THRESHOLD] = {"TIER_THRESHOLD", MC_OT_BYTES, 1L << 30, 4096, LONG_MAX, NULL,
    "smallest mapping tiered (the paper's 1 GiB)"},
  [MC_OPT_TIER_RECOVER_S] = {"TIER_RECOVER_S", MC_OT_INT, 60, 0, 86400, NULL,
    "after the agent died holding evicted pages of durable regions, how long faults wait for a new agent (tier_recover) before the process is stopped"},
  [MC_OPT_T_MISS] = {"T_MISS", MC_OT_RATIO, 0, 0, 0, NULL,
    "target fast-memory miss ratio sent with each tiered region (MaxMem §3.2); unset: the agent's default"},
  [MC_OPT_TIER_SOCKET] = {"TIER_SOCKET", MC_OT_PATH, 0, 0, 0, NULL,
    "the agent's tiering socket; unset: `tier.sock` in the directory of `MEMCOLO_SOCKET`"},
  [MC_OPT_DOUBLE_FREE_CHECK] = {"DOUBLE_FREE_CHECK", MC_OT_BOOL, 1, 0, 1, NULL,
    "1: a double free, or a free of an object never handed out, aborts at the free, wherever the first free left the object (the live map: an atomic update on every malloc and free); 0: the object-start test alone (interior and foreign pointers still abort; a double free only once both copies are back in the object's span), for tcmalloc's speed on allocation-bound programs (README, \"Misuse checks\"); debug builds always check"},
};

long mc_options_cache[MC_OPT__COUNT];
const char *mc_options_str[MC_OPT__COUNT];

const char *mc_option_name(mc_option_t o) { return mc_option_table[o].name; }
const mc_option_desc_t *mc_option_desc(mc_option_t o) { return &mc_option_table[o]; }

/* Parses "123", "-4", "1.5", "64k", "5m", "1g" (scale 100 with x100); false on junk. */
static bool mc_parse(const char *s, bool x100, long *out) {
  long whole = 0, frac = 0, frac_div = 1;
  const char *c = s;
  bool neg = false;
  if (*c == '-') { neg = true; c++; }
  if (*c < '0' || *c > '9') return false;
  while (*c >= '0' && *c <= '9') {
    if (__builtin_mul_overflow(whole, 10, &whole) || __builtin_add_overflow(whole, *c++ - '0', &whole)) return false;
  }
  if (*c == '.') {
    c++;
    while (*c >= '0' && *c <= '9') { if (frac_div < 1000000) { frac = frac * 10 + (*c - '0'); frac_div *= 10; } c++; }
  }
  long mult = 1;
  if (*c == 'k' || *c == 'K') { mult = 1L << 10; c++; }
  else if (*c == 'm' || *c == 'M') { mult = 1L << 20; c++; }
  else if (*c == 'g' || *c == 'G') { mult = 1L << 30; c++; }
  if (*c == 'b' || *c == 'B') c++;
  if (*c != 0) return false;
  if (x100) mult *= 100;
  long v;
  if (__builtin_mul_overflow(whole, mult, &v) || __builtin_add_overflow(v, (frac * mult) / frac_div, &v)) return false;
  *out = neg ? -v : v;
  return true;
}

/* One line on stderr; written here, not by mc_warn, so that options.c needs only libc
 * and tier.c can be built alone with it (bench/tiering's tests preload that pair). */
static void mc_option_warn(const char *name, const char *what) {
  if (mc_options_cache[MC_OPT_VERBOSE] == 0) return; /* read first (mc_options_init) */
  char msg[160];
  size_t n = 0, l;
  const char *parts[] = {"memcolo: warning: MEMCOLO_", name, what, "\n"};
  for (int i = 0; i < 4; i++) {
    l = strlen(parts[i]);
    if (n + l > sizeof msg) l = sizeof msg - n;
    memcpy(msg + n, parts[i], l);
    n += l;
  }
  ssize_t w = write(2, msg, n);
  (void)w;
}

/* The index + 1 of word v in the comma-separated list, 0 when absent. */
static long mc_choice(const char *list, const char *v) {
  long i = 1;
  size_t n = strlen(v);
  for (const char *w = list; *w; i++) {
    const char *end = strchr(w, ',');
    size_t l = end ? (size_t)(end - w) : strlen(w);
    if (l == n && memcmp(w, v, n) == 0) return i;
    if (!end) break;
    w = end + 1;
  }
  return 0;
}

static void mc_option_read(int i) {
  const mc_option_desc_t *d = &mc_option_table[i];
  char name[64];
  memcpy(name, "MEMCOLO_", 8);
  memcpy(name + 8, d->name, strlen(d->name) + 1);
  const char *v = getenv(name);
  bool set = v != NULL && *v != 0;
  long val = d->def;
  mc_options_str[i] = d->sdef;
  switch (d->type) {
  case MC_OT_CHOICE:
    if (set && (val = mc_choice(d->sdef, v)) == 0) mc_option_warn(d->name, " has an unknown value; ignored");
    mc_options_str[i] = NULL;
    break;
  case MC_OT_PATH:
    if (set) mc_options_str[i] = v;
    break;
  case MC_OT_RATIO:
    if (set) {
      if (strspn(v, "0123456789.eE-+") == strlen(v) && strlen(v) < MC_OPT_RATIO_MAX) mc_options_str[i] = v;
      else mc_option_warn(d->name, " is not a number; ignored");
    }
    break;
  default:
    if (set && !mc_parse(v, d->type == MC_OT_X100, &val)) {
      mc_option_warn(d->name, " has an unreadable value; using its default");
      val = d->def;
    }
    if (d->type == MC_OT_BOOL) {
      val = val != 0;
    } else if (val < d->min || val > d->max) {
      mc_option_warn(d->name, " is outside its range; clamped");
      val = val < d->min ? d->min : d->max;
    }
  }
  mc_options_cache[i] = val;
}

void mc_options_init(void) {
  /* once per process: the allocator's and the tiering's constructors both ask */
  static int state; /* 0 not read, 1 reading, 2 read */
  int expected = 0;
  if (!__atomic_compare_exchange_n(&state, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    while (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != 2) sched_yield();
    return;
  }
  mc_options_cache[MC_OPT_VERBOSE] = 1; /* warnings about VERBOSE itself */
  mc_option_read(MC_OPT_VERBOSE);         /* first: it silences the others' warnings */
  for (int i = 0; i < MC_OPT__COUNT; i++)
    if (i != MC_OPT_VERBOSE) mc_option_read(i);
  __atomic_store_n(&state, 2, __ATOMIC_RELEASE);
}

long mc_option(mc_option_t o) { return mc_options_cache[o]; }
