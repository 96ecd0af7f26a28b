/* agent.c — the link to the memcolo agent (M3 §4): not started yet in this build;
 * libmemcolo runs standalone. */
#include "internal.h"

uint64_t mc_allow_rate;

void mc_agent_start(void) {}
void mc_agent_poll(void) {}

MC_EXPORT uint64_t memcolo_allow_rate_bytes_per_s(void) { return __atomic_load_n(&mc_allow_rate, __ATOMIC_RELAXED); }

MC_EXPORT size_t memcolo_release(memcolo_level_t level, size_t target_bytes) {
  mc_ensure_init();
  if (level == MEMCOLO_LEVEL_TOP) memcolo_set_reservation(0);
  pthread_mutex_lock(&mc_heap.lock);
  size_t done = mc_heap_release_locked(target_bytes, level == MEMCOLO_LEVEL_LOW);
  pthread_mutex_unlock(&mc_heap.lock);
  return done;
}
