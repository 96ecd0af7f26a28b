/* gate.c: the allow-rate gate of M3's adaptive allocation protocol (§4.2):
 * r = min(elapsed since the last high signal / (epoch * NUM_epochs), 1), epoch at
 * least min_epoch_ns; only the floor(1/r)-th allocation proceeds at once, the others
 * evict first. floor(1/r) is floor(window_ns / elapsed_ns) in integers, so that the
 * decisions are those of the other SDKs and of libmemcolo on the same clock readings
 * (sdk/testvectors/gate.json, replayed by tests/test_gate_vectors.c). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

struct memcolo_gate {
  pthread_mutex_t mu;
  unsigned num_epochs;
  int has_signal, has_epoch;
  uint64_t last_signal_ns, epoch_ns, count, min_epoch_ns;
};

uint64_t memcolo_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

memcolo_gate *memcolo_gate_new(unsigned num_epochs) {
  memcolo_gate *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  pthread_mutex_init(&g->mu, NULL);
  g->num_epochs = num_epochs ? num_epochs : 1;
  g->min_epoch_ns = MEMCOLO_DEFAULT_MIN_EPOCH_NS;
  return g;
}

void memcolo_gate_free(memcolo_gate *g) {
  if (!g) return;
  pthread_mutex_destroy(&g->mu);
  free(g);
}

void memcolo_gate_signal_received(memcolo_gate *g, uint64_t now_ns) {
  pthread_mutex_lock(&g->mu);
  g->has_signal = 1;
  g->last_signal_ns = now_ns;
  g->count = 0;
  pthread_mutex_unlock(&g->mu);
}

void memcolo_gate_signal_handled(memcolo_gate *g, uint64_t now_ns) {
  pthread_mutex_lock(&g->mu);
  if (g->has_signal) {
    g->epoch_ns = now_ns > g->last_signal_ns ? now_ns - g->last_signal_ns : 0;
    if (g->epoch_ns < g->min_epoch_ns) g->epoch_ns = g->min_epoch_ns;
    g->has_epoch = 1;
  }
  pthread_mutex_unlock(&g->mu);
}

void memcolo_gate_set_min_epoch_ns(memcolo_gate *g, uint64_t min_epoch_ns) {
  pthread_mutex_lock(&g->mu);
  g->min_epoch_ns = min_epoch_ns;
  pthread_mutex_unlock(&g->mu);
}

int64_t memcolo_gate_epoch_ns(memcolo_gate *g) {
  pthread_mutex_lock(&g->mu);
  int64_t e = g->has_epoch ? (int64_t)g->epoch_ns : -1;
  pthread_mutex_unlock(&g->mu);
  return e;
}

/* The time since the last signal and the window (epoch x NUM_epochs), ns: {0, 0}
 * without a signal (full rate), {0, 1} while the first signal has no epoch yet (rate
 * 0). A window beyond 2^64 - 1 ns saturates. */
static void elapsed_window(const memcolo_gate *g, uint64_t now_ns, uint64_t *elapsed, uint64_t *window) {
  *elapsed = 0;
  *window = 0;
  if (!g->has_signal) return;
  if (!g->has_epoch) {
    *window = 1;
    return;
  }
  if (__builtin_mul_overflow(g->epoch_ns, (uint64_t)g->num_epochs, window)) *window = UINT64_MAX;
  *elapsed = now_ns > g->last_signal_ns ? now_ns - g->last_signal_ns : 0;
}

double memcolo_gate_allow_rate(memcolo_gate *g, uint64_t now_ns) {
  uint64_t elapsed, window;
  pthread_mutex_lock(&g->mu);
  elapsed_window(g, now_ns, &elapsed, &window);
  pthread_mutex_unlock(&g->mu);
  return elapsed >= window ? 1.0 : (double)elapsed / (double)window;
}

int memcolo_gate_admit(memcolo_gate *g, uint64_t now_ns) {
  uint64_t elapsed, window;
  pthread_mutex_lock(&g->mu);
  elapsed_window(g, now_ns, &elapsed, &window);
  int admit;
  if (elapsed >= window) {
    g->count = 0;
    admit = 1;
  } else {
    g->count++;
    admit = elapsed > 0 && g->count >= window / elapsed;
    if (admit) g->count = 0;
  }
  pthread_mutex_unlock(&g->mu);
  return admit;
}

int memcolo_gate_before_alloc(memcolo_gate *g, void (*evict)(void *), void *arg) {
  if (memcolo_gate_admit(g, memcolo_now_ns())) return 0;
  evict(arg);
  return 1;
}
