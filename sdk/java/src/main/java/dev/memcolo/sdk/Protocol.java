package dev.memcolo.sdk;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Predicate;

/**
 * memcolo's wire protocol, version 1 (docs/protocol.md): one JSON object per line with
 * a version {@code "v"} and a {@code "type"}. A message is handled as its meaning: a map
 * with {@code "type"} and the fields of docs/protocol.md §5-6, defaults filled in
 * (unsigned 64-bit values and pids as {@link BigInteger}, sizes in bytes, durations in
 * ms). {@link #encode} writes exactly what the reference implementation (Rust
 * memcolo-proto) writes; the decoders validate as it does.
 */
public final class Protocol {
    public static final int VERSION = 1;
    public static final int MAX_LINE_BYTES = 64 * 1024;
    public static final String DEFAULT_SOCKET = "/run/memcolo/agent.sock";

    /** Which side sent a line. */
    public enum Direction { REQUEST, REPLY }

    private static final BigInteger U64_MAX = BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE);
    private static final BigInteger I32_MIN = BigInteger.valueOf(Integer.MIN_VALUE);
    private static final BigInteger I32_MAX = BigInteger.valueOf(Integer.MAX_VALUE);

    private static final Object REQUIRED = new Object();
    private static final Object OPTIONAL = new Object();

    private static final class Field {
        final String name;
        final Predicate<Object> check;
        final Object presence; // REQUIRED, OPTIONAL, or the default value

        Field(String name, Predicate<Object> check, Object presence) {
            this.name = name;
            this.check = check;
            this.presence = presence;
        }
    }

    private static final Predicate<Object> U64 =
            v -> v instanceof BigInteger && ((BigInteger) v).signum() >= 0 && ((BigInteger) v).compareTo(U64_MAX) <= 0;
    private static final Predicate<Object> PID =
            v -> v instanceof BigInteger && ((BigInteger) v).compareTo(I32_MIN) >= 0 && ((BigInteger) v).compareTo(I32_MAX) <= 0;
    private static final Predicate<Object> STR = v -> v instanceof String;
    private static final Predicate<Object> BOOL = v -> v instanceof Boolean;
    private static final Predicate<Object> ANY = v -> true;

    private static Predicate<Object> oneOf(String... values) {
        List<String> list = List.of(values);
        return v -> v instanceof String && list.contains(v);
    }

    private static final Predicate<Object> CLASS = oneOf("lc", "be", "elastic");
    private static final Predicate<Object> LEVEL = oneOf("low", "high", "top");

    private static final Map<String, List<Field>> REQUESTS = new LinkedHashMap<>();
    private static final Map<String, List<Field>> REPLIES = new LinkedHashMap<>();

    static {
        REQUESTS.put("register", List.of(
                new Field("pid", PID, OPTIONAL),
                new Field("class", CLASS, REQUIRED),
                new Field("name", STR, OPTIONAL),
                new Field("expected_reclaim_bytes", U64, OPTIONAL),
                new Field("notify", oneOf("socket", "signal", "none"), "socket")));
        REQUESTS.put("unregister", List.of(new Field("pid", PID, OPTIONAL)));
        REQUESTS.put("reclaimed", List.of(
                new Field("pid", PID, OPTIONAL),
                new Field("seq", U64, OPTIONAL),
                new Field("bytes", U64, REQUIRED),
                new Field("duration_ms", U64, REQUIRED),
                new Field("ok", BOOL, Boolean.TRUE)));
        REQUESTS.put("status", List.of());
        REQUESTS.put("cgroup", List.of(new Field("name", STR, REQUIRED)));
        REQUESTS.put("ping", List.of());
        REPLIES.put("ok", List.of());
        REPLIES.put("registered", List.of(new Field("pid", PID, REQUIRED), new Field("class", CLASS, REQUIRED)));
        REPLIES.put("cgroup", List.of(new Field("path", STR, REQUIRED)));
        REPLIES.put("pong", List.of(new Field("agent_version", STR, REQUIRED)));
        REPLIES.put("status", List.of(new Field("status", ANY, REQUIRED)));
        REPLIES.put("notify", List.of(
                new Field("seq", U64, REQUIRED),
                new Field("level", LEVEL, REQUIRED),
                new Field("target_bytes", U64, REQUIRED)));
        REPLIES.put("error", List.of(
                new Field("code", oneOf("bad_request", "unsupported_version", "permission_denied",
                        "no_such_process", "not_registered", "internal", "limit_exceeded"), REQUIRED),
                new Field("message", STR, REQUIRED)));
    }

    private Protocol() {}

    private static Map<String, List<Field>> schema(Direction d) {
        return d == Direction.REPLY ? REPLIES : REQUESTS;
    }

    /**
     * Encodes a message (its meaning) as one line, newline included.
     *
     * @throws IllegalArgumentException for a message that breaks the schema
     */
    public static String encode(Direction direction, Map<String, ?> msg) {
        Object type = msg.get("type");
        List<Field> fields = schema(direction).get(type);
        if (fields == null) {
            throw new IllegalArgumentException("unknown message type " + type);
        }
        StringBuilder out = new StringBuilder("{\"v\":").append(VERSION).append(",\"type\":");
        Json.quote(out, (String) type);
        for (Field f : fields) {
            Object v = msg.get(f.name);
            if (v instanceof Long || v instanceof Integer) {
                v = BigInteger.valueOf(((Number) v).longValue());
            }
            if (v == null || (v == Json.NULL && f.presence != REQUIRED)) {
                if (f.presence == REQUIRED) {
                    throw new IllegalArgumentException(type + ": missing field " + f.name);
                }
                if (f.presence == OPTIONAL) {
                    continue;
                }
                v = f.presence;
            }
            if (!f.check.test(v)) {
                throw new IllegalArgumentException(type + ": bad value for " + f.name + ": " + v);
            }
            out.append(',');
            Json.quote(out, f.name);
            out.append(':');
            Json.write(out, v);
        }
        return out.append("}\n").toString();
    }

    /** Decodes one line sent by the agent. */
    public static Map<String, Object> decodeReply(String line) throws ProtocolException {
        return decode(Direction.REPLY, line);
    }

    /** Decodes one line sent by a client. */
    public static Map<String, Object> decodeRequest(String line) throws ProtocolException {
        return decode(Direction.REQUEST, line);
    }

    /** Decodes one line (a trailing newline is allowed) sent in {@code direction}. */
    public static Map<String, Object> decode(Direction direction, String line) throws ProtocolException {
        int end = line.length();
        while (end > 0 && (line.charAt(end - 1) == '\n' || line.charAt(end - 1) == '\r')) {
            end--;
        }
        line = line.substring(0, end);
        int bytes = line.getBytes(StandardCharsets.UTF_8).length;
        if (bytes > MAX_LINE_BYTES) {
            throw new ProtocolException("bad_request", "line is " + bytes + " bytes, over the " + MAX_LINE_BYTES + "-byte limit");
        }
        Object parsed;
        try {
            parsed = Json.parse(line);
        } catch (IllegalArgumentException e) {
            throw new ProtocolException("bad_request", "malformed message: " + e.getMessage());
        }
        if (!(parsed instanceof Map)) {
            throw new ProtocolException("bad_request", "malformed message: not a JSON object");
        }
        @SuppressWarnings("unchecked")
        Map<String, Object> obj = (Map<String, Object>) parsed;
        if (!obj.containsKey("v")) {
            throw new ProtocolException("bad_request", "malformed message: missing `v`");
        }
        Object v = obj.get("v");
        if (!U64.test(v)) {
            throw new ProtocolException("bad_request", "malformed message: `v` is not an unsigned integer");
        }
        if (((BigInteger) v).compareTo(BigInteger.valueOf(VERSION)) > 0) {
            throw new ProtocolException("unsupported_version", "protocol version " + v + " is newer than " + VERSION);
        }
        Object type = obj.get("type");
        List<Field> fields = type instanceof String ? schema(direction).get(type) : null;
        if (fields == null) {
            throw new ProtocolException("bad_request", "malformed message: unknown type " + Json.write(type == null ? Json.NULL : type));
        }
        Map<String, Object> msg = new LinkedHashMap<>();
        msg.put("type", type);
        for (Field f : fields) {
            Object val = obj.get(f.name);
            if (val == null || (val == Json.NULL && f.presence == OPTIONAL)) {
                if (f.presence == REQUIRED) {
                    throw new ProtocolException("bad_request", "malformed message: missing field `" + f.name + "`");
                }
                if (f.presence == OPTIONAL) {
                    continue;
                }
                val = f.presence;
            } else if (!f.check.test(val)) {
                throw new ProtocolException("bad_request", "malformed message: bad value for `" + f.name + "`");
            }
            msg.put(f.name, val);
        }
        return msg;
    }
}
