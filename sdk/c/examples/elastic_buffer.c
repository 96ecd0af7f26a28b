/* elastic_buffer: an elastic in-memory buffer beside `memcolo agent`, driven by
 * the client's event-loop API. It grows by 1 MiB chunks up to a size (MiB, first
 * argument), gives back 1 % of its chunks on low and 4 % (at least the target) on
 * high/top, then trims glibc's heap (memcolo_malloc_trim_layer), and evicts a chunk
 * before growing while the allow-rate gate (M3 §4.2) says so.
 *
 *   make -C sdk/c examples && sudo memcolo agent &
 *   sdk/c/examples/elastic_buffer 2048      (MEMCOLO_SOCKET=... for another socket)
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memcolo/client.h"

#define CHUNK_BYTES (1u << 20)

static char **chunks;
static size_t nchunks, max_chunks;

static uint64_t evict_chunks(size_t n) {
  if (n > nchunks) n = nchunks;
  for (size_t k = 0; k < n; k++) free(chunks[k]); /* oldest first */
  memmove(chunks, chunks + n, (nchunks - n) * sizeof *chunks);
  nchunks -= n;
  return (uint64_t)n * CHUNK_BYTES;
}

static int on_low(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)n, (void)arg;
  *bytes = evict_chunks((nchunks + 99) / 100);
  return 0;
}

static int on_high(const memcolo_notification *n, uint64_t *bytes, void *arg) {
  (void)arg;
  size_t want = (nchunks * 4 + 99) / 100, target = (size_t)((n->target_bytes + CHUNK_BYTES - 1) / CHUNK_BYTES);
  *bytes = evict_chunks(want > target ? want : target);
  return 0;
}

static void evict_one(void *arg) {
  (void)arg;
  evict_chunks(1);
}

int main(int argc, char **argv) {
  max_chunks = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
  chunks = calloc(max_chunks + 1, sizeof *chunks);
  memcolo_client_config cfg;
  memcolo_client_config_init(&cfg);
  cfg.name = "c-elastic-buffer";
  cfg.has_expected_reclaim_bytes = 1;
  cfg.expected_reclaim_bytes = (uint64_t)max_chunks * CHUNK_BYTES / 25;
  memcolo_client *c = memcolo_client_new(&cfg);
  if (!chunks || !c) {
    perror("elastic_buffer");
    return 1;
  }
  /* Upper layer first, then the C runtime below it (M3 §3-4). */
  memcolo_client_on(c, MEMCOLO_LOW, on_low, NULL);
  memcolo_client_on(c, MEMCOLO_HIGH, on_high, NULL);
  memcolo_client_on(c, MEMCOLO_TOP, on_high, NULL);
  for (int l = MEMCOLO_LOW; l <= MEMCOLO_TOP; l++) memcolo_client_on(c, (memcolo_level)l, memcolo_malloc_trim_layer, NULL);
  for (unsigned long tick = 0;; tick++) {
    struct pollfd p = {memcolo_client_fd(c), POLLIN, 0};
    poll(&p, p.fd >= 0 ? 1 : 0, 20);
    memcolo_client_process(c);
    if (nchunks < max_chunks) {
      memcolo_gate_before_alloc(memcolo_client_gate(c), evict_one, NULL);
      char *chunk = malloc(CHUNK_BYTES);
      if (chunk) {
        memset(chunk, 0x5a, CHUNK_BYTES);
        chunks[nchunks++] = chunk;
      }
    }
    if (tick % 50 == 0)
      printf("size %zu MiB, rss %llu MiB, allow rate %.2f, registered %d, notifications %llu\n", nchunks,
             (unsigned long long)(memcolo_rss_bytes() >> 20),
             memcolo_gate_allow_rate(memcolo_client_gate(c), memcolo_now_ns()), memcolo_client_registered(c),
             (unsigned long long)memcolo_client_notifications(c));
  }
}
