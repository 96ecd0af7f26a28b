"""memcolo's wire protocol, version 1: versioned JSON lines (docs/protocol.md).

Messages are plain dicts with a ``"type"`` key and the fields of docs/protocol.md §5-6
(sizes in bytes, durations in ms). :func:`encode` writes the exact bytes the reference
implementation (Rust ``memcolo-proto``) writes; :func:`decode_reply` and
:func:`decode_request` validate like it and raise :class:`ProtocolError` with the
error code a receiver answers with (``bad_request`` or ``unsupported_version``).
"""

import json

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 64 * 1024
DEFAULT_SOCKET = "/run/memcolo/agent.sock"

CLASSES = ("lc", "be", "elastic")
LEVELS = ("low", "high", "top")
NOTIFY_MODES = ("socket", "signal", "none")
ERROR_CODES = (
    "bad_request",
    "unsupported_version",
    "permission_denied",
    "no_such_process",
    "not_registered",
    "internal",
    "limit_exceeded",
)

_U64_MAX = (1 << 64) - 1
_REQUIRED = object()
_OPTIONAL = object()


class ProtocolError(ValueError):
    """A line that cannot be decoded. ``code`` is the protocol error code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _u64(v):
    return type(v) is int and 0 <= v <= _U64_MAX


def _pid(v):
    return type(v) is int and -(1 << 31) <= v < (1 << 31)


def _str(v):
    return isinstance(v, str)


def _bool(v):
    return isinstance(v, bool)


def _one_of(values):
    return lambda v: isinstance(v, str) and v in values


def _any(v):
    return True


# (field, check, default) in encoding order. _REQUIRED: must be present;
# _OPTIONAL: may be absent or null, left out when absent; anything else: the default.
REQUESTS = {
    "register": [
        ("pid", _pid, _OPTIONAL),
        ("class", _one_of(CLASSES), _REQUIRED),
        ("name", _str, _OPTIONAL),
        ("expected_reclaim_bytes", _u64, _OPTIONAL),
        ("notify", _one_of(NOTIFY_MODES), "socket"),
    ],
    "unregister": [("pid", _pid, _OPTIONAL)],
    "reclaimed": [
        ("pid", _pid, _OPTIONAL),
        ("seq", _u64, _OPTIONAL),
        ("bytes", _u64, _REQUIRED),
        ("duration_ms", _u64, _REQUIRED),
        ("ok", _bool, True),
    ],
    "status": [],
    "cgroup": [("name", _str, _REQUIRED)],
    "ping": [],
}

REPLIES = {
    "ok": [],
    "registered": [("pid", _pid, _REQUIRED), ("class", _one_of(CLASSES), _REQUIRED)],
    "cgroup": [("path", _str, _REQUIRED)],
    "pong": [("agent_version", _str, _REQUIRED)],
    "status": [("status", _any, _REQUIRED)],
    "notify": [
        ("seq", _u64, _REQUIRED),
        ("level", _one_of(LEVELS), _REQUIRED),
        ("target_bytes", _u64, _REQUIRED),
    ],
    "error": [("code", _one_of(ERROR_CODES), _REQUIRED), ("message", _str, _REQUIRED)],
}


def _schema_for(msg):
    t = msg.get("type")
    if t in REQUESTS:
        return REQUESTS[t]
    if t in REPLIES:
        return REPLIES[t]
    raise ValueError("unknown message type %r" % (t,))


def encode(msg, schema=None):
    """Encodes a message dict as one line, newline included (a ``str``).

    ``schema`` picks the direction for the one type name both directions share
    (``cgroup``, ``status``): pass :data:`REQUESTS` or :data:`REPLIES`; by default
    requests win. Raises ``ValueError`` for a message that breaks the schema.
    """
    t = msg.get("type")
    fields = (schema or {}).get(t) if schema else None
    if fields is None:
        fields = _schema_for(msg)
    out = {"v": PROTOCOL_VERSION, "type": t}
    for name, check, default in fields:
        value = msg.get(name)
        if value is None:
            if default is _REQUIRED:
                raise ValueError("%s: missing field %r" % (t, name))
            if default is _OPTIONAL:
                continue
            value = default
        if not check(value):
            raise ValueError("%s: bad value for %r: %r" % (t, name, value))
        out[name] = value
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False) + "\n"


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def _decode(line, schema):
    if isinstance(line, (bytes, bytearray)):
        try:
            line = bytes(line).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError("bad_request", "not UTF-8: %s" % e)
    line = line.rstrip("\r\n")
    n = len(line.encode("utf-8", "surrogatepass"))
    if n > MAX_LINE_BYTES:
        raise ProtocolError(
            "bad_request", "line is %d bytes, over the %d-byte limit" % (n, MAX_LINE_BYTES)
        )
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except ValueError as e:
        raise ProtocolError("bad_request", "malformed message: %s" % e)
    if not isinstance(obj, dict):
        raise ProtocolError("bad_request", "malformed message: not a JSON object")
    if "v" not in obj:
        raise ProtocolError("bad_request", "malformed message: missing `v`")
    v = obj["v"]
    if not _u64(v):
        raise ProtocolError("bad_request", "malformed message: `v` is not an unsigned integer")
    if v > PROTOCOL_VERSION:
        raise ProtocolError(
            "unsupported_version",
            "protocol version %d is newer than %d" % (v, PROTOCOL_VERSION),
        )
    t = obj.get("type")
    if not isinstance(t, str) or t not in schema:
        raise ProtocolError("bad_request", "malformed message: unknown type %r" % (t,))
    msg = {"type": t}
    for name, check, default in schema[t]:
        value = obj.get(name)
        if value is None and (name not in obj or default is _OPTIONAL):
            if default is _REQUIRED:
                raise ProtocolError("bad_request", "malformed message: missing field `%s`" % name)
            if default is _OPTIONAL:
                continue
            value = default
        elif not check(value):
            raise ProtocolError(
                "bad_request", "malformed message: bad value for `%s`: %r" % (name, value)
            )
        msg[name] = value
    return msg


def decode_reply(line):
    """Decodes one line sent by the agent into a message dict."""
    return _decode(line, REPLIES)


def decode_request(line):
    """Decodes one line sent by a client into a message dict."""
    return _decode(line, REQUESTS)
