/* agent_probe.c — the LC process of agent_real.sh, linked against libmemcolo.so:
 * allocates 96 MiB in 64 KiB blocks and frees three of every four, so that its huge
 * pages hold ~72 MiB of free, backed pages that only a subrelease gives back (the
 * management thread trims idle whole huge pages by itself); prints "ready", then its
 * telemetry every 100 ms until killed:
 *   "stats REGISTERED NOTIFICATIONS AGENT_RELEASED_BYTES RESERVATION_ON" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memcolo.h"

int main(void) {
  enum { N = 96 * 16 };
  static void *v[N];
  for (int i = 0; i < N; i++) { v[i] = malloc(64 << 10); memset(v[i], 1, 64 << 10); }
  for (int i = 0; i < N; i++) if (i % 4 != 0) free(v[i]);
  printf("ready\n");
  fflush(stdout);
  struct timespec ts = {0, 100 * 1000 * 1000};
  for (;;) {
    memcolo_stats_t st;
    memcolo_stats(&st);
    printf("stats %u %llu %llu %u\n", st.agent_registered, (unsigned long long)st.agent_notifications,
           (unsigned long long)st.agent_released_bytes, st.reservation_on);
    fflush(stdout);
    nanosleep(&ts, NULL);
  }
}
