/* clock_step.c: the step of this machine's time sources, for hermes_bench's resolution.
 * Prints a histogram of back-to-back rdtscp readings (lfence-fenced, in TSC cycles; >1000
 * of 10^6 pairs) and 63 consecutive rdtsc readings relative to the first. On this VM
 * (AMD EPYC guest, constant_tsc, tsc_known_freq ~2.6 GHz) every difference is a multiple
 * of 26 cycles (10 ns): the TSC steps like clock_gettime, so rdtscp is no finer a timer;
 * and the guest has no PMU (`perf stat -e cycles` reads <not supported>), so no cycle
 * counter either. hermes_bench keeps clock_gettime and the dithered interquartile mean.
 * build: gcc -O2 -o clock_step clock_step.c */
#include <stdint.h>
#include <stdio.h>
#include <x86intrin.h>

int main(void) {
  static uint64_t h[4096];
  unsigned aux;
  for (int i = 0; i < 1000000; i++) {
    _mm_lfence();
    uint64_t t0 = __rdtscp(&aux);
    _mm_lfence();
    uint64_t t1 = __rdtscp(&aux);
    _mm_lfence();
    if (t1 - t0 < 4096) h[t1 - t0]++;
  }
  printf("rdtscp back to back (cycles:count):");
  for (int i = 0; i < 4096; i++)
    if (h[i] > 1000) printf(" %d:%llu", i, (unsigned long long)h[i]);
  uint64_t v[64];
  for (int i = 0; i < 64; i++) v[i] = __rdtsc();
  printf("\nrdtsc consecutive (cycles from the first):");
  for (int i = 1; i < 64; i++) printf(" %llu", (unsigned long long)(v[i] - v[0]));
  printf("\n");
  return 0;
}
