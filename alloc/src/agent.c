/* agent.c — the link to the memcolo agent (M3 §4; the client side of docs/protocol.md).
 *
 * A background thread, started for processes with a class (MEMCOLO_CLASS), connects to
 * the agent's Unix socket ($MEMCOLO_SOCKET, default /run/memcolo/agent.sock), registers
 * the process (`register{class, name = /proc/self/comm, notify: socket}`) and answers
 * every `notify{seq, level, target_bytes}` with `reclaimed{seq, bytes, duration_ms}`:
 *   low   release the free huge page cache (and the cache of freed regions) beyond the
 *         Hermes reservation target;
 *   high  also empty the central transfer caches and subrelease free 4 KiB pages of
 *         partially used huge pages, up to the notification's target;
 *   top   also drop the Hermes reservation (pool and pre-faulted pages) for
 *         MEMCOLO_TOP_HOLD_S seconds, and release everything free.
 * Releases demanded by the agent ignore the skip-subrelease interval Delta (ISMM'21 §4.1
 * is about periodic release). An application may add its own layer above the
 * allocator's (memcolo_on_pressure), which runs first (M3 §3: upper layer first).
 * High and top feed the allow-rate gate (M3 §4.2; the same formula as the SDKs):
 * rate 0 at receipt, epoch = handling time but at least MEMCOLO_GATE_MIN_EPOCH_MS
 * (default 1 s, one poll of the agent: protocol §9), rate = min(elapsed / (epoch x
 * NUM_epochs), 1).
 * The `registered` reply carries the class the agent recorded: `lc` turns the
 * reservation on, any other class off (unless MEMCOLO_RESERVE forces it).
 *
 * Rules this thread keeps:
 *   - it never blocks an allocation: it holds no allocator lock while it waits or does
 *     I/O, and releases memory in chunks of MC_AGENT_CHUNK_BYTES per heap-lock hold;
 *   - it never calls malloc: static buffers, a hand-written JSON scanner and formatter,
 *     plain system calls (socket, connect, poll, read, send);
 *   - no agent is not an error: while the socket is absent or refuses, it retries with
 *     exponential backoff (100 ms doubling to 5 s) and prints nothing; after the agent
 *     closes the connection (a restart) it reconnects and registers again;
 *   - it runs with every signal blocked, so application handlers never run on it;
 *   - fork: the child has no agent thread and closes its copy of the connection; it
 *     stays standalone (as it has no reservation thread either), and a child that
 *     execs starts its own link from its environment.
 * Lines it cannot use (not JSON, newer `v`, unknown type, over 65,536 bytes) are
 * ignored and reported once per kind (MEMCOLO_VERBOSE). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define AG_MAX_LINE MC_AGENT_MAX_LINE
#define AG_BACKOFF_MIN_MS 100
#define AG_BACKOFF_MAX_MS 5000
#define AG_TICK_MS 1000
#define AG_SEND_TIMEOUT_S 5
#define MC_AGENT_CHUNK_BYTES ((size_t)4 << 20)   /* released per heap-lock hold */

static char ag_sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static int ag_fd = -1;
static volatile int ag_started;
static char ag_rbuf[AG_MAX_LINE + 2];
static size_t ag_rlen;
static int ag_discarding;

/* telemetry (memcolo_stats) */
static volatile int ag_registered;
static uint64_t ag_registrations, ag_notifications, ag_released_bytes;

static memcolo_pressure_fn ag_user_fn;
static void *ag_user_arg;

/* ------------------------------------------------------------------ warnings */
enum { W_MALFORMED, W_VERSION, W_TOO_LONG, W_TYPE, W_ERROR, W_REFUSED, W_PATH, W_THREAD, W__N };
static int ag_warned[W__N];

static void ag_warn_once(int kind, const char *msg, const char *detail, size_t detail_len) {
  if (__atomic_exchange_n(&ag_warned[kind], 1, __ATOMIC_RELAXED)) return;
  if (MC_OPT(MC_OPT_VERBOSE) == 0) return;
  char buf[256];
  size_t n = 0;
  const char *pre = "memcolo: warning: agent link: ";
  size_t l = strlen(pre);
  memcpy(buf, pre, l); n += l;
  l = strlen(msg);
  if (l > 150) l = 150;
  memcpy(buf + n, msg, l); n += l;
  if (detail != NULL && detail_len > 0) {
    if (detail_len > 60) detail_len = 60;
    buf[n++] = ' ';
    for (size_t i = 0; i < detail_len; i++) buf[n++] = (detail[i] >= 0x20 && detail[i] < 0x7f) ? detail[i] : '?';
  }
  buf[n++] = '\n';
  buf[n] = 0;
  mc_write_str(2, buf);
}

/* ------------------------------------------------------------------ allow-rate gate (M3 §4.2) */
/* The same semantics as sdk/c/src/gate.c: no signal yet -> 1; a signal received but
 * not yet handled -> 0; afterwards min(elapsed / (epoch x NUM_epochs), 1), the epoch
 * held to at least MEMCOLO_GATE_MIN_EPOCH_MS (default 1000; docs/protocol.md §9: M3's
 * epoch lasts until memory has been returned, which the agent sees at its next poll, so
 * a release done in milliseconds must not reopen the gate before that poll). Atomics, no
 * lock: readers may see a mix of two updates for an instant, which only shifts the
 * rate by one update. */
static uint64_t gate_signal_ns, gate_epoch_ns, gate_count;
static int gate_has_signal, gate_has_epoch;

void mc_gate_reset(void) {
  __atomic_store_n(&gate_has_signal, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&gate_has_epoch, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&gate_count, 0, __ATOMIC_RELAXED);
}

void mc_gate_signal_received(uint64_t now_ns) {
  __atomic_store_n(&gate_signal_ns, now_ns, __ATOMIC_RELAXED);
  __atomic_store_n(&gate_count, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&gate_has_signal, 1, __ATOMIC_RELEASE);
}

void mc_gate_signal_handled(uint64_t now_ns) {
  if (!__atomic_load_n(&gate_has_signal, __ATOMIC_ACQUIRE)) return;
  uint64_t s = __atomic_load_n(&gate_signal_ns, __ATOMIC_RELAXED);
  uint64_t epoch = now_ns > s ? now_ns - s : 0;
  uint64_t min_epoch = (uint64_t)MC_OPT(MC_OPT_GATE_MIN_EPOCH_MS) * 1000000u;
  __atomic_store_n(&gate_epoch_ns, epoch > min_epoch ? epoch : min_epoch, __ATOMIC_RELAXED);
  __atomic_store_n(&gate_has_epoch, 1, __ATOMIC_RELEASE);
}

/* The time since the last signal and the window (epoch x NUM_epochs), ns: {0, 0}
 * without a signal (full rate), {0, 1} while the first signal has no epoch yet (rate
 * 0); the window saturates. floor(1/r) is window / elapsed in integers, so that the
 * decisions are the SDKs' on the same clock readings (sdk/testvectors/gate.json). */
static void gate_elapsed_window(uint64_t now_ns, uint64_t *elapsed, uint64_t *window) {
  *elapsed = 0;
  *window = 0;
  if (!__atomic_load_n(&gate_has_signal, __ATOMIC_ACQUIRE)) return;
  *window = 1;
  if (!__atomic_load_n(&gate_has_epoch, __ATOMIC_ACQUIRE)) return;
  long num = MC_OPT(MC_OPT_NUM_EPOCHS);
  if (__builtin_mul_overflow(__atomic_load_n(&gate_epoch_ns, __ATOMIC_RELAXED), (uint64_t)(num > 0 ? num : 1), window))
    *window = UINT64_MAX;
  uint64_t s = __atomic_load_n(&gate_signal_ns, __ATOMIC_RELAXED);
  *elapsed = now_ns > s ? now_ns - s : 0;
}

double mc_gate_rate_at(uint64_t now_ns) {
  uint64_t elapsed, window;
  gate_elapsed_window(now_ns, &elapsed, &window);
  return elapsed >= window ? 1.0 : (double)elapsed / (double)window;
}

int mc_gate_admit_at(uint64_t now_ns) {
  uint64_t elapsed, window;
  gate_elapsed_window(now_ns, &elapsed, &window);
  if (elapsed >= window) { __atomic_store_n(&gate_count, 0, __ATOMIC_RELAXED); return 1; }
  uint64_t c = __atomic_add_fetch(&gate_count, 1, __ATOMIC_RELAXED);
  if (elapsed == 0) return 0;
  if (c >= window / elapsed) { __atomic_store_n(&gate_count, 0, __ATOMIC_RELAXED); return 1; }
  return 0;
}

MC_EXPORT double memcolo_allow_rate(void) { mc_ensure_init(); return mc_gate_rate_at(mc_now_ns()); }
MC_EXPORT int memcolo_allow_admit(void) { mc_ensure_init(); return mc_gate_admit_at(mc_now_ns()); }

MC_EXPORT void memcolo_on_pressure(memcolo_pressure_fn fn, void *arg) {
  __atomic_store_n(&ag_user_arg, arg, __ATOMIC_RELAXED);
  __atomic_store_n(&ag_user_fn, fn, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------ release by level */
/* Releases in chunks so that the heap lock is never held for a whole release. */
static size_t release_chunks(size_t want, bool cache_only, size_t protect_cache) {
  size_t done = 0;
  while (done < want) {
    size_t step = want - done < MC_AGENT_CHUNK_BYTES ? want - done : MC_AGENT_CHUNK_BYTES;
    pthread_mutex_lock(&mc_heap.lock);
    size_t n = mc_heap_release_locked(step, cache_only, protect_cache);
    pthread_mutex_unlock(&mc_heap.lock);
    if (n == 0) break;
    done += n;
  }
  return done;
}

size_t mc_agent_release(memcolo_level_t level, size_t target_bytes) {
  mc_ensure_init();
  size_t done = 0;
  /* top: the pool's blocks go back to the page heap, the pre-faulted pages lose their
   * protection, and the management thread refills nothing for MEMCOLO_TOP_HOLD_S */
  if (level == MEMCOLO_LEVEL_TOP) mc_reserve_suspend((uint64_t)MC_OPT(MC_OPT_TOP_HOLD_S) * 1000u);
  if (level != MEMCOLO_LEVEL_LOW) mc_central_drain();
  size_t protect = level == MEMCOLO_LEVEL_TOP ? 0 : mc_reserve_target_bytes();
  /* the caches of free huge pages and freed regions: idle memory, all of it */
  done += release_chunks(SIZE_MAX, true, protect);
  if (level == MEMCOLO_LEVEL_LOW) return done;
  /* subrelease: up to the target on high, everything on top (M3 §5.1: "in hopes of
   * reclaiming all possible memory") */
  size_t want = SIZE_MAX;
  if (level == MEMCOLO_LEVEL_HIGH && target_bytes != 0) want = target_bytes > done ? target_bytes - done : 0;
  done += release_chunks(want, false, protect);
  return done;
}

MC_EXPORT size_t memcolo_release(memcolo_level_t level, size_t target_bytes) {
  if ((unsigned)level > MEMCOLO_LEVEL_TOP) return 0;
  return mc_agent_release(level, target_bytes);
}

/* ------------------------------------------------------------------ JSON scanner */
/* Just enough JSON for the agent's replies: one object per line, its top-level
 * members as raw spans (strings without their quotes, escapes left as they are).
 * Nested values are validated and skipped. */
typedef struct { const char *k, *v; size_t kn, vn; char t; /* 's' string, 'n' number, 'o' other */ } ag_kv_t;

static void skip_ws(const char *s, size_t n, size_t *i) {
  while (*i < n && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\r' || s[*i] == '\n')) (*i)++;
}

static bool scan_string(const char *s, size_t n, size_t *i) { /* at '"' */
  (*i)++;
  while (*i < n) {
    unsigned char c = (unsigned char)s[*i];
    if (c == '"') { (*i)++; return true; }
    if (c < 0x20) return false;
    if (c == '\\') {
      if (*i + 1 >= n) return false;
      char e = s[*i + 1];
      if (e == 'u') {
        if (*i + 5 >= n) return false;
        for (int k = 2; k < 6; k++) {
          char h = s[*i + k];
          if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) return false;
        }
        *i += 6;
        continue;
      }
      if (!strchr("\"\\/bfnrt", e)) return false;
      *i += 2;
      continue;
    }
    (*i)++;
  }
  return false;
}

static bool scan_number(const char *s, size_t n, size_t *i) {
  size_t st = *i;
  if (*i < n && s[*i] == '-') (*i)++;
  if (*i >= n || s[*i] < '0' || s[*i] > '9') return false;
  if (s[*i] == '0') (*i)++;
  else while (*i < n && s[*i] >= '0' && s[*i] <= '9') (*i)++;
  if (*i < n && s[*i] == '.') {
    (*i)++;
    if (*i >= n || s[*i] < '0' || s[*i] > '9') return false;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9') (*i)++;
  }
  if (*i < n && (s[*i] == 'e' || s[*i] == 'E')) {
    (*i)++;
    if (*i < n && (s[*i] == '+' || s[*i] == '-')) (*i)++;
    if (*i >= n || s[*i] < '0' || s[*i] > '9') return false;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9') (*i)++;
  }
  return *i > st;
}

static bool scan_value(const char *s, size_t n, size_t *i, int depth) {
  if (depth > 32) return false;
  skip_ws(s, n, i);
  if (*i >= n) return false;
  char c = s[*i];
  if (c == '"') return scan_string(s, n, i);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    (*i)++;
    skip_ws(s, n, i);
    if (*i < n && s[*i] == close) { (*i)++; return true; }
    for (;;) {
      if (c == '{') {
        skip_ws(s, n, i);
        if (*i >= n || s[*i] != '"' || !scan_string(s, n, i)) return false;
        skip_ws(s, n, i);
        if (*i >= n || s[*i] != ':') return false;
        (*i)++;
      }
      if (!scan_value(s, n, i, depth + 1)) return false;
      skip_ws(s, n, i);
      if (*i >= n) return false;
      if (s[*i] == ',') { (*i)++; continue; }
      if (s[*i] == close) { (*i)++; return true; }
      return false;
    }
  }
  static const char *const lits[] = {"true", "false", "null"};
  for (int k = 0; k < 3; k++) {
    size_t l = strlen(lits[k]);
    if (n - *i >= l && memcmp(s + *i, lits[k], l) == 0) { *i += l; return true; }
  }
  return scan_number(s, n, i);
}

/* Parses one object; returns the number of members (at most max), -1 if not an object. */
static int json_object(const char *s, size_t n, ag_kv_t *kv, int max) {
  size_t i = 0;
  int cnt = 0;
  skip_ws(s, n, &i);
  if (i >= n || s[i] != '{') return -1;
  i++;
  skip_ws(s, n, &i);
  if (i < n && s[i] == '}') { i++; goto end; }
  for (;;) {
    skip_ws(s, n, &i);
    if (i >= n || s[i] != '"') return -1;
    size_t ks = i + 1;
    if (!scan_string(s, n, &i)) return -1;
    size_t ke = i - 1;
    skip_ws(s, n, &i);
    if (i >= n || s[i] != ':') return -1;
    i++;
    skip_ws(s, n, &i);
    size_t vs = i;
    char t = i < n && s[i] == '"' ? 's' : (i < n && (s[i] == '-' || (s[i] >= '0' && s[i] <= '9')) ? 'n' : 'o');
    if (!scan_value(s, n, &i, 1)) return -1;
    if (cnt < max) {
      kv[cnt].k = s + ks;
      kv[cnt].kn = ke - ks;
      kv[cnt].v = t == 's' ? s + vs + 1 : s + vs;
      kv[cnt].vn = t == 's' ? i - vs - 2 : i - vs;
      kv[cnt].t = t;
      cnt++;
    }
    skip_ws(s, n, &i);
    if (i < n && s[i] == ',') { i++; continue; }
    if (i < n && s[i] == '}') { i++; break; }
    return -1;
  }
end:
  skip_ws(s, n, &i);
  return i == n ? cnt : -1;
}

static const ag_kv_t *kv_get(const ag_kv_t *kv, int n, const char *key) {
  size_t l = strlen(key);
  for (int i = 0; i < n; i++) {
    if (kv[i].kn == l && memcmp(kv[i].k, key, l) == 0) return &kv[i];
  }
  return NULL;
}

static bool kv_is(const ag_kv_t *e, const char *s) {
  return e != NULL && e->t == 's' && e->vn == strlen(s) && memcmp(e->v, s, e->vn) == 0;
}

/* an unsigned JSON integer: digits only, no sign, fraction or exponent, no overflow */
static bool kv_u64(const ag_kv_t *e, uint64_t *out) {
  if (e == NULL || e->t != 'n' || e->vn == 0) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < e->vn; i++) {
    char c = e->v[i];
    if (c < '0' || c > '9') return false;
    if (v > (UINT64_MAX - (uint64_t)(c - '0')) / 10) return false;
    v = v * 10 + (uint64_t)(c - '0');
  }
  *out = v;
  return true;
}

/* a JSON integer in the range of a pid (i32): optional minus, digits only */
static bool kv_pid(const ag_kv_t *e) {
  if (e == NULL || e->t != 'n' || e->vn == 0) return false;
  size_t i = e->v[0] == '-' ? 1 : 0;
  if (i == e->vn) return false;
  uint64_t v = 0;
  for (; i < e->vn; i++) {
    char c = e->v[i];
    if (c < '0' || c > '9') return false;
    v = v * 10 + (uint64_t)(c - '0');
    if (v > 2147483648u) return false;
  }
  return e->v[0] == '-' || v <= 2147483647u;
}

/* ------------------------------------------------------------------ socket I/O */
static bool ag_send(int fd, const char *buf, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false; /* EAGAIN after SO_SNDTIMEO: an agent that does not read */
    }
    buf += w;
    n -= (size_t)w;
  }
  return true;
}

static char *put(char *b, const char *s) {
  size_t l = strlen(s);
  memcpy(b, s, l);
  return b + l;
}

/* a JSON string body (quotes excluded) of at most max input bytes, escaped as the
 * reference encoder (serde_json) does, so that the line is canonical (protocol §10) */
static char *put_json_str(char *b, const char *s, size_t max) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < max && s[i]; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *short_esc = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
    if (c == '"' || c == '\\') { *b++ = '\\'; *b++ = (char)c; }
    else if (short_esc != NULL) b = put(b, short_esc);
    else if (c < 0x20) { b = put(b, "\\u00"); *b++ = hex[c >> 4]; *b++ = hex[c & 15]; }
    else if (c >= 0x80) *b++ = '?'; /* comm is not necessarily UTF-8 */
    else *b++ = (char)c;
  }
  return b;
}

static const char *class_name(long c) {
  switch (c) {
  case 1: return "lc";
  case 2: return "be";
  case 3: return "elastic";
  default: return NULL;
  }
}

size_t mc_agent_fmt_register(char *buf, const char *cls, const char *comm) {
  char *b = buf;
  b = put(b, "{\"v\":1,\"type\":\"register\",\"class\":\"");
  b = put(b, cls);
  b = put(b, "\"");
  if (comm != NULL && comm[0]) {
    b = put(b, ",\"name\":\"");
    b = put_json_str(b, comm, 16);
    b = put(b, "\"");
  }
  b = put(b, ",\"notify\":\"socket\"}\n");
  return (size_t)(b - buf);
}

size_t mc_agent_fmt_reclaimed(char *buf, uint64_t seq, uint64_t bytes, uint64_t duration_ms) {
  char *b = buf;
  b = put(b, "{\"v\":1,\"type\":\"reclaimed\",\"seq\":");
  b = mc_fmt_u64(b, seq);
  b = put(b, ",\"bytes\":");
  b = mc_fmt_u64(b, bytes);
  b = put(b, ",\"duration_ms\":");
  b = mc_fmt_u64(b, duration_ms);
  b = put(b, ",\"ok\":true}\n");
  return (size_t)(b - buf);
}

static bool ag_send_register(int fd) {
  char comm[32] = {0};
  int cf = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (cf >= 0) {
    ssize_t n = read(cf, comm, sizeof(comm) - 1);
    close(cf);
    if (n > 0 && comm[n - 1] == '\n') comm[n - 1] = 0;
  }
  char buf[MC_AGENT_LINE_CAP];
  return ag_send(fd, buf, mc_agent_fmt_register(buf, class_name(MC_OPT(MC_OPT_CLASS)), comm));
}

static bool ag_send_reclaimed(int fd, uint64_t seq, uint64_t bytes, uint64_t duration_ms) {
  char buf[MC_AGENT_LINE_CAP];
  return ag_send(fd, buf, mc_agent_fmt_reclaimed(buf, seq, bytes, duration_ms));
}

static int ag_connect(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a;
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, ag_sock_path, strlen(ag_sock_path) + 1);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) { close(fd); return -1; }
  struct timeval tv = {AG_SEND_TIMEOUT_S, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

/* ------------------------------------------------------------------ messages */
static void ag_apply_class(int cls) {
  if (MC_OPT(MC_OPT_RESERVE) != -1) return; /* forced by MEMCOLO_RESERVE */
  if (cls == 1) {
    if (!mc_reserve_on && !mc_reserve_suspended()) memcolo_set_reservation(1);
  } else {
    if (mc_reserve_on || mc_reserve_suspended()) memcolo_set_reservation(0);
  }
}

static void ag_handle_notify(int fd, uint64_t seq, memcolo_level_t level, uint64_t target) {
  uint64_t t0 = mc_now_ns();
  if (level != MEMCOLO_LEVEL_LOW) mc_gate_signal_received(t0);
  memcolo_pressure_fn fn = __atomic_load_n(&ag_user_fn, __ATOMIC_ACQUIRE);
  if (fn != NULL) fn(level, (size_t)target, __atomic_load_n(&ag_user_arg, __ATOMIC_RELAXED));
  size_t bytes = mc_agent_release(level, (size_t)target);
  uint64_t t1 = mc_now_ns();
  if (level != MEMCOLO_LEVEL_LOW) mc_gate_signal_handled(t1);
  __atomic_fetch_add(&ag_notifications, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&ag_released_bytes, bytes, __ATOMIC_RELAXED);
  ag_send_reclaimed(fd, seq, bytes, (t1 - t0 + 999999u) / 1000000u);
}

static const char *const ag_error_codes[] = {"bad_request", "unsupported_version", "permission_denied",
                                             "no_such_process", "not_registered", "internal", "limit_exceeded"};

static void ignored(mc_agent_reply_t *out, const char *why) {
  out->kind = MC_AG_IGNORED;
  out->why = why;
}

/* Only the fields this client acts on are decoded, but a reply is taken only when it
 * is valid as docs/protocol.md §4 defines it: anything else is ignored (§9.4). */
void mc_agent_parse_reply(const char *s, size_t n, mc_agent_reply_t *out) {
  memset(out, 0, sizeof(*out));
  if (n > 0 && s[n - 1] == '\r') n--;
  ag_kv_t kv[16];
  int cnt = json_object(s, n, kv, 16);
  if (cnt < 0) { ignored(out, "ignored a line that is not a JSON object:"); return; }
  uint64_t v;
  if (!kv_u64(kv_get(kv, cnt, "v"), &v)) { ignored(out, "ignored a message without a valid `v`:"); return; }
  if (v > 1) {
    out->newer_version = true;
    ignored(out, "ignored a message of a newer protocol version:");
    return;
  }
  const ag_kv_t *type = kv_get(kv, cnt, "type");
  if (kv_is(type, "notify")) {
    const ag_kv_t *lv = kv_get(kv, cnt, "level");
    if (kv_is(lv, "low")) out->level = MEMCOLO_LEVEL_LOW;
    else if (kv_is(lv, "high")) out->level = MEMCOLO_LEVEL_HIGH;
    else if (kv_is(lv, "top")) out->level = MEMCOLO_LEVEL_TOP;
    else { ignored(out, "ignored a notify with an unknown level:"); return; }
    if (!kv_u64(kv_get(kv, cnt, "seq"), &out->seq) || !kv_u64(kv_get(kv, cnt, "target_bytes"), &out->target_bytes)) {
      ignored(out, "ignored a notify without seq or target_bytes:");
      return;
    }
    out->kind = MC_AG_NOTIFY;
    return;
  }
  if (kv_is(type, "registered")) {
    const ag_kv_t *cls = kv_get(kv, cnt, "class");
    out->cls = kv_is(cls, "lc") ? 1 : kv_is(cls, "be") ? 2 : kv_is(cls, "elastic") ? 3 : 0;
    if (out->cls == 0 || !kv_pid(kv_get(kv, cnt, "pid"))) {
      ignored(out, "ignored a registered without a known class or a pid:");
      return;
    }
    out->kind = MC_AG_REGISTERED;
    return;
  }
  if (kv_is(type, "error")) {
    const ag_kv_t *code = kv_get(kv, cnt, "code"), *msg = kv_get(kv, cnt, "message");
    for (size_t i = 0; i < sizeof(ag_error_codes) / sizeof(ag_error_codes[0]); i++) {
      if (kv_is(code, ag_error_codes[i]) && msg != NULL && msg->t == 's') {
        out->kind = MC_AG_ERROR;
        out->code = code->v;
        out->code_len = code->vn;
        return;
      }
    }
    ignored(out, "ignored an error without a known code or a message:");
    return;
  }
  if (kv_is(type, "ok") || kv_is(type, "pong") || kv_is(type, "status") || kv_is(type, "cgroup")) {
    out->kind = MC_AG_OTHER;
    return;
  }
  out->unknown_type = true;
  ignored(out, "ignored a message of unknown type:");
}

/* returns false to end the session */
static bool ag_handle_line(int fd, const char *s, size_t n) {
  mc_agent_reply_t m;
  mc_agent_parse_reply(s, n, &m);
  switch (m.kind) {
  case MC_AG_IGNORED:
    ag_warn_once(m.newer_version ? W_VERSION : m.unknown_type ? W_TYPE : W_MALFORMED, m.why, s, n);
    return true;
  case MC_AG_NOTIFY:
    ag_handle_notify(fd, m.seq, m.level, m.target_bytes);
    return true;
  case MC_AG_REGISTERED:
    __atomic_store_n(&ag_registered, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&ag_registrations, 1, __ATOMIC_RELAXED);
    ag_apply_class(m.cls);
    mc_agent_stats_publish(true);
    return true;
  case MC_AG_ERROR:
    if (!__atomic_load_n(&ag_registered, __ATOMIC_ACQUIRE)) {
      ag_warn_once(W_REFUSED, "the agent refused the registration; retrying later:", m.code, m.code_len);
      return false;
    }
    ag_warn_once(W_ERROR, "the agent answered an error:", m.code, m.code_len);
    return true;
  case MC_AG_OTHER:
    return true;
  }
  return true;
}

/* One connection: register, then serve notifications until it closes or fails. */
static void ag_session(int fd) {
  ag_rlen = 0;
  ag_discarding = 0;
  __atomic_store_n(&ag_registered, 0, __ATOMIC_RELEASE);
  if (!ag_send_register(fd)) return;
  uint64_t last_tick = mc_now_ms();
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, AG_TICK_MS);
    uint64_t now = mc_now_ms();
    if (now - last_tick >= AG_TICK_MS) {
      last_tick = now;
      if (__atomic_load_n(&ag_registered, __ATOMIC_ACQUIRE)) mc_agent_stats_publish(false);
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return;
    if (r == 0) continue;
    ssize_t got = read(fd, ag_rbuf + ag_rlen, sizeof(ag_rbuf) - 1 - ag_rlen);
    if (got == 0) return;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return;
    }
    size_t scan_from = ag_rlen;
    ag_rlen += (size_t)got;
    size_t start = 0;
    for (size_t i = scan_from; i < ag_rlen; i++) {
      if (ag_rbuf[i] != '\n') continue;
      if (ag_discarding) {
        ag_discarding = 0;
        ag_warn_once(W_TOO_LONG, "ignored a line over 65536 bytes", NULL, 0);
      } else if (i - start > 0 && !ag_handle_line(fd, ag_rbuf + start, i - start)) {
        return;
      }
      start = i + 1;
    }
    if (start > 0) {
      memmove(ag_rbuf, ag_rbuf + start, ag_rlen - start);
      ag_rlen -= start;
    }
    if (ag_rlen >= sizeof(ag_rbuf) - 1) { /* no newline within the limit */
      ag_discarding = 1;
      ag_rlen = 0;
    }
  }
}

static void ag_sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000u, (long)(ms % 1000u) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) { }
}

static void *ag_main(void *arg) {
  (void)arg;
  unsigned backoff = AG_BACKOFF_MIN_MS;
  for (;;) {
    int fd = ag_connect();
    if (fd >= 0) {
      __atomic_store_n(&ag_fd, fd, __ATOMIC_RELEASE);
      ag_session(fd);
      bool was_registered = __atomic_load_n(&ag_registered, __ATOMIC_ACQUIRE);
      __atomic_store_n(&ag_registered, 0, __ATOMIC_RELEASE);
      __atomic_store_n(&ag_fd, -1, __ATOMIC_RELEASE);
      close(fd);
      /* a registration that lived: the agent restarted, come back soon */
      if (was_registered) backoff = AG_BACKOFF_MIN_MS;
      else backoff = AG_BACKOFF_MAX_MS; /* refused or closed at once: do not hammer it */
    }
    ag_sleep_ms(backoff);
    if (fd < 0) backoff = backoff * 2 > AG_BACKOFF_MAX_MS ? AG_BACKOFF_MAX_MS : backoff * 2;
  }
  return NULL;
}

/* Starts the link (once). The socket path is $MEMCOLO_SOCKET or the default. */
void mc_agent_start(void) {
  mc_ensure_init();
  if (__atomic_exchange_n(&ag_started, 1, __ATOMIC_ACQ_REL)) return;
  if (class_name(MC_OPT(MC_OPT_CLASS)) == NULL) { ag_started = 0; return; }
  const char *path = MC_OPT_STR(MC_OPT_SOCKET);
  if (strlen(path) >= sizeof(ag_sock_path)) {
    ag_warn_once(W_PATH, "MEMCOLO_SOCKET is longer than a Unix socket path may be; running standalone", NULL, 0);
    return;
  }
  memcpy(ag_sock_path, path, strlen(path) + 1);
  if (!mc_thread_start(ag_main, 128 << 10)) {
    ag_warn_once(W_THREAD, "could not start the agent thread; running standalone", NULL, 0);
    ag_started = 0;
  }
}

/* The child of a fork has no agent thread: it closes its copy of the parent's
 * connection (without shutting it down, which would cut the parent off) and stays
 * standalone. */
void mc_agent_after_fork_child(void) {
  int fd = ag_fd;
  if (fd >= 0) close(fd);
  ag_fd = -1;
  ag_started = 0;
  ag_registered = 0;
  mc_agent_stats_after_fork_child();
}

const char *mc_agent_socket_path(void) { return ag_sock_path[0] ? ag_sock_path : mc_option_desc(MC_OPT_SOCKET)->sdef; }

void mc_agent_stats(memcolo_stats_t *st) {
  st->agent_registered = (uint32_t)__atomic_load_n(&ag_registered, __ATOMIC_ACQUIRE);
  st->agent_registrations = __atomic_load_n(&ag_registrations, __ATOMIC_RELAXED);
  st->agent_notifications = __atomic_load_n(&ag_notifications, __ATOMIC_RELAXED);
  st->agent_released_bytes = __atomic_load_n(&ag_released_bytes, __ATOMIC_RELAXED);
}
