/* wake_probe: how late a thread pinned to one CPU wakes from a short sleep.
 *
 * The loop sleeps `interval_us` on CLOCK_MONOTONIC (clock_nanosleep, absolute
 * deadline = last wake + interval) and records the overshoot: the time from the
 * deadline to the moment the thread runs again. With SCHED_FIFO (`--fifo PRIO`) no
 * SCHED_OTHER task of the guest can delay the wake-up, so an overshoot of many
 * milliseconds is time the CPU did not run the guest at all (in a VM: the host did
 * not run the vCPU, or ran it in a host-side fault) or ran it with interrupts off.
 * With SCHED_OTHER (the default) the overshoot also holds the guest's own run-queue
 * wait, as an LC service's would.
 *
 * Output (stdout): one JSON object, units in the names:
 *   samples, p50_us, p99_us, p999_us, max_us, over_1ms, over_5ms, over_10ms,
 *   over_20ms, over_50ms (counts), cpu, policy, interval_us, duration_s.
 * With `--events FILE`: one CSV row per overshoot above `--threshold-us` (default
 * 1000): `mono_s,overshoot_us` (CLOCK_MONOTONIC at the wake-up, seconds; the clock of
 * `perf record -k mono` and of host_mm_sampler.py).
 *
 *   wake_probe --cpu 0 --duration-s 40 [--interval-us 1000] [--fifo 50]
 *              [--events FILE] [--threshold-us 1000]
 *
 * SIGINT / SIGTERM end the loop early; the summary and events are still written.
 *
 * Errors: bad arguments exit 2; a failed sched_setaffinity / sched_setscheduler /
 * open exits 1 with the cause on stderr. Build: cc -O2 -o wake_probe wake_probe.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Histogram of overshoots in 10 us buckets up to 1 s; the last bucket holds the rest. */
#define BUCKET_US 10
#define NBUCKETS 100001

static uint64_t hist[NBUCKETS];
static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double quantile_us(uint64_t n, double q)
{
    uint64_t want = (uint64_t)(q * (double)n);
    uint64_t seen = 0;
    for (size_t i = 0; i < NBUCKETS; i++) {
        seen += hist[i];
        if (seen > want)
            return (double)(i * BUCKET_US);
    }
    return (double)((NBUCKETS - 1) * BUCKET_US);
}

static void usage(void)
{
    fprintf(stderr, "usage: wake_probe --cpu N --duration-s S [--interval-us US] "
                    "[--fifo PRIO] [--events FILE] [--threshold-us US]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int cpu = -1, fifo = 0;
    long interval_us = 1000, threshold_us = 1000;
    double duration_s = 0;
    const char *events_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--cpu"))
            cpu = atoi(v);
        else if (!strcmp(a, "--duration-s"))
            duration_s = atof(v);
        else if (!strcmp(a, "--interval-us"))
            interval_us = atol(v);
        else if (!strcmp(a, "--fifo"))
            fifo = atoi(v);
        else if (!strcmp(a, "--events"))
            events_path = v;
        else if (!strcmp(a, "--threshold-us"))
            threshold_us = atol(v);
        else
            usage();
    }
    if (cpu < 0 || duration_s <= 0 || interval_us <= 0 || fifo < 0 || fifo > 99)
        usage();

    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set)) {
        fprintf(stderr, "wake_probe: sched_setaffinity(cpu %d): %s\n", cpu, strerror(errno));
        return 1;
    }
    if (fifo) {
        struct sched_param sp = {.sched_priority = fifo};
        if (sched_setscheduler(0, SCHED_FIFO, &sp)) {
            fprintf(stderr, "wake_probe: SCHED_FIFO %d: %s\n", fifo, strerror(errno));
            return 1;
        }
    }
    FILE *ev = NULL;
    if (events_path) {
        ev = fopen(events_path, "w");
        if (!ev) {
            fprintf(stderr, "wake_probe: %s: %s\n", events_path, strerror(errno));
            return 1;
        }
        fprintf(ev, "mono_s,overshoot_us\n");
    }

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const int64_t interval_ns = interval_us * 1000LL;
    const int64_t end = now_ns() + (int64_t)(duration_s * 1e9);
    uint64_t n = 0, over[5] = {0};
    const int64_t marks_us[5] = {1000, 5000, 10000, 20000, 50000};
    int64_t max_us = 0;
    int64_t t = now_ns();
    while (t < end && !stop) {
        int64_t deadline = t + interval_ns;
        struct timespec ts = {.tv_sec = deadline / 1000000000LL,
                              .tv_nsec = deadline % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !stop)
            ;
        t = now_ns();
        int64_t late_us = (t - deadline) / 1000;
        if (late_us < 0)
            late_us = 0;
        size_t b = (size_t)(late_us / BUCKET_US);
        hist[b < NBUCKETS ? b : NBUCKETS - 1]++;
        n++;
        if (late_us > max_us)
            max_us = late_us;
        for (int k = 0; k < 5; k++)
            over[k] += late_us > marks_us[k];
        if (ev && late_us > threshold_us)
            fprintf(ev, "%.6f,%lld\n", (double)t / 1e9, (long long)late_us);
    }
    if (ev)
        fclose(ev);
    printf("{\"cpu\": %d, \"policy\": \"%s\", \"interval_us\": %ld, \"duration_s\": %.1f, "
           "\"samples\": %llu, \"p50_us\": %.0f, \"p99_us\": %.0f, \"p999_us\": %.0f, "
           "\"max_us\": %lld, \"over_1ms\": %llu, \"over_5ms\": %llu, \"over_10ms\": %llu, "
           "\"over_20ms\": %llu, \"over_50ms\": %llu}\n",
           cpu, fifo ? "fifo" : "other", interval_us, duration_s, (unsigned long long)n,
           quantile_us(n, 0.5), quantile_us(n, 0.99), quantile_us(n, 0.999), (long long)max_us,
           (unsigned long long)over[0], (unsigned long long)over[1], (unsigned long long)over[2],
           (unsigned long long)over[3], (unsigned long long)over[4]);
    return 0;
}
