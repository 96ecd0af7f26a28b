/* misuse.c — one heap misuse per run, against whatever malloc the process has
 * (LD_PRELOAD selects it), for the README's table of what each allocator catches.
 * usage: misuse CASE, CASE one of
 *   double-free-adjacent     free(a); free(a)
 *   double-free-nonadjacent  free(a); free(b); free(a)
 *   double-free-cross-thread free(a) in a thread that stays alive; free(a) in main
 *   interior-free            free(a + 16) of a 64-byte block
 *   foreign-free             free() of a pointer into static storage
 *   overflow                 one byte written past the 40 bytes asked for, then free
 *   use-after-free           free(a); a's first 64 bytes overwritten; malloc/free go on
 * After the misuse the program allocates again and says what it saw on stdout:
 * "handed out twice" when two live blocks share an address or overlap, "not caught"
 * when the allocator went on. The allocator catching it shows as an abort (SIGABRT,
 * its message on stderr) or another signal: misuse_table.sh tells them apart. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;

static int by_address(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)*(char *const *)x, b = (uintptr_t)*(char *const *)y;
  return a < b ? -1 : a > b;
}

/* N fresh blocks of `size` (enough to drain a thread cache and the rest of the span or
 * page the misused block lies in): "handed out twice" if any two overlap, or one
 * overlaps `live`, a block the program still holds */
static void probe(size_t size, const char *live, size_t live_n) {
  enum { N = 4096 };
  static char *b[N];
  for (int i = 0; i < N; i++) b[i] = malloc(size);
  qsort(b, N, sizeof(b[0]), by_address);
  for (int i = 0; i < N; i++) {
    if (i + 1 < N && b[i] + size > b[i + 1]) { puts("handed out twice"); exit(0); }
    if (live && b[i] < live + live_n && live < b[i] + size) { puts("handed out twice"); exit(0); }
  }
  puts("not caught");
  exit(0);
}

static pthread_mutex_t hold = PTHREAD_MUTEX_INITIALIZER;
static void *free_and_stay(void *p) {
  free(p);
  pthread_mutex_lock(&hold); /* keeps its thread cache alive until main is done */
  pthread_mutex_unlock(&hold);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: misuse CASE\n"); return 2; }
  const char *c = argv[1];
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!strcmp(c, "double-free-adjacent")) {
    char *a = malloc(64);
    free(a);
    free(a);
    probe(64, NULL, 0);
  } else if (!strcmp(c, "double-free-nonadjacent")) {
    char *a = malloc(64), *b = malloc(64);
    free(a);
    free(b);
    free(a);
    probe(64, NULL, 0);
  } else if (!strcmp(c, "double-free-cross-thread")) {
    char *a = malloc(64);
    pthread_t t;
    pthread_mutex_lock(&hold);
    pthread_create(&t, NULL, free_and_stay, a);
    usleep(100000); /* the thread has freed a (into its own cache) */
    free(a);
    pthread_mutex_unlock(&hold);
    pthread_join(t, NULL); /* its cache goes back: a is now free twice over */
    probe(64, NULL, 0);
  } else if (!strcmp(c, "interior-free")) {
    char *a = malloc(64);
    memset(a, 1, 64);
    free(a + 16);
    probe(64, a, 64);
  } else if (!strcmp(c, "foreign-free")) {
    static char not_heap[256];
    free(not_heap + 64);
    puts("not caught");
  } else if (!strcmp(c, "overflow")) {
    char *a = malloc(40);
    char *n = malloc(40);
    memset(a, 'a', 41); /* one byte past the size asked for */
    free(a);
    sink = n;
    puts("not caught");
  } else if (!strcmp(c, "use-after-free")) {
    char *a = malloc(64);
    free(a);
    memset(a, 0x41, 64);
    for (int i = 0; i < 64; i++) sink = malloc(64);
    puts("not caught");
  } else {
    fprintf(stderr, "misuse: unknown case %s\n", c);
    return 2;
  }
  return 0;
}
