/* largebuf.c — large buffers replaced at random (libmemcolo issue 27): SLOTS slots
 * (20), ITERS iterations (2000), each freeing a random slot and putting a new
 * zero-initialised buffer of 5..25 MiB (uniform, whole pages) there, with calloc, or
 * with malloc + memset ("memset" as the second argument); every buffer is checked zero
 * (a byte per 4 KiB page) and then written whole, as a service fills the buffer it
 * asked for. Prints one CSV line:
 * "largebuf,<mode>,<wall s>,<user s>,<sys s>,<peak RSS KiB>". The allocator comes
 * from LD_PRELOAD (bench/alloc/run_patterns.py). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static unsigned long long rnd(unsigned long long *s) {
  unsigned long long z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  int use_memset = argc > 2 && strcmp(argv[2], "memset") == 0;
  enum { SLOTS = 20 };
  unsigned char *slot[SLOTS] = {0};
  size_t len[SLOTS] = {0};
  unsigned long long seed = 42;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int it = 0; it < iters; it++) {
    unsigned i = (unsigned)(rnd(&seed) % SLOTS);
    free(slot[i]);
    size_t pages = (5u << 8) + rnd(&seed) % (20u << 8); /* 5..25 MiB in 4 KiB pages */
    size_t n = pages << 12;
    unsigned char *p;
    if (use_memset) {
      p = malloc(n);
      if (p) memset(p, 0, n);
    } else {
      p = calloc(1, n);
    }
    int zero = p != NULL && p[n - 1] == 0;
    for (size_t k = 0; zero && k < n; k += 4096) zero = p[k] == 0;
    if (!zero) {
      fprintf(stderr, "largebuf: %s at iteration %d\n", p ? "buffer not zero" : "NULL", it);
      return 1;
    }
    memset(p, (it & 0x7f) | 1, n);
    slot[i] = p;
    len[i] = n;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  for (unsigned i = 0; i < SLOTS; i++) free(slot[i]);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("largebuf,%s,%.3f,%.3f,%.3f,%ld\n", use_memset ? "memset" : "calloc",
         (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
         ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6, ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6,
         ru.ru_maxrss);
  (void)len;
  return 0;
}
