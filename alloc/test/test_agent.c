/* test_agent.c — the agent link (agent.c) against a fake agent: a Unix socket served by
 * this test's main thread while the library's agent thread talks to it.
 *   - registration line (class, comm, notify: socket) and the `registered` reply;
 *   - notify low/high/top answered with `reclaimed` carrying the seq, bytes released;
 *     top suspends the reservation for MEMCOLO_TOP_HOLD_S and it comes back;
 *   - the application's pressure handler runs first, with the allow rate at 0;
 *   - garbage, newer versions, unknown types and over-long lines are ignored and the
 *     connection keeps working;
 *   - an agent that stops reading never blocks allocations; after the agent closes,
 *     the library reconnects and registers again; a `registered` reply with class be
 *     turns the reservation off;
 *   - a forked child stays standalone and does not disturb the parent's connection;
 *   - with no agent at all the library prints nothing;
 *   - the allow-rate gate's formula on a synthetic clock (M3 §4.2).
 * The test re-executes itself with the environment set (options are read at start);
 * every wait is a bounded poll, nothing depends on the machine's speed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ fake agent helpers */
static char lbuf[1 << 17];
static size_t llen;

/* next line from fd within timeout_ms; returns its length or -1 */
static long read_line(int fd, char *out, size_t cap, int timeout_ms) {
  for (int waited = 0;;) {
    char *nl = memchr(lbuf, '\n', llen);
    if (nl) {
      size_t n = (size_t)(nl - lbuf);
      size_t c = n < cap - 1 ? n : cap - 1;
      memcpy(out, lbuf, c);
      out[c] = 0;
      memmove(lbuf, nl + 1, llen - n - 1);
      llen -= n + 1;
      return (long)c;
    }
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) == 1) {
      ssize_t r = read(fd, lbuf + llen, sizeof(lbuf) - llen);
      if (r <= 0) return -1;
      llen += (size_t)r;
    } else if ((waited += 100) >= timeout_ms) {
      return -1;
    }
  }
}

static void send_str(int fd, const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static int accept_within(int lfd, int timeout_ms) {
  struct pollfd p = {lfd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return -1;
  return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

static memcolo_stats_t stats(void) {
  memcolo_stats_t st;
  memcolo_stats(&st);
  return st;
}

#define WAIT_FOR(cond, ms) do { for (int w_ = 0; !(cond) && w_ < (ms); w_ += 10) sleep_ms(10); } while (0)

/* frees 64 MiB of 16 KiB objects: empty huge pages for the caches */
static void make_free_memory(void) {
  enum { N = 4096 };
  static void *v[N];
  for (int i = 0; i < N; i++) { v[i] = MC_API(malloc)(16 << 10); memset(v[i], 1, 16 << 10); }
  for (int i = 0; i < N; i++) MC_API(free)(v[i]);
}

static uint64_t field_u64(const char *line, const char *key) {
  const char *p = strstr(line, key);
  if (!p) return UINT64_MAX;
  return strtoull(p + strlen(key), NULL, 10);
}

/* ------------------------------------------------------------ pressure handler */
static volatile int h_calls, h_level = -1;
static volatile size_t h_target;
static volatile double h_rate = -1;
static size_t handler(memcolo_level_t level, size_t target, void *arg) {
  (void)arg;
  h_calls++;
  h_level = (int)level;
  h_target = target;
  h_rate = memcolo_allow_rate();
  return 0;
}

/* ------------------------------------------------------------ background allocator */
static volatile int bg_stop;
static volatile long bg_rounds;
static void *bg_alloc(void *a) {
  (void)a;
  while (!bg_stop) {
    void *p = MC_API(malloc)(300 << 10), *q = MC_API(malloc)(64);
    memset(p, 2, 300 << 10);
    MC_API(free)(p);
    MC_API(free)(q);
    bg_rounds++;
  }
  return NULL;
}

static void test_gate_formula(void) {
  mc_t_current = "gate_formula";
  long saved_min = MC_OPT(MC_OPT_GATE_MIN_EPOCH_MS);
  mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = 0; /* the paper's formula alone */
  mc_gate_reset();
  CHECK(mc_gate_rate_at(5) == 1.0);
  CHECK(mc_gate_admit_at(5) == 1);
  mc_gate_signal_received(1000);
  CHECK(mc_gate_rate_at(1500) == 0.0);     /* received, not yet handled */
  CHECK(mc_gate_admit_at(1500) == 0);
  mc_gate_signal_handled(2000);            /* epoch 1000 ns, NUM_epochs 5: window 5000 */
  CHECK(mc_gate_rate_at(1000) == 0.0);
  CHECK(mc_gate_rate_at(3500) == 0.5);
  CHECK(mc_gate_rate_at(6000) == 1.0);
  CHECK(mc_gate_rate_at(99999) == 1.0);
  /* rate 0.5: every floor(1/0.5) = 2nd alloc proceeds (rate 1 resets the count) */
  CHECK(mc_gate_admit_at(6000) == 1);
  int a = mc_gate_admit_at(3500), b = mc_gate_admit_at(3500), c = mc_gate_admit_at(3500), d = mc_gate_admit_at(3500);
  CHECK(a == 0 && b == 1 && c == 0 && d == 1);
  /* rate 0.25 (elapsed 1250): every 4th */
  int adm = 0;
  for (int i = 0; i < 8; i++) adm += mc_gate_admit_at(2250);
  CHECK(adm == 2);
  /* a new signal resets to 0 and keeps the old epoch until handled again */
  mc_gate_signal_received(10000);
  CHECK(mc_gate_rate_at(10000) == 0.0);
  CHECK(mc_gate_rate_at(12500) == 0.5);
  mc_gate_signal_handled(14000);           /* epoch 4000: window 20000 */
  CHECK(mc_gate_rate_at(20000) == 0.5);
  mc_gate_reset();
  mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = saved_min;
}

/* the epoch is held to at least MEMCOLO_GATE_MIN_EPOCH_MS (default 1 s, protocol §9):
 * a release handled in milliseconds does not reopen the gate before the agent's next
 * poll; a slower one keeps its own handling time */
static void test_gate_min_epoch(void) {
  mc_t_current = "gate_min_epoch";
  CHECK(MC_OPT(MC_OPT_GATE_MIN_EPOCH_MS) == 1000);
  const uint64_t ms = 1000000, t0 = 1000 * ms;
  mc_gate_reset();
  mc_gate_signal_received(t0);
  mc_gate_signal_handled(t0 + 3 * ms);     /* handled in 3 ms: epoch 1 s, window 5 s */
  CHECK(mc_gate_rate_at(t0 + 3 * ms) < 0.001);
  CHECK(mc_gate_rate_at(t0 + 15 * ms) < 0.01); /* the paper's formula alone: 1.0 here */
  CHECK(mc_gate_admit_at(t0 + 15 * ms) == 0);
  CHECK(mc_gate_rate_at(t0 + 1000 * ms) == 0.2);
  CHECK(mc_gate_rate_at(t0 + 2500 * ms) == 0.5);
  CHECK(mc_gate_rate_at(t0 + 5000 * ms) == 1.0);
  mc_gate_signal_received(t0 + 10000 * ms);
  mc_gate_signal_handled(t0 + 13000 * ms); /* handled in 3 s: epoch 3 s, window 15 s */
  CHECK(mc_gate_rate_at(t0 + 17500 * ms) == 0.5);
  CHECK(mc_gate_rate_at(t0 + 25000 * ms) == 1.0);
  /* a process's own minimum (MEMCOLO_GATE_MIN_EPOCH_MS=250) */
  mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = 250;
  mc_gate_signal_received(t0 + 30000 * ms);
  mc_gate_signal_handled(t0 + 30001 * ms); /* epoch 250 ms, window 1.25 s */
  CHECK(mc_gate_rate_at(t0 + 30625 * ms) == 0.5);
  mc_options_cache[MC_OPT_GATE_MIN_EPOCH_MS] = 1000;
  mc_gate_reset();
}

/* the library in a process with no agent: silent, works */
static int standalone_child(void) {
  for (int i = 0; i < 200; i++) {
    void *p = MC_API(malloc)((size_t)(i % 7 + 1) << 16);
    memset(p, 3, 4096);
    MC_API(free)(p);
    sleep_ms(2);
  }
  memcolo_stats_t st = stats();
  return st.agent_registered == 0 ? 0 : 1;
}

static void test_standalone(const char *self, const char *dir) {
  mc_t_current = "standalone_silent";
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    char sock[PATH_MAX];
    snprintf(sock, sizeof(sock), "%s/nobody-listens.sock", dir);
    dup2(fds[1], 2);
    setenv("MEMCOLO_SOCKET", sock, 1);
    setenv("MEMCOLO_CLASS", "lc", 1);
    execl(self, "test_agent", "--standalone", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char buf[512];
  ssize_t n = 0, r;
  while ((r = read(fds[0], buf + n, sizeof(buf) - 1 - (size_t)n)) > 0) n += r;
  close(fds[0]);
  int ws = 0;
  waitpid(pid, &ws, 0);
  buf[n > 0 ? n : 0] = 0;
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  CHECK(n == 0);
  if (n) fprintf(stderr, "unexpected output: %s\n", buf);
}

static int agent_side(int lfd) {
  char line[1 << 17], msg[512];
  int pid = getpid();
  MC_API(free)(MC_API(malloc)(1));

  /* ---- registration */
  mc_t_current = "register";
  int c1 = accept_within(lfd, 10000);
  CHECK(c1 >= 0);
  if (c1 < 0) TEST_END();
  long n = read_line(c1, line, sizeof(line), 10000);
  CHECK(n > 0);
  CHECK(strcmp(line, "{\"v\":1,\"type\":\"register\",\"class\":\"lc\",\"name\":\"test_agent\",\"notify\":\"socket\"}") == 0);
  if (n > 0 && strcmp(line, "{\"v\":1,\"type\":\"register\",\"class\":\"lc\",\"name\":\"test_agent\",\"notify\":\"socket\"}") != 0)
    fprintf(stderr, "register line: %s\n", line);
  snprintf(msg, sizeof(msg), "{\"v\":1,\"type\":\"registered\",\"pid\":%d,\"class\":\"lc\"}\n", pid);
  send_str(c1, msg);
  WAIT_FOR(stats().agent_registered == 1, 10000);
  CHECK(stats().agent_registered == 1);
  CHECK(stats().reservation_on == 1);

  /* ---- low: the caches go back */
  mc_t_current = "notify_low";
  make_free_memory();
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":5,\"level\":\"low\",\"target_bytes\":1048576}\n");
  n = read_line(c1, line, sizeof(line), 10000);
  CHECK(n > 0 && strncmp(line, "{\"v\":1,\"type\":\"reclaimed\",\"seq\":5,\"bytes\":", 42) == 0);
  CHECK(strstr(line, ",\"duration_ms\":") != NULL && strstr(line, ",\"ok\":true}") != NULL);
  /* (how much depends on what the management thread already trimmed or protects) */
  uint64_t low_bytes = field_u64(line, "\"bytes\":");
  CHECK(low_bytes != UINT64_MAX);
  CHECK(stats().agent_notifications == 1);

  /* ---- high: the application's layer runs first, with the allow rate at 0 */
  mc_t_current = "notify_high";
  memcolo_on_pressure(handler, NULL);
  make_free_memory();
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":6,\"level\":\"high\",\"target_bytes\":2097152}\n");
  n = read_line(c1, line, sizeof(line), 10000);
  CHECK(n > 0 && field_u64(line, "\"seq\":") == 6);
  CHECK(h_calls == 1 && h_level == MEMCOLO_LEVEL_HIGH && h_target == 2097152);
  CHECK(h_rate == 0.0);
  double r = memcolo_allow_rate();
  CHECK(r >= 0.0 && r < 0.2); /* handled in ms, but the epoch is at least 1 s: still closed */
  memcolo_on_pressure(NULL, NULL);

  /* ---- garbage of every kind is ignored; the connection keeps working */
  mc_t_current = "garbage";
  send_str(c1, "garbage\n\n{\"v\":2,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":1}\n");
  send_str(c1, "{\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":1}\n");
  send_str(c1, "{\"v\":1,\"type\":\"launch_missiles\"}\n{\"v\":1,\"type\":\"ok\"}\n{\"v\":1,\"type\":\"pong\",\"agent_version\":\"x\"}\n");
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":-1,\"level\":\"low\",\"target_bytes\":1}\n");
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":1.5,\"level\":\"low\",\"target_bytes\":1}\n");
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":2,\"level\":\"medium\",\"target_bytes\":1}\n");
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":18446744073709551616,\"level\":\"low\",\"target_bytes\":1}\n");
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":3,\"level\":\"low\",\"target_bytes\":1} trailing\n");
  {
    static char longl[70000 + 2];
    memset(longl, 'x', 70000);
    static const char head[] = "{\"v\":1,\"type\":\"notify\",\"seq\":4,\"level\":\"low\",\"target_bytes\":1,\"pad\":\"";
    memcpy(longl, head, sizeof(head) - 1);
    longl[69998] = '"';
    longl[69999] = '}';
    longl[70000] = '\n';
    send_str(c1, longl);
  }
  send_str(c1, "{ \"target_bytes\" : 0 , \"level\":\"low\",\"type\" :\"notify\", \"seq\":9,\"v\":1,"
               "\"extra\":{\"a\":[1,2.5e3,{\"b\":null,\"c\":\"\\u00e9\\\"\"}],\"t\":true}}\r\n");
  n = read_line(c1, line, sizeof(line), 10000);
  CHECK(n > 0 && field_u64(line, "\"seq\":") == 9);
  if (n > 0 && field_u64(line, "\"seq\":") != 9) fprintf(stderr, "after garbage: %s\n", line);

  /* ---- top: reservation suspended for TOP_HOLD_S (1 s here), then back */
  mc_t_current = "notify_top";
  make_free_memory();
  send_str(c1, "{\"v\":1,\"type\":\"notify\",\"seq\":11,\"level\":\"top\",\"target_bytes\":1}\n");
  n = read_line(c1, line, sizeof(line), 10000);
  CHECK(n > 0 && field_u64(line, "\"seq\":") == 11);
  CHECK(field_u64(line, "\"bytes\":") > 0);
  memcolo_stats_t st = stats();
  CHECK(st.reservation_on == 0);
  CHECK(st.pool_bytes == 0);
  WAIT_FOR(stats().reservation_on == 1, 20000);
  CHECK(stats().reservation_on == 1);
  CHECK(stats().agent_released_bytes >= low_bytes);

  /* ---- an agent that does not read: allocations go on, the link gives up and reconnects */
  mc_t_current = "agent_not_reading";
  pthread_t bg;
  pthread_create(&bg, NULL, bg_alloc, NULL);
  fcntl(c1, F_SETFL, O_NONBLOCK);
  long sent = 0;
  for (int i = 0; i < 200000; i++) {
    char m[128];
    snprintf(m, sizeof(m), "{\"v\":1,\"type\":\"notify\",\"seq\":%d,\"level\":\"low\",\"target_bytes\":0}\n", 100 + i);
    if (send(c1, m, strlen(m), MSG_NOSIGNAL) <= 0) break;
    sent++;
  }
  long before = bg_rounds;
  WAIT_FOR(bg_rounds > before + 100, 30000);
  CHECK(bg_rounds > before + 100);
  close(c1);
  llen = 0;

  /* ---- reconnection: registers again; class be turns the reservation off */
  mc_t_current = "reconnect";
  int c2 = accept_within(lfd, 20000);
  CHECK(c2 >= 0);
  if (c2 < 0) { bg_stop = 1; pthread_join(bg, NULL); TEST_END(); }
  n = read_line(c2, line, sizeof(line), 10000);
  CHECK(n > 0 && strstr(line, "\"type\":\"register\"") != NULL);
  snprintf(msg, sizeof(msg), "{\"v\":1,\"type\":\"registered\",\"pid\":%d,\"class\":\"be\"}\n", pid);
  send_str(c2, msg);
  WAIT_FOR(stats().reservation_on == 0 && stats().agent_registered == 1, 10000);
  CHECK(stats().reservation_on == 0);
  CHECK(stats().agent_registrations >= 2);
  bg_stop = 1;
  pthread_join(bg, NULL);

  /* ---- fork: the child stays standalone; the parent's connection is intact */
  mc_t_current = "fork";
  pid_t child = fork();
  if (child == 0) {
    void *p = MC_API(malloc)(1 << 20);
    memset(p, 1, 1 << 20);
    MC_API(free)(p);
    sleep_ms(300);
    _exit(stats().agent_registered == 0 ? 0 : 1);
  }
  int ws = 0;
  waitpid(child, &ws, 0);
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  CHECK(accept_within(lfd, 300) < 0); /* the child did not connect */
  send_str(c2, "{\"v\":1,\"type\":\"notify\",\"seq\":30,\"level\":\"low\",\"target_bytes\":0}\n");
  n = read_line(c2, line, sizeof(line), 10000);
  CHECK(n > 0 && field_u64(line, "\"seq\":") == 30);

  /* ---- an error reply to a reclaimed is survived */
  mc_t_current = "error_reply";
  send_str(c2, "{\"v\":1,\"type\":\"error\",\"code\":\"not_registered\",\"message\":\"x\"}\n");
  send_str(c2, "{\"v\":1,\"type\":\"notify\",\"seq\":31,\"level\":\"high\",\"target_bytes\":0}\n");
  n = read_line(c2, line, sizeof(line), 10000);
  CHECK(n > 0 && field_u64(line, "\"seq\":") == 31);
  close(c2);
  (void)sent;
  TEST_END();
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--standalone") == 0) return standalone_child();
  if (argc > 2 && strcmp(argv[1], "--agent-side") == 0) return agent_side(atoi(argv[2]));
  test_gate_formula();
  test_gate_min_epoch();
  char dir[] = "/tmp/memcolo-test-agent.XXXXXX";
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  char self[PATH_MAX];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (sl <= 0) return 1;
  self[sl] = 0;
  test_standalone(self, dir);
  /* the fake agent's socket exists before the library starts in the re-executed test */
  char sock[PATH_MAX];
  snprintf(sock, sizeof(sock), "%s/agent.sock", dir);
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
  if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 8) != 0) { perror("bind"); return 1; }
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    char lfd_s[16];
    snprintf(lfd_s, sizeof(lfd_s), "%d", lfd);
    setenv("MEMCOLO_SOCKET", sock, 1);
    setenv("MEMCOLO_CLASS", "lc", 1);
    setenv("MEMCOLO_TOP_HOLD_S", "1", 1);
    setenv("MEMCOLO_HP_CACHE", "256m", 1);
    execl(self, "test_agent", "--agent-side", lfd_s, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  close(lfd);
  char out[256] = {0};
  ssize_t n = 0, r;
  while ((r = read(fds[0], out + n, sizeof(out) - 1 - (size_t)n)) > 0) n += r;
  int ws = 0;
  waitpid(pid, &ws, 0);
  unlink(sock);
  /* the library's stats directory (<socket dir>/alloc) and whatever it left there */
  char sub[PATH_MAX];
  snprintf(sub, sizeof(sub), "%s/alloc", dir);
  DIR *d = opendir(sub);
  if (d) {
    struct dirent *e;
    char f[PATH_MAX + 256];
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
      snprintf(f, sizeof(f), "%s/%s", sub, e->d_name);
      unlink(f);
    }
    closedir(d);
    rmdir(sub);
  }
  if (rmdir(dir) != 0) { perror("rmdir test directory"); mc_t_failed++; }
  int p = 0, f = 0;
  if (sscanf(out, "%d passed, %d failed", &p, &f) == 2) {
    mc_t_passed += p;
    mc_t_failed += f;
  } else {
    mc_t_failed++;
    fprintf(stderr, "FAIL: the agent-side test gave no result (status %d)\n", ws);
  }
  if (!WIFEXITED(ws) || (WEXITSTATUS(ws) != 0 && f == 0)) mc_t_failed++;
  TEST_END();
}
