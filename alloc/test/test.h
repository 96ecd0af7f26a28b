/* test.h — a minimal test harness: CHECK counts failures and goes on; every test
 * program ends with "N passed, N failed" (test/run.sh adds them up). The MC_API(name)
 * macro calls the allocator under its standard name, or memcolo_<name> in the
 * sanitizer builds where ASan keeps malloc. */
#ifndef MC_TEST_H
#define MC_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MC_PREFIXED
#define MC_API(n) memcolo_##n
#include <stddef.h>
void *memcolo_malloc(size_t);
void memcolo_free(void *);
void *memcolo_calloc(size_t, size_t);
void *memcolo_realloc(void *, size_t);
void *memcolo_reallocarray(void *, size_t, size_t);
int memcolo_posix_memalign(void **, size_t, size_t);
void *memcolo_aligned_alloc(size_t, size_t);
void *memcolo_memalign(size_t, size_t);
void *memcolo_valloc(size_t);
void *memcolo_pvalloc(size_t);
size_t memcolo_malloc_usable_size(void *);
int memcolo_malloc_trim(size_t);
#else
#include <malloc.h>
#define MC_API(n) n
#endif

static int mc_t_passed, mc_t_failed;
static const char *mc_t_current = "";

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (cond) mc_t_passed++;                                                           \
    else {                                                                             \
      mc_t_failed++;                                                                   \
      fprintf(stderr, "FAIL %s:%d [%s]: %s\n", __FILE__, __LINE__, mc_t_current, #cond); \
    }                                                                                  \
  } while (0)

#define TEST(name) static void name(void)
#define RUN(name) do { mc_t_current = #name; name(); fprintf(stderr, "  ran %s\n", #name); } while (0)
#define TEST_END()                                                   \
  do {                                                               \
    printf("%d passed, %d failed\n", mc_t_passed, mc_t_failed);      \
    fflush(stdout);                                                  \
    return mc_t_failed ? 1 : 0;                                      \
  } while (0)

/* splitmix64: deterministic pseudo-random numbers */
static inline unsigned long long mc_t_rand(unsigned long long *s) {
  unsigned long long z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
#endif
