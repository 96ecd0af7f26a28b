/* test_vectors.c — libmemcolo against the shared test vectors of sdk/testvectors
 * (docs/protocol.md §10), read with json-c (exact 64-bit integers):
 *   - gate.json: the allow-rate gate of agent.c (M3 §4.2) replayed case by case on a
 *     synthetic clock, as every SDK does;
 *   - requests.json: the lines agent.c sends (register, reclaimed) byte for byte equal
 *     to the canonical lines of the messages it can express;
 *   - replies.json: every valid reply decoded to its meaning (the fields agent.c acts
 *     on), every invalid one ignored with the error kind of its `code`, and the
 *     over-long line longer than agent.c's line limit;
 *   - test/vectors/subrelease.json (the allocator's own, not the protocol's): the
 *     adaptive subrelease decisions of subrelease.c (ISMM'21 §3-4) replayed step by
 *     step, as memcolo-sim replays them through its Rust binding of the same file.
 * The vectors are found in $MEMCOLO_VECTORS_DIR, by default ../sdk/testvectors, and
 * $MEMCOLO_ALLOC_VECTORS_DIR, by default test/vectors (run from alloc/, as test/run.sh
 * does). */
#define _GNU_SOURCE
#include <json-c/json.h>
#include <math.h>

#include "internal.h"
#include "subrelease.h"
#include "test.h"

static json_object *load_from(const char *env, const char *fallback, const char *name) {
  const char *dir = getenv(env);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : fallback, name);
  json_object *v = json_object_from_file(path);
  if (v == NULL) {
    fprintf(stderr, "FAIL cannot read %s: %s\n", path, json_util_get_last_err());
    mc_t_failed++;
  }
  return v;
}

static json_object *load(const char *name) { return load_from("MEMCOLO_VECTORS_DIR", "../sdk/testvectors", name); }

static json_object *get(json_object *o, const char *key) {
  json_object *v = NULL;
  return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

static const char *str(json_object *o, const char *key) {
  json_object *v = get(o, key);
  return v != NULL && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static bool is(json_object *o, const char *key, const char *want) {
  const char *s = str(o, key);
  return s != NULL && strcmp(s, want) == 0;
}

/* ------------------------------------------------------------------ gate.json */
static void gate_case(json_object *c) {
  const char *name = str(c, "name");
  uint64_t min_ns = json_object_get_uint64(get(c, "min_epoch_ns"));
  CHECK(min_ns % 1000000 == 0); /* MEMCOLO_GATE_MIN_EPOCH_MS is in ms */
  mc_options_cache[MC_OPT_NUM_EPOCHS] = (long)json_object_get_int64(get(c, "num_epochs"));
  mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = (long)(min_ns / 1000000);
  mc_gate_reset();
  json_object *steps = get(c, "steps");
  for (size_t i = 0; i < json_object_array_length(steps); i++) {
    json_object *s = json_object_array_get_idx(steps, i);
    const char *op = str(s, "op");
    uint64_t t = json_object_get_uint64(get(s, "t_ns"));
    bool feeds = !is(s, "level", "low");
    if (!strcmp(op, "signal")) {
      if (feeds) mc_gate_signal_received(t);
    } else if (!strcmp(op, "handled")) {
      if (feeds) mc_gate_signal_handled(t);
    } else if (!strcmp(op, "rate")) {
      double want = json_object_get_double(get(s, "rate")), got = mc_gate_rate_at(t);
      CHECK(fabs(got - want) <= 1e-12);
      if (fabs(got - want) > 1e-12) fprintf(stderr, "  %s step %zu: rate %.17g, want %.17g\n", name, i, got, want);
    } else if (!strcmp(op, "admit")) {
      json_object *want = get(s, "admitted");
      for (size_t k = 0; k < json_object_array_length(want); k++) {
        int got = mc_gate_admit_at(t), w = json_object_get_boolean(json_object_array_get_idx(want, k));
        CHECK(got == w);
        if (got != w) fprintf(stderr, "  %s step %zu: allocation %zu admitted %d\n", name, i, k, got);
      }
    } else if (strcmp(op, "epoch") != 0) { /* agent.c has no epoch query: rates and decisions cover it */
      fprintf(stderr, "FAIL %s step %zu: unknown op %s\n", name, i, op);
      mc_t_failed++;
    }
  }
}

TEST(gate_vectors) {
  json_object *f = load("gate.json");
  if (f == NULL) return;
  long saved_num = MC_OPT(MC_OPT_NUM_EPOCHS), saved_min = MC_OPT(MC_OPT_GATE_MIN_EPOCH_MS);
  json_object *cases = get(f, "cases");
  CHECK(json_object_array_length(cases) > 0);
  for (size_t k = 0; k < json_object_array_length(cases); k++) gate_case(json_object_array_get_idx(cases, k));
  mc_options_cache[MC_OPT_NUM_EPOCHS] = saved_num;
  mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = saved_min;
  mc_gate_reset();
  json_object_put(f);
}

/* ------------------------------------------------------------------ requests.json */
/* the line agent.c writes for msg, or 0 when agent.c never sends that message */
static size_t fmt_request(json_object *msg, char *buf) {
  if (get(msg, "pid") != NULL) return 0; /* agent.c speaks for itself only */
  if (is(msg, "type", "register")) {
    const char *name = str(msg, "name");
    if (!is(msg, "notify", "socket") || get(msg, "expected_reclaim_bytes") != NULL) return 0;
    if (name != NULL) { /* comm: at most 15 bytes, ASCII (other bytes are sent as '?') */
      if (strlen(name) > 15) return 0;
      for (const char *p = name; *p; p++) if ((unsigned char)*p >= 0x80) return 0;
    }
    return mc_agent_fmt_register(buf, str(msg, "class"), name);
  }
  if (is(msg, "type", "reclaimed")) {
    if (!json_object_get_boolean(get(msg, "ok")) || get(msg, "seq") == NULL) return 0;
    return mc_agent_fmt_reclaimed(buf, json_object_get_uint64(get(msg, "seq")), json_object_get_uint64(get(msg, "bytes")),
                                  json_object_get_uint64(get(msg, "duration_ms")));
  }
  return 0;
}

TEST(request_vectors) {
  json_object *f = load("requests.json");
  if (f == NULL) return;
  json_object *valid = get(f, "valid");
  int registers = 0, reclaimeds = 0;
  for (size_t k = 0; k < json_object_array_length(valid); k++) {
    json_object *v = json_object_array_get_idx(valid, k);
    if (!json_object_get_boolean(get(v, "canonical"))) continue;
    char buf[MC_AGENT_LINE_CAP];
    size_t n = fmt_request(get(v, "message"), buf);
    if (n == 0) continue;
    const char *line = str(v, "line");
    size_t len = strlen(line);
    bool same = n == len + 1 && memcmp(buf, line, len) == 0 && buf[len] == '\n';
    CHECK(same);
    if (!same) fprintf(stderr, "  %s: sent %.*s\n", str(v, "name"), (int)n, buf);
    if (is(get(v, "message"), "type", "register")) registers++;
    else reclaimeds++;
  }
  CHECK(registers >= 2 && reclaimeds >= 2); /* the file still holds what agent.c sends */
  json_object_put(f);
}

/* ------------------------------------------------------------------ replies.json */
static void check_valid_reply(const char *name, const char *line, json_object *msg) {
  mc_agent_reply_t m;
  mc_agent_parse_reply(line, strlen(line), &m);
  const char *type = str(msg, "type");
  bool ok;
  if (!strcmp(type, "notify")) {
    static const char *const levels[] = {"low", "high", "top"};
    ok = m.kind == MC_AG_NOTIFY && m.seq == json_object_get_uint64(get(msg, "seq")) &&
         m.target_bytes == json_object_get_uint64(get(msg, "target_bytes")) && (unsigned)m.level <= MEMCOLO_LEVEL_TOP &&
         is(msg, "level", levels[m.level]);
  } else if (!strcmp(type, "registered")) {
    static const char *const classes[] = {"", "lc", "be", "elastic"};
    ok = m.kind == MC_AG_REGISTERED && m.cls >= 1 && m.cls <= 3 && is(msg, "class", classes[m.cls]);
  } else if (!strcmp(type, "error")) {
    const char *code = str(msg, "code");
    ok = m.kind == MC_AG_ERROR && m.code_len == strlen(code) && memcmp(m.code, code, m.code_len) == 0;
  } else {
    ok = m.kind == MC_AG_OTHER;
  }
  CHECK(ok);
  if (!ok) fprintf(stderr, "  %s: decoded as kind %d (%s)\n", name, m.kind, m.why ? m.why : "");
}

TEST(reply_vectors) {
  json_object *f = load("replies.json");
  if (f == NULL) return;
  CHECK(json_object_get_int64(get(f, "max_line_bytes")) == MC_AGENT_MAX_LINE);
  json_object *valid = get(f, "valid"), *invalid = get(f, "invalid"), *too_long = get(f, "too_long");
  for (size_t k = 0; k < json_object_array_length(valid); k++) {
    json_object *v = json_object_array_get_idx(valid, k);
    check_valid_reply(str(v, "name"), str(v, "line"), get(v, "message"));
  }
  for (size_t k = 0; k < json_object_array_length(invalid); k++) {
    json_object *v = json_object_array_get_idx(invalid, k);
    const char *line = str(v, "line");
    mc_agent_reply_t m;
    mc_agent_parse_reply(line, strlen(line), &m);
    bool ok = m.kind == MC_AG_IGNORED && m.newer_version == is(v, "code", "unsupported_version");
    CHECK(ok);
    if (!ok) fprintf(stderr, "  %s: not ignored (kind %d) or wrong code\n", str(v, "name"), m.kind);
  }
  /* agent.c discards a line that does not end within MC_AGENT_MAX_LINE bytes */
  size_t n = strlen(str(too_long, "prefix")) + strlen(str(too_long, "fill")) * json_object_get_uint64(get(too_long, "count")) +
             strlen(str(too_long, "suffix"));
  CHECK(n > MC_AGENT_MAX_LINE);
  json_object_put(f);
}

/* ------------------------------------------------------------------ subrelease.json */
static uint64_t u64(json_object *o, const char *key) { return json_object_get_uint64(get(o, key)); }

static void expect_u64(const char *name, size_t i, const char *what, uint64_t got, json_object *want) {
  if (want == NULL) return;
  uint64_t w = json_object_get_uint64(want);
  CHECK(got == w);
  if (got != w) fprintf(stderr, "  %s step %zu: %s %llu, want %llu\n", name, i, what, (unsigned long long)got, (unsigned long long)w);
}

static void subrelease_case(json_object *c) {
  const char *name = str(c, "name");
  json_object *set = get(c, "settings");
  static mc_subrelease_t sr; /* 48 KiB: not on the stack */
  mc_sr_init(&sr, u64(set, "skip_subrelease_s"), u64(set, "t_schedule_s"), u64(set, "release_rate_bytes"));
  json_object *steps = get(c, "steps");
  for (size_t i = 0; i < json_object_array_length(steps); i++) {
    json_object *s = json_object_array_get_idx(steps, i), *want = get(s, "expect");
    const char *op = str(s, "op");
    uint64_t now = u64(s, "now_ms");
    size_t used = (size_t)u64(s, "used"), fr = (size_t)u64(s, "free");
    if (!strcmp(op, "record")) {
      mc_sr_record(&sr, now, used, fr);
    } else if (!strcmp(op, "note")) {
      mc_sr_note(&sr, used, fr);
    } else if (!strcmp(op, "skipped")) {
      mc_sr_skipped(&sr, now, used, fr, (size_t)u64(s, "pages"));
    } else if (!strcmp(op, "peak")) {
      expect_u64(name, i, "peak", mc_sr_peak_used(&sr, now, used, fr), want);
    } else if (!strcmp(op, "recent_peak")) {
      expect_u64(name, i, "recent peak", mc_sr_recent_peak_used(&sr, used), want);
    } else if (!strcmp(op, "budget")) {
      size_t pages;
      bool decided = mc_sr_release_budget(&sr, now, used, fr, (size_t)u64(s, "protect"), &pages);
      expect_u64(name, i, "decided", decided, get(want, "decided"));
      expect_u64(name, i, "pages", pages, get(want, "pages"));
    } else if (!strcmp(op, "stats")) {
      mc_sr_stats_t st;
      mc_sr_stats(&sr, now, used, fr, &st);
      expect_u64(name, i, "realized fragmentation", st.realized_fragmentation_pages, get(want, "realized_fragmentation_pages"));
      expect_u64(name, i, "skipped", st.skipped_pages, get(want, "skipped_pages"));
      expect_u64(name, i, "correct", st.correct_pages, get(want, "correct_pages"));
      expect_u64(name, i, "incorrect", st.incorrect_pages, get(want, "incorrect_pages"));
    } else {
      fprintf(stderr, "FAIL %s step %zu: unknown op %s\n", name, i, op);
      mc_t_failed++;
    }
  }
}

TEST(subrelease_vectors) {
  json_object *f = load_from("MEMCOLO_ALLOC_VECTORS_DIR", "test/vectors", "subrelease.json");
  if (f == NULL) return;
  json_object *cases = get(f, "cases");
  CHECK(json_object_array_length(cases) > 0);
  for (size_t k = 0; k < json_object_array_length(cases); k++) subrelease_case(json_object_array_get_idx(cases, k));
  json_object_put(f);
}

int main(void) {
  mc_ensure_init();
  RUN(gate_vectors);
  RUN(request_vectors);
  RUN(reply_vectors);
  RUN(subrelease_vectors);
  TEST_END();
}
