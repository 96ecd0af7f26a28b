/* vectors.h: reading a file of the shared test vectors (sdk/testvectors) for
 * libmemcolo-client's tests. VECTORS_DIR (default ../testvectors, from sdk/c) is the
 * folder. */
#ifndef MEMCOLO_VECTORS_H
#define MEMCOLO_VECTORS_H
#include <stdio.h>
#include <stdlib.h>

#include "../src/internal.h"
#include "check.h"

#ifndef VECTORS_DIR
#define VECTORS_DIR "../testvectors"
#endif

/* The parsed JSON of VECTORS_DIR/name (free with mj_free); exits the test saying why
 * when the file cannot be read or parsed. */
static mj *load_vectors(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", VECTORS_DIR, name);
  FILE *f = fopen(path, "r");
  REQUIRE(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  REQUIRE(n >= 0, "cannot size %s", path);
  char *buf = malloc((size_t)n + 1);
  REQUIRE(buf, "out of memory reading %s", path);
  REQUIRE(fread(buf, 1, (size_t)n, f) == (size_t)n, "short read of %s", path);
  fclose(f);
  char err[128];
  mj *v = mj_parse(buf, (size_t)n, err, sizeof err);
  free(buf);
  REQUIRE(v, "%s: %s", path, err);
  return v;
}
#endif
