/* internal.h: declarations shared by libmemcolo-client's files.
 *   json.c      strict JSON document model (json.h)
 *   protocol.c  schema-checked decoding/encoding of protocol v1
 *   gate.c      allow-rate gate (M3 §4.2)
 *   client.c    connection, registration, notification handling, runtime layer */
#ifndef MEMCOLO_INTERNAL_H
#define MEMCOLO_INTERNAL_H

#include "memcolo/client.h"
#include "json.h"

/* Encodes the message m (its meaning) as a line with newline; malloc'd or NULL. */
char *memcolo__encode(memcolo_direction direction, const mj *m);

#endif
