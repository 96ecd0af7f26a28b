/* init.c — process initialization (lazy, on the first allocation; it allocates
 * nothing, so the dynamic loader and libpthread may call malloc at any time), fork
 * safety (pthread_atfork takes every allocator lock around fork), and the library
 * constructor that starts the Hermes management thread for class lc. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <sched.h>

#include "internal.h"

volatile int mc_initialized;
static volatile int mc_init_state; /* 0 none, 1 running, 2 done */

void mc_central_reinit_locks(void);

void mc_lock_all(void) {
  mc_reserve_lock();
  mc_central_lock_all();
  pthread_mutex_lock(&mc_heap.lock);
}

void mc_unlock_all(void) {
  pthread_mutex_unlock(&mc_heap.lock);
  mc_central_unlock_all();
  mc_reserve_unlock();
}

static void mc_atfork_prepare(void) { if (mc_initialized) mc_lock_all(); }
static void mc_atfork_parent(void) { if (mc_initialized) mc_unlock_all(); }
static void mc_atfork_child(void) {
  if (!mc_initialized) return;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&mc_heap.lock, &attr);
  mc_central_reinit_locks();
  mc_reserve_after_fork_child();
  mc_tcache_flush_all_for_fork_child();
  mc_agent_after_fork_child();
}

bool mc_thread_start(void *(*fn)(void *), size_t stack_bytes) {
  pthread_attr_t attr;
  pthread_t t;
  sigset_t all, old;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, stack_bytes);
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the new thread inherits the full mask */
  int rc = pthread_create(&t, &attr, fn, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  return rc == 0;
}

void mc_init(void) {
  int expected = 0;
  if (!__atomic_compare_exchange_n(&mc_init_state, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    while (__atomic_load_n(&mc_init_state, __ATOMIC_ACQUIRE) != 2) sched_yield();
    return;
  }
  mc_options_init();
  /* before any object is handed out: an object handed out unmarked would be refused at
   * its free if the check were turned on after it */
  mc_double_free_check = MC_DEBUG >= 1 || MC_OPT(MC_OPT_DOUBLE_FREE_CHECK) != 0;
  mc_os_thp_init();
  mc_sizeclass_init();
  mc_secret_init();
  mc_central_init();
  mc_tcache_init();
  __atomic_store_n(&mc_initialized, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&mc_init_state, 2, __ATOMIC_RELEASE);
  /* may allocate: only now that the heap works */
  pthread_atfork(mc_atfork_prepare, mc_atfork_parent, mc_atfork_child);
}

__attribute__((constructor)) static void mc_constructor(void) {
  mc_init();
  long cls = MC_OPT(MC_OPT_CLASS), force = MC_OPT(MC_OPT_RESERVE);
  if (force == 1 || (force == -1 && cls == 1)) mc_reserve_start();
  if (cls != 0 && MC_OPT(MC_OPT_AGENT)) mc_agent_start();
}
