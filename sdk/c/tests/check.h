/* check.h: minimal assertions for libmemcolo-client's tests. */
#ifndef MEMCOLO_CHECK_H
#define MEMCOLO_CHECK_H
#include <stdio.h>
#include <stdlib.h>

static int check_failures;
#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fputc('\n', stderr);                                            \
      check_failures++;                                               \
    }                                                                 \
  } while (0)
#define REQUIRE(cond, ...)          \
  do {                              \
    int required_ = !!(cond);       \
    CHECK(required_, __VA_ARGS__);  \
    if (!required_) exit(1);        \
  } while (0)
#define RUN(test)                   \
  do {                              \
    int before = check_failures;    \
    test();                         \
    printf("%s %s\n", check_failures == before ? "ok  " : "FAIL", #test); \
  } while (0)
#define CHECK_DONE() (check_failures ? (fprintf(stderr, "%d check(s) failed\n", check_failures), 1) : 0)
#endif
