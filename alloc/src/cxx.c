/* cxx.c — the C++ operator new/delete family (plain, array, nothrow, sized, aligned),
 * defined in C under their Itanium-ABI names. On failure the throwing forms call
 * std::__throw_bad_alloc() when libstdc++ is loaded (weak reference; this file is
 * built with -fexceptions so the exception unwinds through it) and abort otherwise. */
#include <stddef.h>
#include <stdlib.h>

#include "internal.h"

extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn));

static MC_NOINLINE void *mc_new_failed(void) {
  if (_ZSt17__throw_bad_allocv) _ZSt17__throw_bad_allocv();
  mc_write_str(2, "memcolo: error: operator new: out of memory\n");
  abort();
}

static inline void *mc_new(size_t n) {
  void *p = malloc(n);
  return mc_likely(p != NULL) ? p : mc_new_failed();
}
static inline void *mc_new_aligned(size_t n, size_t al) {
  void *p = mc_alloc_aligned(al, n);
  return mc_likely(p != NULL) ? p : mc_new_failed();
}

typedef struct { char unused; } mc_nothrow_t;

MC_EXPORT void *_Znwm(size_t n) { return mc_new(n); }
MC_EXPORT void *_Znam(size_t n) { return mc_new(n); }
MC_EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const mc_nothrow_t *t) { (void)t; return malloc(n); }
MC_EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const mc_nothrow_t *t) { (void)t; return malloc(n); }
MC_EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t al) { return mc_new_aligned(n, al); }
MC_EXPORT void *_ZnamSt11align_val_t(size_t n, size_t al) { return mc_new_aligned(n, al); }
MC_EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const mc_nothrow_t *t) { (void)t; return mc_alloc_aligned(al, n); }
MC_EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const mc_nothrow_t *t) { (void)t; return mc_alloc_aligned(al, n); }

MC_EXPORT void _ZdlPv(void *p) { free(p); }
MC_EXPORT void _ZdaPv(void *p) { free(p); }
MC_EXPORT void _ZdlPvm(void *p, size_t n) { (void)n; free(p); }
MC_EXPORT void _ZdaPvm(void *p, size_t n) { (void)n; free(p); }
MC_EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const mc_nothrow_t *t) { (void)t; free(p); }
MC_EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const mc_nothrow_t *t) { (void)t; free(p); }
MC_EXPORT void _ZdlPvSt11align_val_t(void *p, size_t al) { (void)al; free(p); }
MC_EXPORT void _ZdaPvSt11align_val_t(void *p, size_t al) { (void)al; free(p); }
MC_EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t al) { (void)n; (void)al; free(p); }
MC_EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t al) { (void)n; (void)al; free(p); }
MC_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const mc_nothrow_t *t) { (void)al; (void)t; free(p); }
MC_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const mc_nothrow_t *t) { (void)al; (void)t; free(p); }
