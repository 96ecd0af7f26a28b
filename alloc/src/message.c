/* message.c — tiny formatter and error reporting that never allocate and never touch
 * locale or stdio (safe inside malloc and in a corrupted heap). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

void mc_write_str(int fd, const char *s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0) { if (errno == EINTR) continue; return; }
    s += w; n -= (size_t)w;
  }
}

char *mc_fmt_u64(char *buf, uint64_t v) {
  char tmp[24]; int i = 0;
  do { tmp[i++] = (char)('0' + v % 10); v /= 10; } while (v);
  while (i) *buf++ = tmp[--i];
  *buf = 0;
  return buf;
}

char *mc_fmt_hex(char *buf, uint64_t v) {
  static const char hex[] = "0123456789abcdef";
  char tmp[20]; int i = 0;
  *buf++ = '0'; *buf++ = 'x';
  do { tmp[i++] = hex[v & 15]; v >>= 4; } while (v);
  while (i) *buf++ = tmp[--i];
  *buf = 0;
  return buf;
}

void mc_warn(const char *what) {
  if (mc_options_cache[MC_OPT_VERBOSE] == 0 && mc_initialized) return;
  mc_write_str(2, "memcolo: warning: ");
  mc_write_str(2, what);
  mc_write_str(2, "\n");
}

void mc_fatal(const char *what, const void *p, long sclass, const char *expected) {
  char buf[256], *b = buf;
  mc_write_str(2, "memcolo: error: ");
  mc_write_str(2, what);
  b = mc_fmt_hex(b, (uint64_t)(uintptr_t)p);
  mc_write_str(2, " (address ");
  mc_write_str(2, buf);
  if (sclass > 0 && sclass < MC_CLASSES) {
    mc_write_str(2, ", size class ");
    mc_fmt_u64(buf, (uint64_t)sclass);
    mc_write_str(2, buf);
    mc_write_str(2, " of ");
    mc_fmt_u64(buf, mc_class_size[sclass]);
    mc_write_str(2, buf);
    mc_write_str(2, " bytes");
  }
  mc_write_str(2, ")");
  if (expected != NULL) { mc_write_str(2, ": expected "); mc_write_str(2, expected); }
  mc_write_str(2, "\n");
  abort();
}
