/* test_errors.c — bad input is reported with a clear message and aborts: double free
 * (small and large), free of a pointer memcolo never returned, interior pointers, and
 * a corrupted thread-cache free list. Each case runs in a child process whose stderr
 * and exit signal are checked. */
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "test.h"

typedef void (*bad_fn)(void);

static void run_bad(const char *name, bad_fn fn, const char *expect) {
  int fds[2];
  if (pipe(fds) != 0) { CHECK(0); return; }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);
  }
  close(fds[1]);
  char buf[2048] = {0};
  size_t off = 0;
  ssize_t n;
  while (off < sizeof(buf) - 1 && (n = read(fds[0], buf + off, sizeof(buf) - 1 - off)) > 0) off += (size_t)n;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  mc_t_current = name;
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  CHECK(strstr(buf, expect) != NULL);
  CHECK(strstr(buf, "address 0x") != NULL);
  if (!strstr(buf, expect)) fprintf(stderr, "  %s: got: %s\n", name, buf);
}

static void *volatile sink;

static void double_free_small(void) {
  void *p = MC_API(malloc)(48);
  MC_API(free)(p);
  MC_API(free)(p);
}

static void double_free_large(void) {
  void *p = MC_API(malloc)(100000);
  MC_API(free)(p);
  MC_API(free)(p);
}

static void double_free_after_trim(void) {
  /* the object has gone back to its span; the second free is caught when the object
   * reaches the span again (here at the next trim): its bitmap says it is free */
  void *keep = MC_API(malloc)(48);
  void *p = MC_API(malloc)(48);
  MC_API(free)(p);
  MC_API(malloc_trim)(0);
  MC_API(free)(p);
  MC_API(malloc_trim)(0);
  sink = keep;
}

static void double_free_interleaved(void) {
  /* not back to back: caught when the thread cache's list is flushed to the span */
  void *p = MC_API(malloc)(64), *q = MC_API(malloc)(64);
  MC_API(free)(p);
  MC_API(free)(q);
  MC_API(free)(p);
  MC_API(malloc_trim)(0);
}

static void free_foreign(void) {
  static char not_heap[64];
  MC_API(free)(not_heap + 16);
}

static void free_interior_large(void) {
  char *p = (char *)MC_API(malloc)(200000);
  MC_API(free)(p + 8192);
}

static void corrupt_free_list(void) {
  /* The lists of free objects live in metadata (a use after free of an object cannot
   * reach them): simulate a wild write into a thread cache's list; it is caught when the
   * list is flushed, by the page map check of every entry. */
  void *a = MC_API(malloc)(96);
  MC_API(free)(a);
  mc_tcache->bins[mc_size_to_class(96)].slots[0] = (void *)(uintptr_t)0x7e57dead0000ull;
  MC_API(malloc_trim)(0);
}

static void use_after_free_write(void) {
  /* not an error the allocator can see, and harmless to it: objects hold no links */
  char *a = (char *)MC_API(malloc)(96);
  MC_API(free)(a);
  memset(a, 0xa5, 96);
  for (int i = 0; i < 1000; i++) MC_API(free)(MC_API(malloc)(96));
  abort(); /* reached: the allocator kept working */
}

static void usable_size_sanity(void) {
  /* not an error: malloc_usable_size of NULL is 0 */
  if (MC_API(malloc_usable_size)(NULL) != 0) _exit(3);
  abort();
}

int main(void) {
  run_bad("double_free_small", double_free_small, "double free");
  run_bad("double_free_large", double_free_large, "did not return");
  run_bad("double_free_after_trim", double_free_after_trim, "double free");
  run_bad("double_free_interleaved", double_free_interleaved, "double free");
  run_bad("free_foreign", free_foreign, "did not return");
  run_bad("free_interior_large", free_interior_large, "did not return");
  run_bad("corrupt_free_list", corrupt_free_list, "corrupted");
  int st = 0;
  pid_t pid = fork();
  if (pid == 0) { use_after_free_write(); _exit(0); }
  waitpid(pid, &st, 0);
  mc_t_current = "use_after_free_write";
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
  pid = fork();
  if (pid == 0) { usable_size_sanity(); _exit(0); }
  waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st));
  TEST_END();
}
