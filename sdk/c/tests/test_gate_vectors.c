/* The shared allow-rate gate vectors (sdk/testvectors/gate.json, generated from the
 * Rust SDK's gate): every case replayed on memcolo_gate with a synthetic clock (the
 * file's nanoseconds are this gate's). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/internal.h"
#include "check.h"
#include "vectors.h"

static uint64_t u64(const mj *v, const char *key) {
  uint64_t x = 0;
  REQUIRE(!mj_as_u64(mj_get(v, key), &x), "%s is not an unsigned integer", key);
  return x;
}

static void replay(const mj *c) {
  const char *name = mj_get(c, "name")->text;
  memcolo_gate *g = memcolo_gate_new((unsigned)u64(c, "num_epochs"));
  REQUIRE(g, "memcolo_gate_new");
  memcolo_gate_set_min_epoch_ns(g, u64(c, "min_epoch_ns"));
  const mj *steps = mj_get(c, "steps");
  for (size_t i = 0; i < steps->n; i++) {
    const mj *s = &steps->items[i];
    const char *op = mj_get(s, "op")->text;
    const mj *level = mj_get(s, "level");
    int feeds = level == NULL || strcmp(level->text, "low") != 0;
    if (!strcmp(op, "signal")) {
      if (feeds) memcolo_gate_signal_received(g, u64(s, "t_ns"));
    } else if (!strcmp(op, "handled")) {
      if (feeds) memcolo_gate_signal_handled(g, u64(s, "t_ns"));
    } else if (!strcmp(op, "rate")) {
      double want = strtod(mj_get(s, "rate")->text, NULL);
      double got = memcolo_gate_allow_rate(g, u64(s, "t_ns"));
      CHECK(fabs(got - want) <= 1e-12, "%s step %zu: rate %.17g, want %.17g", name, i, got, want);
    } else if (!strcmp(op, "admit")) {
      const mj *want = mj_get(s, "admitted");
      for (size_t k = 0; k < want->n; k++) {
        int got = memcolo_gate_admit(g, u64(s, "t_ns"));
        CHECK(got == want->items[k].boolean, "%s step %zu: allocation %zu admitted %d, want %d", name, i, k, got,
              want->items[k].boolean);
      }
    } else if (!strcmp(op, "epoch")) {
      const mj *want = mj_get(s, "epoch_ns");
      int64_t got = memcolo_gate_epoch_ns(g);
      if (want->type == MJ_NULL) {
        CHECK(got == -1, "%s step %zu: epoch %lld ns, want none", name, i, (long long)got);
      } else {
        CHECK(got >= 0 && (uint64_t)got == u64(s, "epoch_ns"), "%s step %zu: epoch %lld ns, want %s", name, i,
              (long long)got, want->text);
      }
    } else {
      CHECK(0, "%s step %zu: unknown op %s", name, i, op);
    }
  }
  memcolo_gate_free(g);
}

static void gate_vectors(void) {
  mj *file = load_vectors("gate.json");
  const mj *cases = mj_get(file, "cases");
  REQUIRE(cases && cases->type == MJ_ARR && cases->n > 0, "gate.json has no cases");
  for (size_t k = 0; k < cases->n; k++) replay(&cases->items[k]);
  mj_free(file);
}

int main(void) {
  RUN(gate_vectors);
  return CHECK_DONE();
}
