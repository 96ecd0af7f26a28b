/* The client against a fake agent: a real Unix socket server in the test. The
 * event-loop tests drive memcolo_client_process() step by step; one test runs the
 * background thread. No check depends on how long anything takes. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "memcolo/client.h"
#include "check.h"

#define WAIT_MS 20000

static char dir[64], sock_path[100];

static int agent_listen(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, sock_path, sizeof a.sun_path - 1);
  unlink(sock_path);
  REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0, "listen: %s", strerror(errno));
  return fd;
}

static int agent_accept(int lfd) {
  struct pollfd p = {lfd, POLLIN, 0};
  REQUIRE(poll(&p, 1, WAIT_MS) == 1, "no client connected");
  int fd = accept(lfd, NULL, NULL);
  REQUIRE(fd >= 0, "accept: %s", strerror(errno));
  return fd;
}

static void agent_close(int lfd, int fd) {
  if (fd >= 0) close(fd);
  close(lfd);
  unlink(sock_path);
}

/* Reads one line from the client and decodes it as a request. */
static memcolo_msg *agent_recv(int fd) {
  char line[4096];
  size_t n = 0;
  while (n < sizeof line - 1) {
    struct pollfd p = {fd, POLLIN, 0};
    REQUIRE(poll(&p, 1, WAIT_MS) == 1, "client sent nothing");
    ssize_t r = recv(fd, line + n, 1, 0);
    REQUIRE(r == 1, "client closed");
    if (line[n++] == '\n') break;
  }
  memcolo_msg *m;
  char err[200];
  REQUIRE(memcolo_decode(MEMCOLO_REQUEST, line, n, &m, err, sizeof err) == 0, "client sent %.*s: %s", (int)n, line, err);
  return m;
}

static void agent_send(int fd, const char *s) { REQUIRE(send(fd, s, strlen(s), MSG_NOSIGNAL) == (ssize_t)strlen(s), "send"); }

static void handshake(int fd, memcolo_client *c) {
  if (c) memcolo_client_process(c);
  memcolo_msg *m = agent_recv(fd);
  REQUIRE(!strcmp(memcolo_msg_type(m), "register"), "expected register, got %s", memcolo_msg_type(m));
  CHECK(!strcmp(memcolo_msg_str(m, "notify"), "socket"), "notify mode");
  uint64_t pid;
  CHECK(memcolo_msg_u64(m, "pid", &pid) != 0, "a client registers itself");
  memcolo_msg_free(m);
  agent_send(fd, "{\"v\":1,\"type\":\"registered\",\"pid\":1234,\"class\":\"elastic\"}\n");
  if (c) memcolo_client_process(c);
}

/* Sends a notify; in event-loop mode (c != NULL) processes it; reads reclaimed. */
static int agent_notify(int fd, memcolo_client *c, uint64_t seq, const char *level, uint64_t target, uint64_t *bytes) {
  char line[200];
  snprintf(line, sizeof line, "{\"v\":1,\"type\":\"notify\",\"seq\":%llu,\"level\":\"%s\",\"target_bytes\":%llu}\n",
           (unsigned long long)seq, level, (unsigned long long)target);
  agent_send(fd, line);
  if (c) {
    struct pollfd p = {memcolo_client_fd(c), POLLIN, 0};
    poll(&p, 1, WAIT_MS);
    memcolo_client_process(c);
  }
  memcolo_msg *m = agent_recv(fd);
  REQUIRE(!strcmp(memcolo_msg_type(m), "reclaimed"), "expected reclaimed, got %s", memcolo_msg_type(m));
  uint64_t got_seq = 0;
  memcolo_msg_u64(m, "seq", &got_seq);
  CHECK(got_seq == seq, "seq %llu, want %llu", (unsigned long long)got_seq, (unsigned long long)seq);
  memcolo_msg_u64(m, "bytes", bytes);
  char *json = memcolo_msg_json(m);
  int ok = strstr(json, "\"ok\":true") != NULL;
  free(json);
  memcolo_msg_free(m);
  agent_send(fd, "{\"v\":1,\"type\":\"ok\"}\n");
  return ok;
}

static memcolo_client *new_client(uint32_t timeout_ms, int *log_count) {
  memcolo_client_config cfg;
  memcolo_client_config_init(&cfg);
  cfg.socket_path = sock_path;
  cfg.name = "cache";
  cfg.has_expected_reclaim_bytes = 1;
  cfg.expected_reclaim_bytes = 1 << 20;
  cfg.backoff_min_ms = 10;
  cfg.backoff_max_ms = 50;
  if (timeout_ms) cfg.handler_timeout_ms = timeout_ms;
  extern void count_log(const char *, void *);
  if (log_count) {
    cfg.log = count_log;
    cfg.log_arg = log_count;
  }
  memcolo_client *c = memcolo_client_new(&cfg);
  REQUIRE(c, "client_new: %s", strerror(errno));
  return c;
}

void count_log(const char *msg, void *arg) {
  if (strstr(msg, "ignoring a message")) ++*(int *)arg;
}

static char order[64];
static int app_layer(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)arg;
  strcat(order, "app,");
  *bytes = n->target_bytes / 2;
  return 0;
}
static int runtime_layer(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)n;
  (void)arg;
  strcat(order, "runtime");
  *bytes = 100;
  return 0;
}
static int echo_layer(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)arg;
  *bytes = n->target_bytes;
  return 0;
}
static int failing_layer(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)n, (void)bytes, (void)arg;
  return -1;
}
static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}
static int slow_layer(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)n;
  volatile int *release = arg;
  while (!__atomic_load_n(release, __ATOMIC_SEQ_CST)) sleep_ms(5);
  *bytes = 5;
  return 0;
}

static int sleepy_layer(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)n, (void)arg;
  sleep_ms(200); /* past the 50 ms timeout of its test */
  *bytes = 7;
  return 0;
}

static void register_and_layered_handlers(void) {
  int lfd = agent_listen();
  memcolo_client *c = new_client(0, NULL);
  order[0] = 0;
  memcolo_client_on(c, MEMCOLO_HIGH, app_layer, NULL);
  memcolo_client_on(c, MEMCOLO_HIGH, runtime_layer, NULL);
  memcolo_client_on(c, MEMCOLO_LOW, echo_layer, NULL);
  memcolo_client_process(c);
  int fd = agent_accept(lfd);
  memcolo_msg *m = agent_recv(fd);
  char *json = memcolo_msg_json(m);
  CHECK(strstr(json, "\"class\":\"elastic\"") && strstr(json, "\"name\":\"cache\"") &&
            strstr(json, "\"expected_reclaim_bytes\":1048576"), "register %s", json);
  free(json);
  memcolo_msg_free(m);
  agent_send(fd, "{\"v\":1,\"type\":\"registered\",\"pid\":1234,\"class\":\"elastic\"}\n");
  memcolo_client_process(c);
  CHECK(memcolo_client_registered(c), "not registered");
  uint64_t bytes;
  CHECK(agent_notify(fd, c, 7, "high", 4096, &bytes) && bytes == 2148, "high: %llu", (unsigned long long)bytes);
  CHECK(!strcmp(order, "app,runtime"), "layers ran as %s", order);
  CHECK(agent_notify(fd, c, 8, "low", 10, &bytes) && bytes == 10, "low");
  CHECK(agent_notify(fd, c, 9, "top", 10, &bytes) && bytes == 0, "top without handlers");
  CHECK(memcolo_gate_epoch_ns(memcolo_client_gate(c)) >= 0, "gate not fed");
  CHECK(memcolo_client_notifications(c) == 3, "notifications");
  memcolo_client_free(c);
  agent_close(lfd, fd);
}

static void failing_and_overlong_inline_handlers(void) {
  int lfd = agent_listen();
  memcolo_client *c = new_client(50, NULL);
  memcolo_client_on(c, MEMCOLO_LOW, failing_layer, NULL);
  memcolo_client_on(c, MEMCOLO_HIGH, sleepy_layer, NULL);
  memcolo_client_process(c);
  int fd = agent_accept(lfd);
  handshake(fd, c);
  uint64_t bytes;
  CHECK(!agent_notify(fd, c, 1, "low", 1, &bytes), "failure not reported");
  CHECK(!agent_notify(fd, c, 2, "high", 1, &bytes) && bytes == 0, "overlong handler not reported");
  CHECK(memcolo_client_failed_notifications(c) == 2, "failed count");
  memcolo_client_free(c);
  agent_close(lfd, fd);
}

static void reconnects_when_the_agent_restarts(void) {
  static int hooks;
  int lfd = agent_listen();
  memcolo_client *c = new_client(0, NULL);
  extern void count_hook(void *);
  memcolo_client_on_reconnect(c, count_hook, &hooks);
  memcolo_client_on(c, MEMCOLO_LOW, echo_layer, NULL);
  memcolo_client_process(c);
  int fd = agent_accept(lfd);
  handshake(fd, c);
  CHECK(memcolo_client_registrations(c) == 1, "registrations");
  agent_close(lfd, fd); /* the agent vanishes */
  memcolo_client_process(c);
  CHECK(!memcolo_client_registered(c) && memcolo_client_fd(c) < 0, "still connected");
  for (int k = 0; k < 5; k++) { /* retries fail quietly */
    sleep_ms(20);
    memcolo_client_process(c);
  }
  lfd = agent_listen(); /* ... and comes back */
  for (int k = 0; k < 400 && memcolo_client_fd(c) < 0; k++) {
    int t = memcolo_client_next_timeout_ms(c);
    sleep_ms(t > 0 ? t : 1);
    memcolo_client_process(c);
  }
  fd = agent_accept(lfd);
  handshake(fd, c);
  CHECK(memcolo_client_registrations(c) == 2 && hooks == 1, "registrations %llu hooks %d",
        (unsigned long long)memcolo_client_registrations(c), hooks);
  uint64_t bytes;
  CHECK(agent_notify(fd, c, 11, "low", 1, &bytes) && bytes == 1, "after reconnect");
  memcolo_client_free(c);
  agent_close(lfd, fd);
}

void count_hook(void *arg) { ++*(int *)arg; }

static void bad_lines_are_logged_once_and_ignored(void) {
  int lfd = agent_listen();
  int logged = 0;
  memcolo_client *c = new_client(0, &logged);
  memcolo_client_on(c, MEMCOLO_LOW, echo_layer, NULL);
  memcolo_client_process(c);
  int fd = agent_accept(lfd);
  handshake(fd, c);
  agent_send(fd, "garbage\nmore garbage\n{\"v\":1,\"type\":\"hologram\"}\n");
  agent_send(fd, "{\"v\":2,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":1}\n");
  agent_send(fd, "{\"v\":1,\"type\":\"notify\",\"seq\":1,\"le\n");
  char *big = malloc(200001);
  memset(big, 'x', 200000);
  big[200000] = 0;
  for (size_t off = 0; off < 200000;) { /* the client drains as the agent writes */
    ssize_t n = send(fd, big + off, 200000 - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) off += (size_t)n;
    memcolo_client_process(c);
  }
  free(big);
  agent_send(fd, "\n{\"v\":1,\"type\":\"error\",\"code\":\"internal\",\"message\":\"x\"}\n");
  uint64_t bytes;
  CHECK(agent_notify(fd, c, 2, "low", 42, &bytes) && bytes == 42, "notify after bad lines");
  CHECK(memcolo_client_registrations(c) == 1 && memcolo_client_notifications(c) == 1, "state");
  CHECK(logged == 2, "logged %d times", logged);
  memcolo_client_free(c);
  agent_close(lfd, fd);
}

static void no_agent_is_not_an_error(void) {
  unlink(sock_path);
  memcolo_client *c = new_client(0, NULL);
  for (int k = 0; k < 5; k++) {
    CHECK(memcolo_client_process(c) == 0, "process failed");
    sleep_ms(10);
  }
  CHECK(!memcolo_client_registered(c) && memcolo_client_fd(c) < 0, "connected to nothing");
  CHECK(memcolo_client_start_thread(c) == 0, "thread");
  sleep_ms(50);
  memcolo_client_free(c);
}

static void background_thread_reports_overlong_handlers(void) {
  int lfd = agent_listen();
  static int release;
  memcolo_client *c = new_client(300, NULL);
  memcolo_client_on(c, MEMCOLO_TOP, slow_layer, &release);
  memcolo_client_on(c, MEMCOLO_LOW, failing_layer, NULL);
  REQUIRE(memcolo_client_start_thread(c) == 0, "thread");
  int fd = agent_accept(lfd);
  handshake(fd, NULL);
  uint64_t bytes;
  CHECK(!agent_notify(fd, NULL, 1, "low", 1, &bytes), "failure not reported");
  CHECK(!agent_notify(fd, NULL, 2, "top", 1, &bytes), "overlong handler not reported");
  CHECK(!agent_notify(fd, NULL, 3, "top", 1, &bytes), "busy handler thread not reported");
  __atomic_store_n(&release, 1, __ATOMIC_SEQ_CST);
  int ok = 0;
  for (uint64_t seq = 4; seq < 100 && !ok; seq++) { /* until the slow handler has returned */
    ok = agent_notify(fd, NULL, seq, "top", 1, &bytes);
    if (!ok) sleep_ms(20);
  }
  CHECK(ok && bytes == 5, "handler thread never came back");
  CHECK(memcolo_client_failed_notifications(c) >= 3, "failed count");
  memcolo_client_free(c);
  agent_close(lfd, fd);
}

static void bad_config(void) {
  memcolo_client_config cfg;
  memcolo_client_config_init(&cfg);
  cfg.class_name = "vip";
  errno = 0;
  CHECK(!memcolo_client_new(&cfg) && errno == EINVAL, "accepted class vip");
}

__attribute__((unused)) static void malloc_trim_layer_reports_freed_heap(void) {
  enum { N = 20000 };
  static void *blocks[N];
  for (int k = 0; k < N; k++) {
    blocks[k] = malloc(4000);
    memset(blocks[k], 1, 4000);
  }
  void *keep = malloc(100000); /* from the heap top, above the blocks: free() alone cannot trim them */
  memset(keep, 1, 100000);
  for (int k = 0; k < N; k++) free(blocks[k]);
  uint64_t freed = 0;
  memcolo_notification n = {1, MEMCOLO_HIGH, 0};
  CHECK(memcolo_malloc_trim_layer(&n, &freed, NULL) == 0 && freed > (16u << 20), "freed %llu", (unsigned long long)freed);
  free(keep);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/memcolo-c-test-XXXXXX");
  REQUIRE(mkdtemp(dir), "mkdtemp");
  snprintf(sock_path, sizeof sock_path, "%s/agent.sock", dir);
  RUN(register_and_layered_handlers);
  RUN(failing_and_overlong_inline_handlers);
  RUN(reconnects_when_the_agent_restarts);
  RUN(bad_lines_are_logged_once_and_ignored);
  RUN(no_agent_is_not_an_error);
  RUN(background_thread_reports_overlong_handlers);
  RUN(bad_config);
#ifndef __SANITIZE_ADDRESS__ /* ASan's allocator replaces glibc's: nothing to trim */
  RUN(malloc_trim_layer_reports_freed_heap);
#endif
  unlink(sock_path);
  rmdir(dir);
  return CHECK_DONE();
}
