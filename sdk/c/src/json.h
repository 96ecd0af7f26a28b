/* json.h: a small strict JSON (RFC 8259) document model, internal to
 * libmemcolo-client. Numbers are kept as their source text so that 64-bit
 * unsigned values stay exact; strings are decoded to UTF-8 (with length, as they
 * may hold NUL). Used by protocol.c and by the tests that read the shared vectors. */
#ifndef MEMCOLO_JSON_H
#define MEMCOLO_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { MJ_NULL, MJ_BOOL, MJ_NUM, MJ_STR, MJ_ARR, MJ_OBJ } mj_type;

typedef struct mj {
  mj_type type;
  int boolean;      /* MJ_BOOL */
  char *text;       /* MJ_NUM: source text; MJ_STR: decoded UTF-8, NUL-terminated */
  size_t len;       /* length of text */
  struct mj *items; /* MJ_ARR, MJ_OBJ: values */
  char **keys;      /* MJ_OBJ: keys (NUL-terminated UTF-8) */
  size_t n, cap;
} mj;

/* Parses exactly one JSON value (surrounded by optional whitespace). Returns a
 * heap value, or NULL with a message in err. */
mj *mj_parse(const char *s, size_t len, char *err, size_t errlen);
void mj_free(mj *v);     /* frees a value from mj_parse / mj_new_* */
void mj_clear(mj *v);    /* frees the contents of v, not v itself */
int mj_copy(mj *dst, const mj *src); /* deep copy into dst; 0 on success */

/* The value of key in an object (the last one for duplicate keys), or NULL. */
const mj *mj_get(const mj *obj, const char *key);
/* Appends key: a deep copy of val to obj; 0 on success. */
int mj_obj_put(mj *obj, const char *key, const mj *val);
mj *mj_new_object(void);

/* Structural equality: objects compare as unordered maps, numbers by text. */
int mj_equal(const mj *a, const mj *b);

/* Integer views of a number's text; 0 on success, -1 if it is not one. */
int mj_as_u64(const mj *v, uint64_t *out);
int mj_as_i32(const mj *v, int32_t *out);

/* Appends the compact JSON of v (serde_json's escaping) to a growable buffer. */
typedef struct {
  char *buf;
  size_t len, cap;
} mj_buf;
int mj_buf_put(mj_buf *b, const char *s, size_t n);
int mj_buf_str(mj_buf *b, const char *s, size_t n); /* a JSON string literal */
int mj_write(mj_buf *b, const mj *v);

#endif
