/* client.c: the connection to `memcolo agent`: connect with exponential backoff,
 * register, read lines, run handlers in layers on notifications (inline in
 * event-loop mode, on a handler thread with a timeout in background-thread mode),
 * answer `reclaimed`, log each kind of bad input once. Also the malloc_trim layer. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define MAX_LAYERS 16
#define MAX_HOOKS 8

enum { WARN_CONNECT = 1, WARN_MALFORMED = 2, WARN_NEWER = 4, WARN_TOO_LONG = 8, WARN_BUSY = 16 };

typedef struct {
  memcolo_handler fn;
  void *arg;
} layer;

struct memcolo_client {
  char *socket_path, *class_name, *name;
  int has_expected;
  uint64_t expected_bytes;
  uint32_t timeout_ms, backoff_min_ms, backoff_max_ms;
  memcolo_log_fn log;
  void *log_arg;
  layer layers[3][MAX_LAYERS];
  int nlayers[3];
  struct {
    void (*fn)(void *);
    void *arg;
  } hooks[MAX_HOOKS];
  int nhooks;
  memcolo_gate *gate;

  int fd;
  char *in;
  size_t inlen;
  int discarding, had_session, reconnect_pending;
  uint32_t backoff_ms;
  uint64_t next_attempt_ns;
  unsigned warned;
  int registered;
  uint64_t registrations, notifications, failed;

  /* background-thread mode */
  int threaded, stop;
  pthread_t io;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int worker_started, worker_stop, busy, job_pending;
  memcolo_notification job;
  uint64_t job_id, done_id, job_bytes, job_ns;
  int job_ok;
  pthread_t worker;
};

static void logf_(memcolo_client *c, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->log)
    c->log(msg, c->log_arg);
  else
    fprintf(stderr, "memcolo: %s\n", msg);
}

static void warn_once(memcolo_client *c, unsigned kind, const char *fmt, const char *arg) {
  if (__atomic_fetch_or(&c->warned, kind, __ATOMIC_SEQ_CST) & kind) return;
  char msg[400];
  snprintf(msg, sizeof msg, fmt, arg);
  logf_(c, "%s (logged once)", msg);
}

void memcolo_client_config_init(memcolo_client_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->class_name = "elastic";
  cfg->handler_timeout_ms = 10000;
  cfg->backoff_min_ms = 100;
  cfg->backoff_max_ms = 5000;
  cfg->num_epochs = MEMCOLO_DEFAULT_NUM_EPOCHS;
}

memcolo_client *memcolo_client_new(const memcolo_client_config *cfg) {
  const char *cls = cfg->class_name ? cfg->class_name : "elastic";
  if (strcmp(cls, "elastic") && strcmp(cls, "be") && strcmp(cls, "lc")) {
    errno = EINVAL;
    return NULL;
  }
  memcolo_client *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  const char *path = cfg->socket_path ? cfg->socket_path : getenv(MEMCOLO_SOCKET_ENV);
  if (!path || !*path) path = MEMCOLO_DEFAULT_SOCKET;
  c->socket_path = strdup(path);
  c->class_name = strdup(cls);
  c->name = cfg->name ? strdup(cfg->name) : NULL;
  c->in = malloc(MEMCOLO_MAX_LINE_BYTES + 2);
  c->gate = memcolo_gate_new(cfg->num_epochs ? cfg->num_epochs : MEMCOLO_DEFAULT_NUM_EPOCHS);
  if (!c->socket_path || !c->class_name || (cfg->name && !c->name) || !c->in || !c->gate) {
    memcolo_client_free(c);
    errno = ENOMEM;
    return NULL;
  }
  if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    memcolo_client_free(c);
    errno = ENAMETOOLONG;
    return NULL;
  }
  c->has_expected = cfg->has_expected_reclaim_bytes;
  c->expected_bytes = cfg->expected_reclaim_bytes;
  c->timeout_ms = cfg->handler_timeout_ms ? cfg->handler_timeout_ms : 10000;
  c->backoff_min_ms = cfg->backoff_min_ms ? cfg->backoff_min_ms : 100;
  c->backoff_max_ms = cfg->backoff_max_ms >= c->backoff_min_ms ? cfg->backoff_max_ms : c->backoff_min_ms;
  c->backoff_ms = c->backoff_min_ms;
  c->log = cfg->log;
  c->log_arg = cfg->log_arg;
  c->fd = -1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  return c;
}

int memcolo_client_on(memcolo_client *c, memcolo_level level, memcolo_handler h, void *arg) {
  if ((unsigned)level > MEMCOLO_TOP || !h || c->nlayers[level] == MAX_LAYERS) {
    errno = EINVAL;
    return -1;
  }
  c->layers[level][c->nlayers[level]++] = (layer){h, arg};
  return 0;
}

void memcolo_client_on_reconnect(memcolo_client *c, void (*hook)(void *), void *arg) {
  if (c->nhooks < MAX_HOOKS) {
    c->hooks[c->nhooks].fn = hook;
    c->hooks[c->nhooks++].arg = arg;
  }
}

int memcolo_client_fd(const memcolo_client *c) { return c->fd; }
int memcolo_client_registered(const memcolo_client *c) { return __atomic_load_n(&c->registered, __ATOMIC_SEQ_CST); }
uint64_t memcolo_client_registrations(const memcolo_client *c) { return __atomic_load_n(&c->registrations, __ATOMIC_SEQ_CST); }
uint64_t memcolo_client_notifications(const memcolo_client *c) { return __atomic_load_n(&c->notifications, __ATOMIC_SEQ_CST); }
uint64_t memcolo_client_failed_notifications(const memcolo_client *c) { return __atomic_load_n(&c->failed, __ATOMIC_SEQ_CST); }
memcolo_gate *memcolo_client_gate(memcolo_client *c) { return c->gate; }

int memcolo_client_next_timeout_ms(const memcolo_client *c) {
  if (c->fd >= 0) return -1;
  uint64_t now = memcolo_now_ns();
  return now >= c->next_attempt_ns ? 0 : (int)((c->next_attempt_ns - now + 999999) / 1000000);
}

static void disconnect(memcolo_client *c, const char *why) {
  if (c->fd < 0) return;
  close(c->fd);
  c->fd = -1;
  c->inlen = 0;
  c->discarding = 0;
  __atomic_store_n(&c->registered, 0, __ATOMIC_SEQ_CST);
  c->backoff_ms = c->backoff_min_ms;
  c->next_attempt_ns = memcolo_now_ns() + (uint64_t)c->backoff_ms * 1000000u;
  if (!c->stop) logf_(c, "connection to memcolo agent lost: %s; reconnecting", why);
}

static int send_line(memcolo_client *c, const char *line) {
  size_t len = strlen(line), off = 0;
  while (off < len) {
    ssize_t n = send(c->fd, line + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {c->fd, POLLOUT, 0};
      if (poll(&p, 1, 1000) > 0) continue;
    }
    disconnect(c, n < 0 ? strerror(errno) : "short write");
    return -1;
  }
  return 0;
}

static void try_connect(memcolo_client *c) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, c->socket_path, sizeof addr.sun_path - 1);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    char msg[300];
    snprintf(msg, sizeof msg, "%s: %s", c->socket_path, strerror(e));
    warn_once(c, WARN_CONNECT, "memcolo agent not reachable at %s; retrying in the background", msg);
    c->next_attempt_ns = memcolo_now_ns() + (uint64_t)c->backoff_ms * 1000000u;
    c->backoff_ms = c->backoff_ms * 2 > c->backoff_max_ms ? c->backoff_max_ms : c->backoff_ms * 2;
    return;
  }
  c->fd = fd;
  c->backoff_ms = c->backoff_min_ms;
  c->reconnect_pending = c->had_session;
  c->had_session = 1;
  mj *reg = mj_new_object();
  mj v = {0};
  int bad = !reg;
  v.type = MJ_STR;
#define PUT_STR(k, s) (v.type = MJ_STR, v.text = (char *)(s), v.len = strlen(s), mj_obj_put(reg, k, &v))
  bad = bad || PUT_STR("type", "register") || PUT_STR("class", c->class_name) ||
        (c->name && PUT_STR("name", c->name)) || PUT_STR("notify", "socket");
  char num[24];
  if (!bad && c->has_expected) {
    snprintf(num, sizeof num, "%llu", (unsigned long long)c->expected_bytes);
    v.type = MJ_NUM;
    v.text = num;
    v.len = strlen(num);
    bad = mj_obj_put(reg, "expected_reclaim_bytes", &v);
  }
#undef PUT_STR
  char *line = bad ? NULL : memcolo__encode(MEMCOLO_REQUEST, reg);
  mj_free(reg);
  if (!line) {
    disconnect(c, "out of memory");
    return;
  }
  send_line(c, line);
  free(line);
}

static int run_layers(memcolo_client *c, const memcolo_notification *n, uint64_t *total) {
  *total = 0;
  for (int k = 0; k < c->nlayers[n->level]; k++) {
    uint64_t got = 0;
    layer *l = &c->layers[n->level][k];
    if (l->fn(n, &got, l->arg) != 0) {
      logf_(c, "handler %d for %s failed", k, memcolo_level_name(n->level));
      *total = 0;
      return 0;
    }
    *total += got;
  }
  return 1;
}

static void *worker_main(void *arg) {
  memcolo_client *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->job_pending && !c->worker_stop) pthread_cond_wait(&c->cv, &c->mu);
    if (c->job_pending) {
      memcolo_notification n = c->job;
      uint64_t id = c->job_id;
      c->job_pending = 0;
      pthread_mutex_unlock(&c->mu);
      uint64_t start = memcolo_now_ns(), bytes;
      int ok = run_layers(c, &n, &bytes);
      uint64_t took = memcolo_now_ns() - start;
      pthread_mutex_lock(&c->mu);
      c->job_ok = ok;
      c->job_bytes = bytes;
      c->job_ns = took;
      c->done_id = id;
      c->busy = 0;
      pthread_cond_broadcast(&c->cv);
      continue;
    }
    break;
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* Runs the layers of one notification; returns ok and fills bytes and duration. */
static int dispatch(memcolo_client *c, const memcolo_notification *n, uint64_t *bytes, uint64_t *dur_ns) {
  uint64_t received = memcolo_now_ns();
  int gated = n->level != MEMCOLO_LOW, ok;
  if (gated) memcolo_gate_signal_received(c->gate, received);
  *bytes = 0;
  if (!c->threaded) {
    ok = run_layers(c, n, bytes);
    *dur_ns = memcolo_now_ns() - received;
    if (ok && *dur_ns > (uint64_t)c->timeout_ms * 1000000u) {
      logf_(c, "handler for %s ran past %u ms; reported as failed", memcolo_level_name(n->level), c->timeout_ms);
      ok = 0;
      *bytes = 0;
    }
  } else {
    pthread_mutex_lock(&c->mu);
    if (c->busy) {
      pthread_mutex_unlock(&c->mu);
      warn_once(c, WARN_BUSY, "a notification arrived while an overlong handler still runs; %s", "reported as failed");
      *dur_ns = 0;
      return 0;
    }
    uint64_t id = ++c->job_id;
    c->job = *n;
    c->job_pending = 1;
    c->busy = 1;
    pthread_cond_broadcast(&c->cv);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += c->timeout_ms / 1000;
    deadline.tv_nsec += (long)(c->timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
      deadline.tv_sec++;
      deadline.tv_nsec -= 1000000000L;
    }
    int rc = 0, timed_out;
    while (c->done_id != id && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&c->cv, &c->mu, &deadline);
    timed_out = c->done_id != id;
    if (!timed_out) {
      ok = c->job_ok;
      *bytes = c->job_bytes;
      *dur_ns = c->job_ns;
    } else {
      ok = 0;
      *dur_ns = memcolo_now_ns() - received;
    }
    pthread_mutex_unlock(&c->mu);
    if (timed_out)
      logf_(c, "handler for %s ran past %u ms; reported as failed", memcolo_level_name(n->level), c->timeout_ms);
  }
  if (gated) memcolo_gate_signal_handled(c->gate, memcolo_now_ns());
  return ok;
}

static void handle_line(memcolo_client *c, const char *line, size_t len) {
  memcolo_msg *m;
  char err[200];
  int rc = memcolo_decode(MEMCOLO_REPLY, line, len, &m, err, sizeof err);
  if (rc) {
    warn_once(c, rc == MEMCOLO_E_UNSUPPORTED_VERSION ? WARN_NEWER : WARN_MALFORMED,
              "ignoring a message from the agent: %s", err);
    return;
  }
  const char *t = memcolo_msg_type(m);
  if (!strcmp(t, "registered")) {
    __atomic_store_n(&c->registered, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&c->registrations, 1, __ATOMIC_SEQ_CST);
    if (c->reconnect_pending) {
      c->reconnect_pending = 0;
      for (int k = 0; k < c->nhooks; k++) c->hooks[k].fn(c->hooks[k].arg);
    }
  } else if (!strcmp(t, "notify")) {
    memcolo_notification n = {0};
    const char *level = memcolo_msg_str(m, "level");
    memcolo_msg_u64(m, "seq", &n.seq);
    memcolo_msg_u64(m, "target_bytes", &n.target_bytes);
    n.level = !strcmp(level, "low") ? MEMCOLO_LOW : !strcmp(level, "high") ? MEMCOLO_HIGH : MEMCOLO_TOP;
    uint64_t bytes, dur_ns;
    int ok = dispatch(c, &n, &bytes, &dur_ns);
    __atomic_add_fetch(&c->notifications, 1, __ATOMIC_SEQ_CST);
    if (!ok) __atomic_add_fetch(&c->failed, 1, __ATOMIC_SEQ_CST);
    char out[200];
    snprintf(out, sizeof out, "{\"v\":1,\"type\":\"reclaimed\",\"seq\":%llu,\"bytes\":%llu,\"duration_ms\":%llu,\"ok\":%s}\n",
             (unsigned long long)n.seq, (unsigned long long)bytes, (unsigned long long)(dur_ns / 1000000u),
             ok ? "true" : "false");
    if (c->fd >= 0) send_line(c, out);
  } else if (!strcmp(t, "error")) {
    logf_(c, "agent answered with an error (%s): %s", memcolo_msg_str(m, "code"), memcolo_msg_str(m, "message"));
  }
  memcolo_msg_free(m);
}

int memcolo_client_process(memcolo_client *c) {
  if (c->fd < 0) {
    if (memcolo_now_ns() < c->next_attempt_ns) return 0;
    try_connect(c);
    if (c->fd < 0) return 0;
  }
  for (;;) {
    size_t room = MEMCOLO_MAX_LINE_BYTES + 2 - c->inlen;
    ssize_t n = recv(c->fd, c->in + c->inlen, room, MSG_DONTWAIT);
    if (n == 0) {
      disconnect(c, "agent closed the connection");
      return 0;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) disconnect(c, strerror(errno));
      return 0;
    }
    c->inlen += (size_t)n;
    size_t start = 0;
    for (size_t k = 0; k < c->inlen && c->fd >= 0; k++) {
      if (c->in[k] != '\n') continue;
      if (c->discarding)
        c->discarding = 0;
      else
        handle_line(c, c->in + start, k - start);
      start = k + 1;
    }
    if (c->fd < 0) return 0;
    memmove(c->in, c->in + start, c->inlen - start);
    c->inlen -= start;
    if (c->inlen == MEMCOLO_MAX_LINE_BYTES + 2) {
      warn_once(c, WARN_TOO_LONG, "agent sent a line over %s bytes; discarded", "65536");
      c->inlen = 0;
      c->discarding = 1;
    }
  }
}

static void *io_main(void *arg) {
  memcolo_client *c = arg;
  while (!__atomic_load_n(&c->stop, __ATOMIC_SEQ_CST)) {
    int timeout = memcolo_client_next_timeout_ms(c);
    if (timeout < 0 || timeout > 100) timeout = 100;
    struct pollfd p = {c->fd, POLLIN, 0};
    poll(&p, c->fd >= 0 ? 1 : 0, timeout);
    memcolo_client_process(c);
  }
  return NULL;
}

int memcolo_client_start_thread(memcolo_client *c) {
  if (c->threaded) return EALREADY;
  int rc = pthread_create(&c->worker, NULL, worker_main, c);
  if (rc) return rc;
  c->worker_started = 1;
  c->threaded = 1;
  rc = pthread_create(&c->io, NULL, io_main, c);
  if (rc) c->threaded = 0;
  return rc;
}

void memcolo_client_free(memcolo_client *c) {
  if (!c) return;
  __atomic_store_n(&c->stop, 1, __ATOMIC_SEQ_CST);
  if (c->threaded) pthread_join(c->io, NULL);
  if (c->worker_started) {
    pthread_mutex_lock(&c->mu);
    c->worker_stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->worker, NULL); /* waits for a handler still running */
  }
  if (c->fd >= 0) close(c->fd);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  memcolo_gate_free(c->gate);
  free(c->in);
  free(c->socket_path);
  free(c->class_name);
  free(c->name);
  free(c);
}

uint64_t memcolo_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "re");
  unsigned long long size, rss;
  if (!f) return 0;
  int n = fscanf(f, "%llu %llu", &size, &rss);
  fclose(f);
  return n == 2 ? (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

int memcolo_malloc_trim_layer(const memcolo_notification *n, uint64_t *reclaimed_bytes, void *arg) {
  (void)n;
  (void)arg;
  uint64_t before = memcolo_rss_bytes();
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  uint64_t after = memcolo_rss_bytes();
  *reclaimed_bytes = before > after ? before - after : 0;
  return 0;
}
