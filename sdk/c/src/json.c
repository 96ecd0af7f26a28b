/* json.c: strict JSON parser and writer for the protocol's flat messages (and the
 * arbitrary `status` value). Grammar of RFC 8259; nesting limited to 128 levels as
 * in serde_json; no NaN/Infinity, no trailing commas, no leading zeros. */
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MJ_MAX_DEPTH 128

typedef struct {
  const char *s;
  size_t i, n;
  char *err;
  size_t errlen;
} parser;

static int fail(parser *p, const char *what) {
  if (p->err && p->errlen)
    snprintf(p->err, p->errlen, "%s at byte %zu", what, p->i);
  return -1;
}

static void skip_ws(parser *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
    p->i++;
}

int mj_buf_put(mj_buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    char *nb = realloc(b->buf, cap);
    if (!nb) return -1;
    b->buf = nb;
    b->cap = cap;
  }
  memcpy(b->buf + b->len, s, n);
  b->len += n;
  b->buf[b->len] = 0;
  return 0;
}

static int put_utf8(mj_buf *b, uint32_t cp) {
  char u[4];
  size_t n;
  if (cp < 0x80) { u[0] = (char)cp; n = 1; }
  else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
  else if (cp < 0x10000) { u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[2] = (char)(0x80 | (cp & 0x3F)); n = 3; }
  else { u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)); u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4; }
  return mj_buf_put(b, u, n);
}

static int hex4(parser *p, uint32_t *out) {
  if (p->i + 4 > p->n) return fail(p, "truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p->s[p->i++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
    else return fail(p, "bad \\u escape");
  }
  *out = v;
  return 0;
}

static int parse_string(parser *p, char **out, size_t *outlen) {
  mj_buf b = {0};
  p->i++; /* opening quote */
  for (;;) {
    if (p->i >= p->n) { free(b.buf); return fail(p, "EOF while parsing a string"); }
    unsigned char c = (unsigned char)p->s[p->i++];
    if (c == '"') break;
    if (c < 0x20) { free(b.buf); return fail(p, "control character in string"); }
    if (c != '\\') {
      if (mj_buf_put(&b, (const char *)&c, 1)) { free(b.buf); return -1; }
      continue;
    }
    if (p->i >= p->n) { free(b.buf); return fail(p, "EOF in escape"); }
    char e = p->s[p->i++];
    char lit;
    switch (e) {
      case '"': lit = '"'; break;
      case '\\': lit = '\\'; break;
      case '/': lit = '/'; break;
      case 'b': lit = '\b'; break;
      case 'f': lit = '\f'; break;
      case 'n': lit = '\n'; break;
      case 'r': lit = '\r'; break;
      case 't': lit = '\t'; break;
      case 'u': {
        uint32_t cp;
        if (hex4(p, &cp)) { free(b.buf); return -1; }
        if (cp >= 0xD800 && cp < 0xDC00) {
          uint32_t lo;
          if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') { free(b.buf); return fail(p, "lone surrogate"); }
          p->i += 2;
          if (hex4(p, &lo)) { free(b.buf); return -1; }
          if (lo < 0xDC00 || lo > 0xDFFF) { free(b.buf); return fail(p, "lone surrogate"); }
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          free(b.buf);
          return fail(p, "lone surrogate");
        }
        if (put_utf8(&b, cp)) { free(b.buf); return -1; }
        continue;
      }
      default: free(b.buf); return fail(p, "invalid escape");
    }
    if (mj_buf_put(&b, &lit, 1)) { free(b.buf); return -1; }
  }
  if (!b.buf && mj_buf_put(&b, "", 0)) return -1;
  *out = b.buf;
  *outlen = b.len;
  return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, mj *v) {
  size_t start = p->i;
  if (p->i < p->n && p->s[p->i] == '-') p->i++;
  if (p->i >= p->n || !is_digit(p->s[p->i])) return fail(p, "invalid number");
  if (p->s[p->i] == '0') {
    p->i++;
    if (p->i < p->n && is_digit(p->s[p->i])) return fail(p, "leading zero");
  } else {
    while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
  }
  if (p->i < p->n && p->s[p->i] == '.') {
    p->i++;
    if (p->i >= p->n || !is_digit(p->s[p->i])) return fail(p, "invalid number");
    while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
  }
  if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
    p->i++;
    if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
    if (p->i >= p->n || !is_digit(p->s[p->i])) return fail(p, "invalid number");
    while (p->i < p->n && is_digit(p->s[p->i])) p->i++;
  }
  v->type = MJ_NUM;
  v->len = p->i - start;
  v->text = malloc(v->len + 1);
  if (!v->text) return -1;
  memcpy(v->text, p->s + start, v->len);
  v->text[v->len] = 0;
  return 0;
}

static int grow(mj *v) {
  if (v->n < v->cap) return 0;
  size_t cap = v->cap ? v->cap * 2 : 8;
  mj *items = realloc(v->items, cap * sizeof *items);
  if (!items) return -1;
  v->items = items;
  if (v->type == MJ_OBJ) {
    char **keys = realloc(v->keys, cap * sizeof *keys);
    if (!keys) return -1;
    v->keys = keys;
  }
  v->cap = cap;
  return 0;
}

static int parse_value(parser *p, mj *v, int depth);

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->n - p->i < n || memcmp(p->s + p->i, word, n) != 0) return fail(p, "expected value");
  p->i += n;
  return 0;
}

static int parse_value(parser *p, mj *v, int depth) {
  memset(v, 0, sizeof *v);
  if (depth > MJ_MAX_DEPTH) return fail(p, "recursion limit exceeded");
  skip_ws(p);
  if (p->i >= p->n) return fail(p, "EOF while parsing a value");
  char c = p->s[p->i];
  if (c == 'n') { v->type = MJ_NULL; return literal(p, "null"); }
  if (c == 't') { v->type = MJ_BOOL; v->boolean = 1; return literal(p, "true"); }
  if (c == 'f') { v->type = MJ_BOOL; return literal(p, "false"); }
  if (c == '"') { v->type = MJ_STR; return parse_string(p, &v->text, &v->len); }
  if (c == '-' || is_digit(c)) return parse_number(p, v);
  if (c == '[' || c == '{') {
    int obj = c == '{';
    v->type = obj ? MJ_OBJ : MJ_ARR;
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) { p->i++; return 0; }
    for (;;) {
      if (grow(v)) return -1;
      char *key = NULL;
      if (obj) {
        skip_ws(p);
        size_t kl;
        if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "key must be a string");
        if (parse_string(p, &key, &kl)) return -1;
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') { free(key); return fail(p, "expected `:`"); }
        p->i++;
      }
      if (parse_value(p, &v->items[v->n], depth + 1)) { mj_clear(&v->items[v->n]); free(key); return -1; }
      if (obj) v->keys[v->n] = key;
      v->n++;
      skip_ws(p);
      if (p->i >= p->n) return fail(p, "EOF in container");
      if (p->s[p->i] == ',') { p->i++; continue; }
      if (p->s[p->i] == (obj ? '}' : ']')) { p->i++; return 0; }
      return fail(p, "expected `,` or end of container");
    }
  }
  return fail(p, "expected value");
}

mj *mj_parse(const char *s, size_t len, char *err, size_t errlen) {
  parser p = {s, 0, len, err, errlen};
  mj *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  if (parse_value(&p, v, 0)) { mj_free(v); return NULL; }
  skip_ws(&p);
  if (p.i != p.n) { fail(&p, "trailing characters"); mj_free(v); return NULL; }
  return v;
}

void mj_clear(mj *v) {
  if (!v) return;
  free(v->text);
  for (size_t k = 0; k < v->n; k++) {
    mj_clear(&v->items[k]);
    if (v->keys) free(v->keys[k]);
  }
  free(v->items);
  free(v->keys);
  memset(v, 0, sizeof *v);
}

void mj_free(mj *v) {
  mj_clear(v);
  free(v);
}

int mj_copy(mj *dst, const mj *src) {
  memset(dst, 0, sizeof *dst);
  dst->type = src->type;
  dst->boolean = src->boolean;
  if (src->text) {
    dst->text = malloc(src->len + 1);
    if (!dst->text) return -1;
    memcpy(dst->text, src->text, src->len + 1);
    dst->len = src->len;
  }
  for (size_t k = 0; k < src->n; k++) {
    if (grow(dst)) return -1;
    if (mj_copy(&dst->items[k], &src->items[k])) return -1;
    if (src->type == MJ_OBJ) {
      dst->keys[k] = strdup(src->keys[k]);
      if (!dst->keys[k]) return -1;
    }
    dst->n++;
  }
  return 0;
}

mj *mj_new_object(void) {
  mj *v = calloc(1, sizeof *v);
  if (v) v->type = MJ_OBJ;
  return v;
}

int mj_obj_put(mj *obj, const char *key, const mj *val) {
  if (grow(obj)) return -1;
  char *k = strdup(key);
  if (!k) return -1;
  if (mj_copy(&obj->items[obj->n], val)) { free(k); mj_clear(&obj->items[obj->n]); return -1; }
  obj->keys[obj->n++] = k;
  return 0;
}

const mj *mj_get(const mj *obj, const char *key) {
  if (!obj || obj->type != MJ_OBJ) return NULL;
  for (size_t k = obj->n; k-- > 0;)
    if (strcmp(obj->keys[k], key) == 0) return &obj->items[k];
  return NULL;
}

int mj_equal(const mj *a, const mj *b) {
  if (a->type != b->type) return 0;
  switch (a->type) {
    case MJ_NULL: return 1;
    case MJ_BOOL: return a->boolean == b->boolean;
    case MJ_NUM:
    case MJ_STR: return a->len == b->len && memcmp(a->text, b->text, a->len) == 0;
    case MJ_ARR:
      if (a->n != b->n) return 0;
      for (size_t k = 0; k < a->n; k++)
        if (!mj_equal(&a->items[k], &b->items[k])) return 0;
      return 1;
    case MJ_OBJ: {
      size_t distinct = 0;
      for (size_t k = 0; k < a->n; k++) {
        if (mj_get(a, a->keys[k]) != &a->items[k]) continue; /* shadowed duplicate */
        distinct++;
        const mj *o = mj_get(b, a->keys[k]);
        if (!o || !mj_equal(&a->items[k], o)) return 0;
      }
      size_t bd = 0;
      for (size_t k = 0; k < b->n; k++)
        if (mj_get(b, b->keys[k]) == &b->items[k]) bd++;
      return distinct == bd;
    }
  }
  return 0;
}

int mj_as_u64(const mj *v, uint64_t *out) {
  if (!v || v->type != MJ_NUM || strpbrk(v->text, ".eE-")) return -1;
  errno = 0;
  unsigned long long x = strtoull(v->text, NULL, 10);
  if (errno == ERANGE) return -1;
  *out = (uint64_t)x;
  return 0;
}

int mj_as_i32(const mj *v, int32_t *out) {
  if (!v || v->type != MJ_NUM || strpbrk(v->text, ".eE")) return -1;
  errno = 0;
  long long x = strtoll(v->text, NULL, 10);
  if (errno == ERANGE || x < INT32_MIN || x > INT32_MAX) return -1;
  *out = (int32_t)x;
  return 0;
}

int mj_buf_str(mj_buf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  if (mj_buf_put(b, "\"", 1)) return -1;
  size_t run = 0;
  for (size_t k = 0; k < n; k++) {
    unsigned char c = (unsigned char)s[k];
    const char *esc = NULL;
    char u[7];
    switch (c) {
      case '"': esc = "\\\""; break;
      case '\\': esc = "\\\\"; break;
      case '\b': esc = "\\b"; break;
      case '\f': esc = "\\f"; break;
      case '\n': esc = "\\n"; break;
      case '\r': esc = "\\r"; break;
      case '\t': esc = "\\t"; break;
      default:
        if (c < 0x20) {
          memcpy(u, "\\u00", 4);
          u[4] = hex[c >> 4];
          u[5] = hex[c & 15];
          u[6] = 0;
          esc = u;
        }
    }
    if (!esc) { run++; continue; }
    if (mj_buf_put(b, s + k - run, run) || mj_buf_put(b, esc, strlen(esc))) return -1;
    run = 0;
  }
  if (mj_buf_put(b, s + n - run, run)) return -1;
  return mj_buf_put(b, "\"", 1);
}

int mj_write(mj_buf *b, const mj *v) {
  switch (v->type) {
    case MJ_NULL: return mj_buf_put(b, "null", 4);
    case MJ_BOOL: return v->boolean ? mj_buf_put(b, "true", 4) : mj_buf_put(b, "false", 5);
    case MJ_NUM: return mj_buf_put(b, v->text, v->len);
    case MJ_STR: return mj_buf_str(b, v->text, v->len);
    case MJ_ARR:
    case MJ_OBJ: {
      int obj = v->type == MJ_OBJ;
      if (mj_buf_put(b, obj ? "{" : "[", 1)) return -1;
      for (size_t k = 0; k < v->n; k++) {
        if (k && mj_buf_put(b, ",", 1)) return -1;
        if (obj && (mj_buf_str(b, v->keys[k], strlen(v->keys[k])) || mj_buf_put(b, ":", 1))) return -1;
        if (mj_write(b, &v->items[k])) return -1;
      }
      return mj_buf_put(b, obj ? "}" : "]", 1);
    }
  }
  return -1;
}
