/* A program whose large anonymous mapping libmemcolo hands to the agent
 * (MEMCOLO_TIER=1, MEMCOLO_TIER_THRESHOLD below 32 MiB): checks the semantics a
 * program relies on (zero fill, data kept through eviction, MADV_DONTNEED reading
 * zeros, mremap refused, fork not inheriting the region, munmap in parts), pausing
 * for a line on stdin after "MAPPED" so the test can look at the agent's state.
 * Exit status 0 and "OK" when everything held; otherwise a message and status 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (32UL << 20)
#define PAGE 4096UL
#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return 1; } while (0)

static unsigned char pat(size_t page, size_t i) { return (unsigned char)(page * 7 + i * 13 + 1); }

static int check(const unsigned char *p, size_t from, size_t to) {
  for (size_t pg = from; pg < to; pg++)
    for (size_t i = 0; i < PAGE; i += 509)
      if (p[pg * PAGE + i] != pat(pg, i)) return (int)pg + 1;
  return 0;
}

static void segv(int s) { (void)s; _exit(42); }

int main(void) {
  unsigned char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) FAIL("mmap: %s", strerror(errno));
  for (size_t pg = 0; pg < LEN / PAGE; pg += 97)
    if (p[pg * PAGE + 123] != 0) FAIL("page %zu not zero-filled", pg);
  for (size_t pg = 0; pg < LEN / PAGE; pg++)
    for (size_t i = 0; i < PAGE; i++) p[pg * PAGE + i] = pat(pg, i);
  int bad;
  if ((bad = check(p, 0, LEN / PAGE))) FAIL("page %d lost after the first pass", bad - 1);
  printf("MAPPED %p\n", (void *)p);
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) FAIL("no go line");
  if ((bad = check(p, 0, LEN / PAGE))) FAIL("page %d lost", bad - 1);
  /* MADV_DONTNEED on private anonymous memory: the pages read as zeros. */
  if (madvise(p, 1UL << 20, MADV_DONTNEED) != 0) FAIL("madvise: %s", strerror(errno));
  for (size_t i = 0; i < (1UL << 20); i += 211)
    if (p[i] != 0) FAIL("byte %zu not zero after MADV_DONTNEED", i);
  if ((bad = check(p, 256, LEN / PAGE))) FAIL("page %d lost after MADV_DONTNEED", bad - 1);
  /* mremap: refused with ENOMEM. */
  void *q = mremap(p, LEN, 2 * LEN, MREMAP_MAYMOVE);
  if (q != MAP_FAILED || errno != ENOMEM) FAIL("mremap was not refused: %p %s", q, strerror(errno));
  /* fork: the child does not inherit the region. */
  fflush(NULL);
  pid_t c = fork();
  if (c == 0) {
    signal(SIGSEGV, segv);
    volatile unsigned char v = p[300 * PAGE];
    (void)v;
    _exit(0);
  }
  int st = 0;
  waitpid(c, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 42) FAIL("the fork child read the region (status %d)", st);
  if ((bad = check(p, 256, LEN / PAGE))) FAIL("page %d lost after fork", bad - 1);
  /* munmap in two parts. */
  if (munmap(p + LEN - (1UL << 20), 1UL << 20) != 0) FAIL("munmap tail: %s", strerror(errno));
  if ((bad = check(p, 256, LEN / PAGE - 256))) FAIL("page %d lost after a partial munmap", bad - 1);
  if (munmap(p, LEN - (1UL << 20)) != 0) FAIL("munmap: %s", strerror(errno));
  printf("OK\n");
  return 0;
}
