/* central.c — per size class: a transfer cache (an array of free objects that thread
 * caches exchange in batches, the cheap path for producer/consumer frees) and the list
 * of spans with free objects. Objects are carved from a span lazily (bump index), so a
 * new span touches only the pages it hands out. A span whose objects all came back
 * goes back to the page heap. Checks here are off the fast path: an object returned
 * to its span must be inside it, on an object boundary, and the span must have objects
 * out; a span's free list entry must point inside the span. */
#include <string.h>

#include "internal.h"

#define MC_TRANSFER_SLOTS 256

typedef struct mc_central_s {
  pthread_mutex_t lock;
  int ntransfer, transfer_max;
  mc_span_t *nonempty;
  void *transfer[MC_TRANSFER_SLOTS];
} __attribute__((aligned(64))) mc_central_t;

static mc_central_t mc_central[MC_CLASSES];

void mc_central_init(void) {
  for (unsigned c = 1; c < MC_CLASSES; c++) {
    pthread_mutex_init(&mc_central[c].lock, NULL);
    int m = mc_class_batch[c] * 8;
    mc_central[c].transfer_max = m > MC_TRANSFER_SLOTS ? MC_TRANSFER_SLOTS : m;
  }
}

void mc_central_lock_all(void) {
  for (unsigned c = 1; c < MC_CLASSES; c++) pthread_mutex_lock(&mc_central[c].lock);
}
void mc_central_unlock_all(void) {
  for (unsigned c = 1; c < MC_CLASSES; c++) pthread_mutex_unlock(&mc_central[c].lock);
}
void mc_central_reinit_locks(void) {
  for (unsigned c = 1; c < MC_CLASSES; c++) pthread_mutex_init(&mc_central[c].lock, NULL);
}

static void span_list_push(mc_central_t *ce, mc_span_t *s) {
  s->prev = NULL;
  s->next = ce->nonempty;
  if (ce->nonempty) ce->nonempty->prev = s;
  ce->nonempty = s;
  s->in_central = 1;
}
static void span_list_remove(mc_central_t *ce, mc_span_t *s) {
  if (s->prev) s->prev->next = s->next; else ce->nonempty = s->next;
  if (s->next) s->next->prev = s->prev;
  s->next = s->prev = NULL;
  s->in_central = 0;
}

static inline bool span_has_free(const mc_span_t *s) { return s->free != NULL || s->carved < s->capacity; }

static inline void check_in_span(const mc_span_t *s, const void *p, const char *what) {
  uintptr_t a = (uintptr_t)p, size = mc_class_size[s->sclass];
  if (a < s->start || a >= s->start + (uintptr_t)s->capacity * size || (a - s->start) % size != 0) {
    mc_fatal(what, p, s->sclass, "an object boundary inside its span");
  }
}

#if MC_DEBUG >= 2
/* full walk of a span's free list: inside the span, on boundaries, no cycle, and the
 * count of free objects consistent with `allocated` */
static void span_check(const mc_span_t *s) {
  uint32_t nfree = 0;
  for (void *q = s->free; q != NULL; q = *(void **)q) {
    check_in_span(s, q, "corrupted free list (debug walk): entry ");
    if (++nfree > s->capacity) mc_fatal("cycle in a span free list at ", q, s->sclass, "a list shorter than the span");
  }
  if (nfree + s->allocated != s->carved) mc_fatal("span counts inconsistent for span ", (void *)s->start, s->sclass, "free + allocated == carved");
}
#define MC_SPAN_CHECK(s) span_check(s)
#else
#define MC_SPAN_CHECK(s) do { } while (0)
#endif

int mc_central_fetch(unsigned cls, void **out, int n) {
  mc_central_t *ce = &mc_central[cls];
  pthread_mutex_lock(&ce->lock);
  if (ce->ntransfer > 0) {
    int k = ce->ntransfer < n ? ce->ntransfer : n;
    ce->ntransfer -= k;
    memcpy(out, &ce->transfer[ce->ntransfer], (size_t)k * sizeof(void *));
    pthread_mutex_unlock(&ce->lock);
    return k;
  }
  int got = 0;
  while (got < n) {
    mc_span_t *s = ce->nonempty;
    if (s == NULL) {
      if (got > 0) break;
      pthread_mutex_unlock(&ce->lock);
      size_t pages = mc_class_pages[cls];
      s = mc_heap_alloc(pages, MC_SPAN_SMALL, false);
      if (s == NULL) return 0;
      if (mc_reserve_on) __atomic_fetch_add(&mc_demand_small_bytes, pages << MC_PAGE_SHIFT, __ATOMIC_RELAXED);
      s->sclass = (uint8_t)cls;
      s->capacity = (uint32_t)((pages << MC_PAGE_SHIFT) / mc_class_size[cls]);
      s->carved = 0;
      s->allocated = 0;
      s->free = NULL;
      pthread_mutex_lock(&ce->lock);
      span_list_push(ce, s);
    }
    while (got < n && s->free != NULL) {
      void *p = s->free;
      void *next = *(void **)p;
      if (next != NULL) check_in_span(s, next, "corrupted free list: entry ");
      s->free = next;
      ((uintptr_t *)p)[1] = 0;
      out[got++] = p;
      s->allocated++;
    }
    uint32_t size = mc_class_size[cls];
    while (got < n && s->carved < s->capacity) {
      out[got++] = (void *)(s->start + (uintptr_t)s->carved * size);
      s->carved++;
      s->allocated++;
    }
    MC_SPAN_CHECK(s);
    if (!span_has_free(s)) span_list_remove(ce, s);
  }
  pthread_mutex_unlock(&ce->lock);
  return got;
}


void mc_central_return(unsigned cls, void **objs, int n) {
  mc_central_t *ce = &mc_central[cls];
  pthread_mutex_lock(&ce->lock);
  if (ce->ntransfer + n <= ce->transfer_max) {
    /* validate cheaply (the page map) before accepting */
    for (int i = 0; i < n; i++) {
      mc_span_t *s = mc_pagemap_get(objs[i]);
      if (s == NULL || s->kind != MC_SPAN_SMALL || s->sclass != cls) {
        mc_fatal("corrupted free list or invalid free: object ", objs[i], (long)cls, "an object of this size class");
      }
    }
    memcpy(&ce->transfer[ce->ntransfer], objs, (size_t)n * sizeof(void *));
    ce->ntransfer += n;
    pthread_mutex_unlock(&ce->lock);
    return;
  }
  for (int i = 0; i < n; i++) {
    void *p = objs[i];
    mc_span_t *s = mc_pagemap_get(p);
    if (s == NULL || s->kind != MC_SPAN_SMALL || s->sclass != cls) {
      mc_fatal("corrupted free list or invalid free: object ", p, (long)cls, "an object of this size class");
    }
    check_in_span(s, p, "invalid free (interior pointer) ");
    if (s->allocated == 0) mc_fatal("double free of object ", p, (long)cls, "an allocated object");
    *(void **)p = s->free;
    ((uintptr_t *)p)[1] = (uintptr_t)p ^ mc_cookie; /* freed marker, see free() */
    s->free = p;
    s->allocated--;
    MC_SPAN_CHECK(s);
    if (s->allocated == 0) {
      if (s->in_central) span_list_remove(ce, s);
      mc_heap_free(s);
    } else if (!s->in_central) {
      span_list_push(ce, s);
    }
  }
  pthread_mutex_unlock(&ce->lock);
}

bool mc_central_contains(unsigned cls, const void *p) {
  mc_central_t *ce = &mc_central[cls];
  bool found = false;
  pthread_mutex_lock(&ce->lock);
  for (int i = 0; i < ce->ntransfer && !found; i++) found = ce->transfer[i] == p;
  mc_span_t *s = mc_pagemap_get(p);
  if (!found && s != NULL && s->kind == MC_SPAN_SMALL) {
    size_t guard = s->capacity + 1;
    for (void *q = s->free; q != NULL && guard-- > 0; q = *(void **)q) {
      if (q == p) { found = true; break; }
    }
  }
  pthread_mutex_unlock(&ce->lock);
  return found;
}

/* Drops every transfer cache into the spans (malloc_trim), so that empty spans go
 * back to the page heap. */
void mc_central_drain(void) {
  for (unsigned c = 1; c < MC_CLASSES; c++) {
    mc_central_t *ce = &mc_central[c];
    void *tmp[MC_TRANSFER_SLOTS];
    pthread_mutex_lock(&ce->lock);
    int n = ce->ntransfer;
    memcpy(tmp, ce->transfer, (size_t)n * sizeof(void *));
    ce->ntransfer = 0;
    int saved = ce->transfer_max;
    ce->transfer_max = 0;
    pthread_mutex_unlock(&ce->lock);
    if (n) mc_central_return(c, tmp, n);
    pthread_mutex_lock(&ce->lock);
    ce->transfer_max = saved;
    pthread_mutex_unlock(&ce->lock);
  }
}
