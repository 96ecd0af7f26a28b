/* tput.c — allocation-heavy multi-threaded benchmarks of the kinds allocator papers use
 * (mimalloc-bench, TCMalloc, Larson & Krishnan), run against whatever malloc the process
 * has (LD_PRELOAD selects it). Prints "name,threads,wall_ms,peak_rss_kib".
 *   prodcons  producers hand objects to consumers that free them (cross-thread frees)
 *   small     many small objects (16..128 B) allocated, then freed in random order
 *   realloc   realloc growth chains from 16 B to 1 MiB
 *   larson    a server: each thread replaces random slots (free + malloc 16..1000 B);
 *             threads exit and new ones inherit their slots
 * usage: tput MODE [THREADS [SCALE]]
 *   SCALE (default 1) multiplies the work: prodcons' objects, small's rounds, realloc's
 *   chains, larson's generations (at 1, ~0.1 s of CPU time each: scale 20 gives runs of
 *   seconds, whose times a busy machine disturbs less in proportion);
 *   TPUT_PIN=1: thread i runs on the i-th CPU of the process's affinity (mod their number);
 *   TPUT_SMAPS=PATH: resident KiB per mapping at the end;
 *   TPUT_PAGES=PATH: the resident pages of each mapping */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static void *volatile sink;
static long scale = 1;

/* TPUT_PIN=1: pthread_create with thread `idx` on the idx-th allowed CPU */
static cpu_set_t allowed;
static int pin, n_allowed;
static void spawn(pthread_t *th, void *(*fn)(void *), void *arg, int idx) {
  pthread_attr_t at;
  pthread_attr_init(&at);
  if (pin && n_allowed > 0) {
    int want = idx % n_allowed, seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
      if (!CPU_ISSET(c, &allowed)) continue;
      if (seen++ == want) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        pthread_attr_setaffinity_np(&at, sizeof(one), &one);
        break;
      }
    }
  }
  if (pthread_create(th, &at, fn, arg) != 0) { perror("tput: pthread_create"); exit(1); }
  pthread_attr_destroy(&at);
}

/* ---- producer/consumer: a bounded ring per pair */
#define RING 4096
typedef struct { pthread_mutex_t m; pthread_cond_t c; void *slot[RING]; size_t head, tail; int done; } ring_t;
static ring_t rings[8];
static long pc_objects = 2000000; /* per producer, x scale */
static void *producer(void *a) {
  ring_t *r = &rings[(uintptr_t)a];
  uint64_t s = (uintptr_t)a + 1;
  void *batch[64];
  for (long i = 0; i < pc_objects; i += 64) {
    for (int k = 0; k < 64; k++) { batch[k] = malloc(16 + rnd(&s) % 496); *(char *)batch[k] = 1; }
    pthread_mutex_lock(&r->m);
    while (r->head - r->tail > RING - 64) pthread_cond_wait(&r->c, &r->m);
    for (int k = 0; k < 64; k++) r->slot[r->head++ % RING] = batch[k];
    pthread_cond_broadcast(&r->c);
    pthread_mutex_unlock(&r->m);
  }
  pthread_mutex_lock(&r->m);
  r->done = 1;
  pthread_cond_broadcast(&r->c);
  pthread_mutex_unlock(&r->m);
  return NULL;
}
static void *consumer(void *a) {
  ring_t *r = &rings[(uintptr_t)a];
  void *batch[64];
  for (;;) {
    pthread_mutex_lock(&r->m);
    while (r->head == r->tail && !r->done) pthread_cond_wait(&r->c, &r->m);
    if (r->head == r->tail && r->done) { pthread_mutex_unlock(&r->m); return NULL; }
    int n = 0;
    while (n < 64 && r->tail != r->head) batch[n++] = r->slot[r->tail++ % RING];
    pthread_cond_broadcast(&r->c);
    pthread_mutex_unlock(&r->m);
    for (int k = 0; k < n; k++) free(batch[k]);
  }
}

/* ---- many small objects */
static void *small(void *a) {
  enum { N = 1000000 };
  void **v = malloc(N * sizeof(void *));
  uint64_t s = (uintptr_t)a + 7;
  for (long round = 0; round < 4 * scale; round++) {
    for (int i = 0; i < N; i++) { v[i] = malloc(16 + rnd(&s) % 113); *(char *)v[i] = 1; }
    for (int i = N - 1; i > 0; i--) { int j = (int)(rnd(&s) % (uint64_t)(i + 1)); void *t = v[i]; v[i] = v[j]; v[j] = t; }
    for (int i = 0; i < N; i++) free(v[i]);
  }
  free(v);
  return NULL;
}

/* ---- realloc growth */
static void *grow(void *a) {
  uint64_t s = (uintptr_t)a + 3;
  for (long chain = 0; chain < 3000 * scale; chain++) {
    size_t n = 16;
    char *p = malloc(n);
    size_t limit = (size_t)1 << (10 + rnd(&s) % 11); /* 1 KiB .. 1 MiB */
    while (n < limit) {
      n += n / 2 + 16;
      p = realloc(p, n);
      p[n - 1] = 1;
    }
    free(p);
  }
  return NULL;
}

/* ---- larson */
#define SLOTS 2000
typedef struct { void *slot[SLOTS]; uint64_t seed; } larson_t;
static void *larson(void *a) {
  larson_t *l = (larson_t *)a;
  for (int i = 0; i < 400000; i++) {
    int k = (int)(rnd(&l->seed) % SLOTS);
    free(l->slot[k]);
    l->slot[k] = malloc(16 + rnd(&l->seed) % 985);
    *(char *)l->slot[k] = 1;
  }
  return NULL;
}

/* TPUT_SMAPS=PATH: after the run, "rss_kib,mapping" per mapping with resident pages
 * (from /proc/self/smaps; the heap's pages are not given back within a run, so VmRSS
 * is still VmHWM here and this attributes the peak), to compare allocators' extra RSS
 * by mapping: heap, metadata, the library's image and .bss, libc's pages. */
static void smaps_summary(const char *path) {
  FILE *in = fopen("/proc/self/smaps", "r"), *out = fopen(path, "w");
  if (in == NULL || out == NULL) { if (in) fclose(in); if (out) fclose(out); return; }
  char line[512], name[512] = "";
  long rss;
  while (fgets(line, sizeof(line), in)) {
    unsigned long a, b;
    char file[400] = "[anon]";
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %399s", &a, &b, file) >= 2 && strchr(line, '-') < strchr(line, ' ')) {
      snprintf(name, sizeof(name), "%s %lx-%lx", file, a, b);
    } else if (sscanf(line, "Rss: %ld", &rss) == 1 && rss > 0) {
      fprintf(out, "%ld,%s\n", rss, name);
    }
  }
  fclose(in);
  fclose(out);
}

/* TPUT_PAGES=PATH: "mapping,offset_pages,resident page offsets..." for every mapping,
 * from /proc/self/pagemap (bit 63 present, bit 62 swapped): which pages of a library,
 * of the allocator's metadata or .bss, are resident (resolve a library's offsets to
 * functions with `nm -D --defined-only` or objdump). */
static void pages_dump(const char *path) {
  FILE *in = fopen("/proc/self/maps", "r"), *out = fopen(path, "w");
  FILE *pm = fopen("/proc/self/pagemap", "rb");
  if (in == NULL || out == NULL || pm == NULL) { if (in) fclose(in); if (out) fclose(out); if (pm) fclose(pm); return; }
  char line[512];
  while (fgets(line, sizeof(line), in)) {
    unsigned long a, b, off;
    char perm[8], file[400] = "[anon]";
    if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %399s", &a, &b, perm, &off, file) < 4) continue;
    fprintf(out, "%s %s %lx-%lx,%lu", file, perm, a, b, off / 4096);
    for (unsigned long v = a; v < b; v += 4096) {
      uint64_t e = 0;
      if (fseek(pm, (long)(v / 4096 * 8), SEEK_SET) != 0 || fread(&e, 8, 1, pm) != 1) break;
      if (e >> 62) fprintf(out, ",%lu", (v - a) / 4096);
    }
    fputc('\n', out);
  }
  fclose(in);
  fclose(pm);
  fclose(out);
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s prodcons|small|realloc|larson [THREADS [SCALE]]\n", argv[0]); return 2; }
  const char *mode = argv[1];
  int t = argc > 2 ? atoi(argv[2]) : 2;
  if (t < 1 || t > 8) t = 2;
  scale = argc > 3 ? atol(argv[3]) : 1;
  if (scale < 1 || scale > 100000) scale = 1;
  pc_objects *= scale;
  const char *pe = getenv("TPUT_PIN");
  pin = pe != NULL && atoi(pe) != 0;
  if (pin && sched_getaffinity(0, sizeof(allowed), &allowed) == 0) n_allowed = CPU_COUNT(&allowed);
  pthread_t th[16];
  uint64_t t0 = now_ns();
  if (!strcmp(mode, "prodcons")) {
    for (int i = 0; i < t; i++) { pthread_mutex_init(&rings[i].m, NULL); pthread_cond_init(&rings[i].c, NULL); }
    for (int i = 0; i < t; i++) spawn(&th[i], producer, (void *)(uintptr_t)i, i);
    for (int i = 0; i < t; i++) spawn(&th[t + i], consumer, (void *)(uintptr_t)i, t + i);
    for (int i = 0; i < 2 * t; i++) pthread_join(th[i], NULL);
  } else if (!strcmp(mode, "small") || !strcmp(mode, "realloc")) {
    void *(*fn)(void *) = !strcmp(mode, "small") ? small : grow;
    for (int i = 0; i < t; i++) spawn(&th[i], fn, (void *)(uintptr_t)i, i);
    for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
  } else if (!strcmp(mode, "larson")) {
    larson_t *ls = calloc((size_t)t, sizeof(larson_t));
    for (int i = 0; i < t; i++) ls[i].seed = (uint64_t)i + 11;
    for (long gen = 0; gen < 10 * scale; gen++) { /* threads exit; successors inherit the slots */
      for (int i = 0; i < t; i++) spawn(&th[i], larson, &ls[i], i);
      for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
    }
    for (int i = 0; i < t; i++) for (int k = 0; k < SLOTS; k++) free(ls[i].slot[k]);
    free(ls);
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  uint64_t t1 = now_ns();
  /* VmHWM: the peak RSS of this address space (ru_maxrss would carry over the
     launcher's peak across exec) */
  long hwm_kib = -1;
  FILE *st = fopen("/proc/self/status", "r");
  if (st) {
    char line[256];
    while (fgets(line, sizeof(line), st)) if (sscanf(line, "VmHWM: %ld", &hwm_kib) == 1) break;
    fclose(st);
  }
  printf("%s,%d,%.1f,%ld\n", mode, t, (double)(t1 - t0) / 1e6, hwm_kib);
  const char *att = getenv("TPUT_SMAPS");
  if (att) smaps_summary(att);
  const char *pg = getenv("TPUT_PAGES");
  if (pg) pages_dump(pg);
  return 0;
}
