/* The allow-rate gate (M3 §4.2), driven by explicit times. */
#include <math.h>

#include "memcolo/client.h"
#include "check.h"

#define S 1000000000ull

static void full_rate_without_signals(void) {
  memcolo_gate *g = memcolo_gate_new(5);
  for (int k = 0; k < 50; k++) CHECK(memcolo_gate_admit(g, 100 * S), "throttled");
  memcolo_gate_free(g);
}

static void linear_growth_and_floor_one_over_r(void) {
  memcolo_gate *g = memcolo_gate_new(5);
  memcolo_gate_signal_received(g, 10 * S);
  CHECK(memcolo_gate_allow_rate(g, 13 * S) == 0.0, "rate before the first epoch");
  memcolo_gate_signal_handled(g, 12 * S); /* epoch 2 s, window 10 s */
  CHECK(fabs(memcolo_gate_allow_rate(g, 11 * S) - 0.1) < 1e-9, "r at 1 s");
  CHECK(fabs(memcolo_gate_allow_rate(g, 15 * S) - 0.5) < 1e-9, "r at 5 s");
  CHECK(memcolo_gate_allow_rate(g, 21 * S) == 1.0, "r at 11 s");
  CHECK(memcolo_gate_epoch_ns(g) == (int64_t)(2 * S), "epoch");
  memcolo_gate_free(g);
  g = memcolo_gate_new(1);
  memcolo_gate_signal_received(g, 0);
  memcolo_gate_signal_handled(g, 10 * S);
  int want[8] = {0, 0, 0, 1, 0, 0, 0, 1};
  for (int k = 0; k < 8; k++) CHECK(memcolo_gate_admit(g, 2500000000ull) == want[k], "allocation %d", k);
  memcolo_gate_free(g);
}

static void evict(void *arg) { ++*(int *)arg; }

static void before_alloc_evicts_after_a_signal(void) {
  memcolo_gate *g = memcolo_gate_new(5);
  int evicted = 0;
  CHECK(memcolo_gate_before_alloc(g, evict, &evicted) == 0 && evicted == 0, "evicted without signal");
  memcolo_gate_signal_received(g, memcolo_now_ns());
  CHECK(memcolo_gate_before_alloc(g, evict, &evicted) == 1 && evicted == 1, "no eviction at r = 0");
  memcolo_gate_free(g);
}

static void fast_handler_is_held_to_the_minimum_epoch(void) {
  /* Handled in 15 ms, NUM_epochs 5: without a floor r would be 1 after 75 ms; with
   * the 1 s floor it is 0.2 after 1 s. */
  memcolo_gate *g = memcolo_gate_new(5);
  memcolo_gate_signal_received(g, 0);
  memcolo_gate_signal_handled(g, 15000000ull);
  CHECK(memcolo_gate_epoch_ns(g) == (int64_t)S, "epoch %lld", (long long)memcolo_gate_epoch_ns(g));
  CHECK(fabs(memcolo_gate_allow_rate(g, S) - 0.2) < 1e-9, "r after 1 s");
  CHECK(memcolo_gate_allow_rate(g, 5 * S) == 1.0, "r after 5 s");
  /* A floor of 0: the handling time alone (M3 §4.2 to the letter). */
  memcolo_gate_set_min_epoch_ns(g, 0);
  memcolo_gate_signal_received(g, 0);
  memcolo_gate_signal_handled(g, 15000000ull);
  CHECK(memcolo_gate_allow_rate(g, 75000000ull) == 1.0, "r without a floor");
  memcolo_gate_free(g);
}

int main(void) {
  RUN(full_rate_without_signals);
  RUN(fast_handler_is_held_to_the_minimum_epoch);
  RUN(linear_growth_and_floor_one_over_r);
  RUN(before_alloc_evicts_after_a_signal);
  return CHECK_DONE();
}
