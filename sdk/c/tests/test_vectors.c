/* The shared protocol vectors (sdk/testvectors, generated from memcolo-proto). */
#include <stdlib.h>
#include <string.h>

#include "../src/internal.h"
#include "check.h"
#include "vectors.h"

static void check_file(const char *name, memcolo_direction dir) {
  mj *file = load_vectors(name);
  uint64_t version, max;
  REQUIRE(!mj_as_u64(mj_get(file, "protocol_version"), &version) && version == MEMCOLO_PROTOCOL_VERSION, "version");
  REQUIRE(!mj_as_u64(mj_get(file, "max_line_bytes"), &max) && max == MEMCOLO_MAX_LINE_BYTES, "max line");
  const mj *valid = mj_get(file, "valid");
  for (size_t k = 0; k < valid->n; k++) {
    const mj *v = &valid->items[k];
    const char *vname = mj_get(v, "name")->text;
    const mj *line = mj_get(v, "line");
    memcolo_msg *m;
    char err[200];
    int rc = memcolo_decode(dir, line->text, line->len, &m, err, sizeof err);
    CHECK(rc == 0, "%s: %s", vname, err);
    if (rc) continue;
    CHECK(mj_equal((mj *)m, mj_get(v, "message")), "%s: decoded %s", vname, memcolo_msg_json(m));
    memcolo_msg_free(m);
    if (mj_get(v, "canonical")->boolean) {
      char *enc = memcolo__encode(dir, mj_get(v, "message"));
      CHECK(enc && strlen(enc) == line->len + 1 && !memcmp(enc, line->text, line->len) && enc[line->len] == '\n',
            "%s: encoded %s", vname, enc ? enc : "(null)");
      free(enc);
    }
  }
  const mj *invalid = mj_get(file, "invalid");
  for (size_t k = 0; k < invalid->n; k++) {
    const mj *v = &invalid->items[k];
    const mj *line = mj_get(v, "line");
    memcolo_msg *m;
    int rc = memcolo_decode(dir, line->text, line->len, &m, NULL, 0);
    const char *code = memcolo_error_code_name(rc);
    CHECK(code && !strcmp(code, mj_get(v, "code")->text), "%s: got %d", mj_get(v, "name")->text, rc);
    if (!rc) memcolo_msg_free(m);
  }
  const mj *t = mj_get(file, "too_long");
  uint64_t count;
  mj_as_u64(mj_get(t, "count"), &count);
  mj_buf b = {0};
  mj_buf_put(&b, mj_get(t, "prefix")->text, mj_get(t, "prefix")->len);
  for (uint64_t k = 0; k < count; k++) mj_buf_put(&b, mj_get(t, "fill")->text, mj_get(t, "fill")->len);
  mj_buf_put(&b, mj_get(t, "suffix")->text, mj_get(t, "suffix")->len);
  memcolo_msg *m;
  int rc = memcolo_decode(dir, b.buf, b.len, &m, NULL, 0);
  CHECK(rc == MEMCOLO_E_BAD_REQUEST, "too long line: %d", rc);
  free(b.buf);
  mj_free(file);
}

static void request_vectors(void) { check_file("requests.json", MEMCOLO_REQUEST); }
static void reply_vectors(void) { check_file("replies.json", MEMCOLO_REPLY); }

static void public_encode_api(void) {
  char *line = memcolo_encode_json(MEMCOLO_REQUEST, "{\"type\":\"reclaimed\",\"seq\":3,\"bytes\":10,\"duration_ms\":2}");
  CHECK(line && !strcmp(line, "{\"v\":1,\"type\":\"reclaimed\",\"seq\":3,\"bytes\":10,\"duration_ms\":2,\"ok\":true}\n"), "%s", line);
  free(line);
  CHECK(!memcolo_encode_json(MEMCOLO_REQUEST, "{\"type\":\"reclaimed\",\"bytes\":-1,\"duration_ms\":2}"), "negative bytes encoded");
  CHECK(!memcolo_encode_json(MEMCOLO_REQUEST, "{\"type\":\"register\"}"), "register without class encoded");
}

int main(void) {
  RUN(request_vectors);
  RUN(reply_vectors);
  RUN(public_encode_api);
  return CHECK_DONE();
}
