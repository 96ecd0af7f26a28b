/* options.c — the one table of MEMCOLO_* options, read from the environment once at
 * initialization (getenv allocates nothing, so this is safe inside malloc). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct { const char *name; long def; const char *unit; } mc_option_desc_t;

static const mc_option_desc_t mc_option_table[MC_OPT__COUNT] = {
  [MC_OPT_CLASS] = {"CLASS", 0, "lc|be|elastic; lc turns the Hermes reservation on"},
  [MC_OPT_RESERVE] = {"RESERVE", -1, "1/0 forces the reservation on/off; -1 = by class"},
  [MC_OPT_RESERVE_INTERVAL_US] = {"RESERVE_INTERVAL_US", 2000, "us, management thread period"},
  [MC_OPT_RSV_FACTOR_PCT] = {"RSV_FACTOR", 200, "x100 (RSV_FACTOR=2 -> 200; decimals allowed)"},
  [MC_OPT_MIN_RSV_BYTES] = {"MIN_RSV", 5L << 20, "bytes (suffix k/m/g), min_rsv"},
  [MC_OPT_TRIM_FACTOR_PCT] = {"TRIM_FACTOR", 400, "x100 of the target, TRIM_THR"},
  [MC_OPT_MLOCK] = {"MLOCK", 1, "1 = mlock the pooled large blocks until handed out (Hermes §4), when permitted; 0 = never"},
  [MC_OPT_RELEASE_RATE_BYTES] = {"RELEASE_RATE", 1L << 20, "bytes/s of periodic release"},
  [MC_OPT_SKIP_SUBRELEASE_S] = {"SKIP_SUBRELEASE_S", 60, "s, Delta (0 = off)"},
  [MC_OPT_T_SCHEDULE_S] = {"T_SCHEDULE_S", 300, "s, realized fragmentation window"},
  [MC_OPT_HP_CACHE_BYTES] = {"HP_CACHE", 16L << 20, "bytes of backed free huge pages kept"},
  [MC_OPT_TCACHE_BYTES] = {"TCACHE", 2L << 20, "bytes per thread cache"},
  [MC_OPT_THP] = {"THP", 1, "0 none, 1 THP by background MADV_COLLAPSE, 2 MADV_HUGEPAGE at mmap"},
  [MC_OPT_STATS] = {"STATS", 0, "1 = telemetry report on stderr at exit"},
  [MC_OPT_VERBOSE] = {"VERBOSE", 1, "1 = warnings on stderr"},
  [MC_OPT_AGENT] = {"AGENT", 1, "1 = register with the agent when a class is set"},
  [MC_OPT_NUM_EPOCHS] = {"NUM_EPOCHS", 5, "allow-rate gate: epochs until the rate is back at 1"},
  [MC_OPT_GATE_MIN_EPOCH_MS] = {"GATE_MIN_EPOCH_MS", 1000, "ms, allow-rate gate: shortest epoch (0 = handling time alone)"},
  [MC_OPT_TOP_HOLD_S] = {"TOP_HOLD_S", 10, "s without reservation after a top notification"},
  [MC_OPT_RSV_HORIZON_MS] = {"RSV_HORIZON_MS", 100, "ms of the measured demand rate that the reserves also hold (0 = Hermes' RSV_FACTOR x last interval alone)"},
  [MC_OPT_RSV_TRACE] = {"RSV_TRACE", 0, "1 = the management thread's samples (reserve levels, targets, demand, pre-faulted bytes; up to 16384) as CSV on stderr at exit"},
  [MC_OPT_RSV_BACKOFF] = {"RSV_BACKOFF", 0, "while the application misses the empty pool and is itself busy (runnable or waiting on the pool): 1 = stop pre-faulting until it idles or its demand falls, 2 = keep pre-faulting at the process's nice without making it wait, 0 = never back off"},
  [MC_OPT_RSV_YIELD_US] = {"RSV_YIELD_US", 200, "us: the longest the application thread waits for the management thread's CPU while it pre-faults; then the thread sleeps as long (0 = never steps aside)"},
  [MC_OPT_RSV_YIELD_WAIT_US] = {"RSV_YIELD_WAIT_US", 200, "us the application thread must have waited for the management thread's CPU (runnable there, not run since) before the fill steps aside; 0 = at the first pre-fault step that finds it waiting"},
  [MC_OPT_RSV_YIELD_MODE] = {"RSV_YIELD_MODE", 3, "how the fill steps aside: 0 = sleeps RSV_YIELD_US, 1 = sched_yield, 2 = moves to another CPU (affinity) while the application thread is runnable, 3 = as 0, and SCHED_IDLE while the application thread is busy (runnable at 3 looks in a row)"},
  [MC_OPT_MGMT_SLICE_US] = {"MGMT_SLICE_US", 0, "us, the management thread's EEVDF slice (sched_setattr sched_runtime, Linux >= 6.12, clamped by the kernel to 100..100000); 0 = the kernel's base slice"},
  [MC_OPT_MGMT_NICE] = {"MGMT_NICE", -10, "nice of the management thread while the reservation is on (-20..19; needs CAP_SYS_NICE below 0, else left at the process's)"},
};

long mc_options_cache[MC_OPT__COUNT];

const char *mc_option_name(mc_option_t o) { return mc_option_table[o].name; }

/* Parses "123", "1.5", "64k", "5m", "1g"; returns def on junk. Decimal with scale
 * 100 for the _PCT options. */
static long mc_parse(const char *s, long def, bool pct) {
  if (s == NULL || *s == 0) return def;
  long whole = 0, frac = 0, frac_div = 1;
  const char *c = s;
  bool neg = false;
  if (*c == '-') { neg = true; c++; }
  if (*c < '0' || *c > '9') return def;
  while (*c >= '0' && *c <= '9') whole = whole * 10 + (*c++ - '0');
  if (*c == '.') {
    c++;
    while (*c >= '0' && *c <= '9') { if (frac_div < 1000000) { frac = frac * 10 + (*c - '0'); frac_div *= 10; } c++; }
  }
  long mult = 1;
  if (*c == 'k' || *c == 'K') { mult = 1L << 10; c++; }
  else if (*c == 'm' || *c == 'M') { mult = 1L << 20; c++; }
  else if (*c == 'g' || *c == 'G') { mult = 1L << 30; c++; }
  if (*c == 'b' || *c == 'B') c++;
  if (*c != 0) return def;
  if (pct) mult *= 100;
  long v = whole * mult + (frac * mult) / frac_div;
  return neg ? -v : v;
}

void mc_options_init(void) {
  char name[64];
  for (int i = 0; i < MC_OPT__COUNT; i++) {
    const mc_option_desc_t *d = &mc_option_table[i];
    memcpy(name, "MEMCOLO_", 8);
    size_t n = strlen(d->name);
    memcpy(name + 8, d->name, n + 1);
    const char *v = getenv(name);
    if (i == MC_OPT_CLASS) {
      long c = 0;
      if (v != NULL) {
        if (strcmp(v, "lc") == 0) c = 1;
        else if (strcmp(v, "be") == 0) c = 2;
        else if (strcmp(v, "elastic") == 0) c = 3;
        else if (*v) mc_warn("MEMCOLO_CLASS must be lc, be or elastic; ignored");
      }
      mc_options_cache[i] = c;
      continue;
    }
    bool pct = (i == MC_OPT_RSV_FACTOR_PCT || i == MC_OPT_TRIM_FACTOR_PCT);
    long val = mc_parse(v, d->def, pct);
    if (v != NULL && *v && val == d->def && mc_parse(v, d->def - 1, pct) != d->def) {
      mc_warn("a MEMCOLO_ option has an unreadable value; using its default");
    }
    mc_options_cache[i] = val;
  }
  if (mc_options_cache[MC_OPT_RESERVE_INTERVAL_US] < 100) mc_options_cache[MC_OPT_RESERVE_INTERVAL_US] = 100;
  if (mc_options_cache[MC_OPT_T_SCHEDULE_S] < 1) mc_options_cache[MC_OPT_T_SCHEDULE_S] = 1;
  if (mc_options_cache[MC_OPT_T_SCHEDULE_S] > 900) mc_options_cache[MC_OPT_T_SCHEDULE_S] = 900;
  if (mc_options_cache[MC_OPT_SKIP_SUBRELEASE_S] < 0) mc_options_cache[MC_OPT_SKIP_SUBRELEASE_S] = 0;
  if (mc_options_cache[MC_OPT_SKIP_SUBRELEASE_S] > 900) mc_options_cache[MC_OPT_SKIP_SUBRELEASE_S] = 900;
  if (mc_options_cache[MC_OPT_RSV_HORIZON_MS] < 0) mc_options_cache[MC_OPT_RSV_HORIZON_MS] = 0;
  if (mc_options_cache[MC_OPT_RSV_HORIZON_MS] > 10000) mc_options_cache[MC_OPT_RSV_HORIZON_MS] = 10000;
  if (mc_options_cache[MC_OPT_RSV_YIELD_US] < 0) mc_options_cache[MC_OPT_RSV_YIELD_US] = 0;
  if (mc_options_cache[MC_OPT_RSV_YIELD_WAIT_US] < 0) mc_options_cache[MC_OPT_RSV_YIELD_WAIT_US] = 0;
  if (mc_options_cache[MC_OPT_RSV_YIELD_MODE] < 0 || mc_options_cache[MC_OPT_RSV_YIELD_MODE] > 3) mc_options_cache[MC_OPT_RSV_YIELD_MODE] = 0;
  if (mc_options_cache[MC_OPT_MGMT_SLICE_US] < 0) mc_options_cache[MC_OPT_MGMT_SLICE_US] = 0;
  if (mc_options_cache[MC_OPT_MGMT_NICE] < -20) mc_options_cache[MC_OPT_MGMT_NICE] = -20;
  if (mc_options_cache[MC_OPT_MGMT_NICE] > 19) mc_options_cache[MC_OPT_MGMT_NICE] = 19;
  if (mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] < 0) mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = 0;
  if (mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] > 3600000) mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = 3600000;
}

long mc_option(mc_option_t o) { return mc_options_cache[o]; }
