/* protocol.c: decoding and encoding of protocol v1 messages (docs/protocol.md)
 * against a schema table that mirrors the reference implementation (Rust
 * memcolo-proto): field order, required/optional/defaulted fields, value kinds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef enum { K_U64, K_PID, K_STR, K_BOOL, K_CLASS, K_LEVEL, K_NOTIFY, K_CODE, K_ANY } kind;
typedef enum { REQUIRED, OPTIONAL, DEFAULT_SOCKET_MODE, DEFAULT_TRUE } presence;

typedef struct {
  const char *name;
  kind kind;
  presence presence;
} field;

typedef struct {
  const char *type;
  field fields[6];
} schema;

static const schema requests[] = {
    {"register",
     {{"pid", K_PID, OPTIONAL},
      {"class", K_CLASS, REQUIRED},
      {"name", K_STR, OPTIONAL},
      {"expected_reclaim_bytes", K_U64, OPTIONAL},
      {"notify", K_NOTIFY, DEFAULT_SOCKET_MODE}}},
    {"unregister", {{"pid", K_PID, OPTIONAL}}},
    {"reclaimed",
     {{"pid", K_PID, OPTIONAL},
      {"seq", K_U64, OPTIONAL},
      {"bytes", K_U64, REQUIRED},
      {"duration_ms", K_U64, REQUIRED},
      {"ok", K_BOOL, DEFAULT_TRUE}}},
    {"status", {{0}}},
    {"cgroup", {{"name", K_STR, REQUIRED}}},
    {"ping", {{0}}},
    {0, {{0}}},
};

static const schema replies[] = {
    {"ok", {{0}}},
    {"registered", {{"pid", K_PID, REQUIRED}, {"class", K_CLASS, REQUIRED}}},
    {"cgroup", {{"path", K_STR, REQUIRED}}},
    {"pong", {{"agent_version", K_STR, REQUIRED}}},
    {"status", {{"status", K_ANY, REQUIRED}}},
    {"notify", {{"seq", K_U64, REQUIRED}, {"level", K_LEVEL, REQUIRED}, {"target_bytes", K_U64, REQUIRED}}},
    {"error", {{"code", K_CODE, REQUIRED}, {"message", K_STR, REQUIRED}}},
    {0, {{0}}},
};

static const char *const classes[] = {"lc", "be", "elastic", 0};
static const char *const levels[] = {"low", "high", "top", 0};
static const char *const notify_modes[] = {"socket", "signal", "none", 0};
static const char *const codes[] = {"bad_request", "unsupported_version", "permission_denied",
                                    "no_such_process", "not_registered", "internal",
                                    "limit_exceeded", 0};

const char *memcolo_level_name(memcolo_level level) {
  return (unsigned)level < 3 ? levels[level] : NULL;
}

const char *memcolo_error_code_name(int code) {
  return code >= 1 && code <= 7 ? codes[code - 1] : NULL;
}

static int in_list(const mj *v, const char *const *list) {
  if (v->type != MJ_STR) return 0;
  for (; *list; list++)
    if (strlen(*list) == v->len && memcmp(*list, v->text, v->len) == 0) return 1;
  return 0;
}

static int kind_ok(kind k, const mj *v) {
  uint64_t u;
  int32_t p;
  switch (k) {
    case K_U64: return mj_as_u64(v, &u) == 0;
    case K_PID: return mj_as_i32(v, &p) == 0;
    case K_STR: return v->type == MJ_STR;
    case K_BOOL: return v->type == MJ_BOOL;
    case K_CLASS: return in_list(v, classes);
    case K_LEVEL: return in_list(v, levels);
    case K_NOTIFY: return in_list(v, notify_modes);
    case K_CODE: return in_list(v, codes);
    case K_ANY: return 1;
  }
  return 0;
}

static const schema *find(const schema *table, const char *type, size_t len) {
  for (; table->type; table++)
    if (strlen(table->type) == len && memcmp(table->type, type, len) == 0) return table;
  return NULL;
}

static int error(char *err, size_t errlen, int code, const char *fmt, const char *arg) {
  if (err && errlen) snprintf(err, errlen, fmt, arg ? arg : "");
  return code;
}

int memcolo_decode(memcolo_direction direction, const char *line, size_t len, memcolo_msg **out,
                   char *err, size_t errlen) {
  *out = NULL;
  while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
  if (len > MEMCOLO_MAX_LINE_BYTES)
    return error(err, errlen, MEMCOLO_E_BAD_REQUEST, "line is over the %s65536-byte limit", "");
  char perr[128];
  mj *obj = mj_parse(line, len, perr, sizeof perr);
  if (!obj) return error(err, errlen, MEMCOLO_E_BAD_REQUEST, "malformed message: %s", perr);
  int rc = MEMCOLO_E_BAD_REQUEST;
  mj *msg = NULL;
  uint64_t v;
  const mj *vv = mj_get(obj, "v"), *t = mj_get(obj, "type");
  const schema *s;
  if (obj->type != MJ_OBJ) {
    error(err, errlen, rc, "malformed message: not a JSON object%s", "");
    goto out;
  }
  if (!vv) {
    error(err, errlen, rc, "malformed message: missing `v`%s", "");
    goto out;
  }
  if (mj_as_u64(vv, &v)) {
    error(err, errlen, rc, "malformed message: `v` is not an unsigned integer%s", "");
    goto out;
  }
  if (v > MEMCOLO_PROTOCOL_VERSION) {
    rc = error(err, errlen, MEMCOLO_E_UNSUPPORTED_VERSION, "protocol version %s is newer than 1", vv->text);
    goto out;
  }
  if (!t || t->type != MJ_STR || !(s = find(direction == MEMCOLO_REPLY ? replies : requests, t->text, t->len))) {
    error(err, errlen, rc, "malformed message: missing or unknown `type`%s", "");
    goto out;
  }
  msg = mj_new_object();
  if (!msg || mj_obj_put(msg, "type", t)) goto out;
  for (const field *f = s->fields; f->name; f++) {
    const mj *val = mj_get(obj, f->name);
    if (!val || (val->type == MJ_NULL && f->presence == OPTIONAL)) {
      mj def = {0};
      if (f->presence == REQUIRED) {
        error(err, errlen, rc, "malformed message: missing field `%s`", f->name);
        goto out;
      }
      if (f->presence == OPTIONAL) continue;
      if (f->presence == DEFAULT_TRUE) {
        def.type = MJ_BOOL;
        def.boolean = 1;
      } else {
        def.type = MJ_STR;
        def.text = (char *)"socket";
        def.len = 6;
      }
      if (mj_obj_put(msg, f->name, &def)) goto out;
      continue;
    }
    if (!kind_ok(f->kind, val)) {
      error(err, errlen, rc, "malformed message: bad value for `%s`", f->name);
      goto out;
    }
    if (mj_obj_put(msg, f->name, val)) goto out;
  }
  *out = (memcolo_msg *)msg;
  msg = NULL;
  rc = 0;
out:
  mj_free(msg);
  mj_free(obj);
  return rc;
}

void memcolo_msg_free(memcolo_msg *msg) { mj_free((mj *)msg); }

const char *memcolo_msg_type(const memcolo_msg *msg) {
  const mj *t = mj_get((const mj *)msg, "type");
  return t ? t->text : NULL;
}

int memcolo_msg_u64(const memcolo_msg *msg, const char *field, uint64_t *out) {
  return mj_as_u64(mj_get((const mj *)msg, field), out);
}

const char *memcolo_msg_str(const memcolo_msg *msg, const char *field) {
  const mj *v = mj_get((const mj *)msg, field);
  return v && v->type == MJ_STR ? v->text : NULL;
}

char *memcolo_msg_json(const memcolo_msg *msg) {
  mj_buf b = {0};
  if (mj_write(&b, (const mj *)msg)) {
    free(b.buf);
    return NULL;
  }
  return b.buf;
}

char *memcolo__encode(memcolo_direction direction, const mj *m) {
  const mj *t = mj_get(m, "type");
  const schema *s;
  if (!t || t->type != MJ_STR || !(s = find(direction == MEMCOLO_REPLY ? replies : requests, t->text, t->len)))
    return NULL;
  mj_buf b = {0};
  int bad = mj_buf_put(&b, "{\"v\":1,\"type\":", 14) || mj_buf_str(&b, t->text, t->len);
  for (const field *f = s->fields; !bad && f->name; f++) {
    const mj *val = mj_get(m, f->name);
    mj def = {0};
    if (!val || val->type == MJ_NULL) {
      if (f->presence == REQUIRED && !(val && f->kind == K_ANY)) { bad = 1; break; }
      if (f->presence == OPTIONAL) continue;
      if (f->presence == DEFAULT_TRUE) { def.type = MJ_BOOL; def.boolean = 1; }
      if (f->presence == DEFAULT_SOCKET_MODE) { def.type = MJ_STR; def.text = (char *)"socket"; def.len = 6; }
      if (f->presence != REQUIRED) val = &def;
    }
    if (!kind_ok(f->kind, val)) { bad = 1; break; }
    bad = mj_buf_put(&b, ",", 1) || mj_buf_str(&b, f->name, strlen(f->name)) || mj_buf_put(&b, ":", 1) ||
          mj_write(&b, val);
  }
  if (bad || mj_buf_put(&b, "}\n", 2)) {
    free(b.buf);
    return NULL;
  }
  return b.buf;
}

char *memcolo_encode_json(memcolo_direction direction, const char *meaning_json) {
  mj *m = mj_parse(meaning_json, strlen(meaning_json), NULL, 0);
  if (!m) return NULL;
  char *line = memcolo__encode(direction, m);
  mj_free(m);
  return line;
}
