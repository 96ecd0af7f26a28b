/* memcolo/client.h: libmemcolo-client, the C SDK of memcolo for elastic
 * applications (M3, EuroSys'21 §4).
 *
 * A client registers the process with `memcolo agent` over its Unix socket
 * ($MEMCOLO_SOCKET or /run/memcolo/agent.sock), runs the application's handlers on
 * low/high/top memory-pressure notifications (upper layer first, then lower layers
 * such as memcolo_malloc_trim_layer: M3 §3-4), answers each with the bytes given
 * back and the time taken, reconnects with exponential backoff when the agent
 * restarts, and never reports the agent's absence as an error. The protocol is
 * docs/protocol.md.
 *
 * Two ways to drive it:
 *  - event loop: poll memcolo_client_fd() for POLLIN (and wake after
 *    memcolo_client_next_timeout_ms()), then call memcolo_client_process();
 *    handlers run inline in that call;
 *  - background thread: memcolo_client_start_thread(); handlers then run on a
 *    handler thread and one that overruns the handler timeout is reported as a
 *    failed reclaim while the process goes on.
 *
 * The allow-rate gate (memcolo_gate_*) is M3's adaptive allocation protocol
 * (§4.2). Units: bytes, milliseconds (_ms), nanoseconds of CLOCK_MONOTONIC (_ns).
 * Link with `pkg-config --libs memcolo-client` (-lmemcolo-client -lpthread).
 */
#ifndef MEMCOLO_CLIENT_H
#define MEMCOLO_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEMCOLO_PROTOCOL_VERSION 1
#define MEMCOLO_MAX_LINE_BYTES 65536
#define MEMCOLO_DEFAULT_SOCKET "/run/memcolo/agent.sock"
#define MEMCOLO_SOCKET_ENV "MEMCOLO_SOCKET"
/* NUM_epochs of M3's Go-Cache and Memcached (§4.2). */
#define MEMCOLO_DEFAULT_NUM_EPOCHS 5
/* The shortest epoch of a gate by default, ns: one poll of M3's monitor (§6) and of
 * `memcolo agent` with its default poll_ms (see memcolo_gate_set_min_epoch_ns). */
#define MEMCOLO_DEFAULT_MIN_EPOCH_NS 1000000000ull

/* ---- protocol ------------------------------------------------------------ */

typedef enum { MEMCOLO_LOW = 0, MEMCOLO_HIGH = 1, MEMCOLO_TOP = 2 } memcolo_level;

/* "low", "high", "top"; NULL for other values. */
const char *memcolo_level_name(memcolo_level level);

/* Error codes of docs/protocol.md §7 (0 is success). */
typedef enum {
  MEMCOLO_E_BAD_REQUEST = 1,
  MEMCOLO_E_UNSUPPORTED_VERSION,
  MEMCOLO_E_PERMISSION_DENIED,
  MEMCOLO_E_NO_SUCH_PROCESS,
  MEMCOLO_E_NOT_REGISTERED,
  MEMCOLO_E_INTERNAL,
  MEMCOLO_E_LIMIT_EXCEEDED,
} memcolo_error_code;

/* "bad_request", ...; NULL for other values. */
const char *memcolo_error_code_name(int code);

/* A decoded message: its meaning with defaults filled in. */
typedef struct memcolo_msg memcolo_msg;

typedef enum { MEMCOLO_REQUEST = 0, MEMCOLO_REPLY = 1 } memcolo_direction;

/* Decodes one line (a trailing "\n" or "\r\n" is allowed) sent in `direction`.
 * Returns 0 and *out (free with memcolo_msg_free), or a memcolo_error_code
 * (MEMCOLO_E_BAD_REQUEST or MEMCOLO_E_UNSUPPORTED_VERSION) with a message in err. */
int memcolo_decode(memcolo_direction direction, const char *line, size_t len, memcolo_msg **out,
                   char *err, size_t errlen);
void memcolo_msg_free(memcolo_msg *msg);
/* The message's "type" ("notify", "registered", ...). */
const char *memcolo_msg_type(const memcolo_msg *msg);
/* An unsigned integer field; 0 on success, -1 if absent. */
int memcolo_msg_u64(const memcolo_msg *msg, const char *field, uint64_t *out);
/* A string field (NUL-terminated UTF-8), or NULL if absent. */
const char *memcolo_msg_str(const memcolo_msg *msg, const char *field);
/* The message's meaning as compact JSON (malloc'd), as in sdk/testvectors. */
char *memcolo_msg_json(const memcolo_msg *msg);
/* Encodes a message given as its meaning in JSON into one line, newline included
 * (malloc'd), byte-identical to the reference implementation; NULL if the
 * meaning breaks the schema. */
char *memcolo_encode_json(memcolo_direction direction, const char *meaning_json);

/* ---- allow-rate gate (M3 §4.2) ------------------------------------------ */

/* r = min(time since last high signal / (epoch * num_epochs), 1), where epoch is
 * the time the handlers took for that signal, but at least the minimum epoch
 * (MEMCOLO_DEFAULT_MIN_EPOCH_NS); r = 0 from the first high signal until its
 * handling ends. Only every floor(1/r)-th allocation is admitted; the others evict
 * first. Thread-safe.
 *
 * Why a minimum epoch: M3 ends the epoch "when memory has been returned", and memory
 * counts as returned for the node when the monitor sees it, at its next poll. A
 * handler that returns in a few ms would otherwise reopen the gate before that poll
 * has even seen the node leave the red zone, and the application would regrow at
 * once (bench/m3: epochs of ~11-15 ms put r back at 100 % within one agent poll). */
typedef struct memcolo_gate memcolo_gate;

memcolo_gate *memcolo_gate_new(unsigned num_epochs); /* NULL on ENOMEM */
void memcolo_gate_free(memcolo_gate *gate);
uint64_t memcolo_now_ns(void); /* CLOCK_MONOTONIC */
void memcolo_gate_signal_received(memcolo_gate *gate, uint64_t now_ns);
void memcolo_gate_signal_handled(memcolo_gate *gate, uint64_t now_ns);
/* Sets the shortest epoch in ns (0: the handling time alone, M3 §4.2 to the letter);
 * applies from the next handled signal. */
void memcolo_gate_set_min_epoch_ns(memcolo_gate *gate, uint64_t min_epoch_ns);
/* Epoch of the last handled signal in ns (at least the minimum); -1 if none. */
int64_t memcolo_gate_epoch_ns(memcolo_gate *gate);
double memcolo_gate_allow_rate(memcolo_gate *gate, uint64_t now_ns);
/* 1: this allocation proceeds at once; 0: evict first. */
int memcolo_gate_admit(memcolo_gate *gate, uint64_t now_ns);
/* Calls evict(arg) unless admitted now; returns 1 if it evicted. */
int memcolo_gate_before_alloc(memcolo_gate *gate, void (*evict)(void *arg), void *arg);

/* ---- client --------------------------------------------------------------- */

typedef struct {
  uint64_t seq;          /* echoed in the answer */
  memcolo_level level;
  uint64_t target_bytes; /* about how much to give back */
} memcolo_notification;

/* A handler gives memory back and stores the bytes it gave back in *reclaimed_bytes.
 * Returns 0 on success, non-zero on failure (reported to the agent as ok=false).
 * C++ callers must not let exceptions escape a handler. */
typedef int (*memcolo_handler)(const memcolo_notification *n, uint64_t *reclaimed_bytes, void *arg);

typedef void (*memcolo_log_fn)(const char *message, void *arg);

typedef struct {
  const char *socket_path;        /* NULL: $MEMCOLO_SOCKET, then the default */
  const char *class_name;         /* "elastic" (default), "be" or "lc" */
  const char *name;               /* optional */
  int has_expected_reclaim_bytes; /* whether to send expected_reclaim_bytes */
  uint64_t expected_reclaim_bytes;
  uint32_t handler_timeout_ms;    /* default 10000 */
  uint32_t backoff_min_ms;        /* default 100 */
  uint32_t backoff_max_ms;        /* default 5000 */
  unsigned num_epochs;            /* of the gate; default 5 */
  memcolo_log_fn log;             /* NULL: stderr */
  void *log_arg;
} memcolo_client_config;

typedef struct memcolo_client memcolo_client;

void memcolo_client_config_init(memcolo_client_config *cfg);
/* NULL with errno EINVAL for a bad config (unknown class), ENOMEM. Does not
 * connect yet. */
memcolo_client *memcolo_client_new(const memcolo_client_config *cfg);
/* Adds a handler as the next (lower) layer for level; before starting. 0 or -1. */
int memcolo_client_on(memcolo_client *c, memcolo_level level, memcolo_handler h, void *arg);
/* hook(arg) runs after each re-registration following a lost connection. */
void memcolo_client_on_reconnect(memcolo_client *c, void (*hook)(void *arg), void *arg);

/* Event-loop mode. The socket (nonblocking), or -1 while disconnected. */
int memcolo_client_fd(const memcolo_client *c);
/* Milliseconds until memcolo_client_process() should run even without input
 * (a reconnect attempt is due), -1 if only when the fd is readable. */
int memcolo_client_next_timeout_ms(const memcolo_client *c);
/* Connects if due, reads what is available, runs handlers, answers. Never
 * blocks on the agent beyond a 1 s send timeout. Returns 0. */
int memcolo_client_process(memcolo_client *c);

/* Background-thread mode: 0, or an errno value. */
int memcolo_client_start_thread(memcolo_client *c);
/* Stops the thread (if any), closes the connection and frees the client. */
void memcolo_client_free(memcolo_client *c);

int memcolo_client_registered(const memcolo_client *c);
uint64_t memcolo_client_registrations(const memcolo_client *c);
uint64_t memcolo_client_notifications(const memcolo_client *c);
uint64_t memcolo_client_failed_notifications(const memcolo_client *c);
memcolo_gate *memcolo_client_gate(memcolo_client *c);

/* ---- runtime layer ------------------------------------------------------- */

/* RSS of this process in bytes (/proc/self/statm), 0 if unknown. */
uint64_t memcolo_rss_bytes(void);
/* A handler: glibc malloc_trim(0); reports the drop in RSS. Add it last. */
int memcolo_malloc_trim_layer(const memcolo_notification *n, uint64_t *reclaimed_bytes, void *arg);

#ifdef __cplusplus
}
#endif
#endif
