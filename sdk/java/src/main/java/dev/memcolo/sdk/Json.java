package dev.memcolo.sdk;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * A small strict JSON (RFC 8259) reader and writer, so that the SDK and its
 * {@code -javaagent} need no dependency. Values: {@link #NULL}, {@link Boolean},
 * {@link BigInteger} (integers, exact at any size), {@link BigDecimal} (numbers with a
 * fraction or exponent), {@link String}, {@link List}, {@link LinkedHashMap} (key order
 * kept; a duplicate key keeps the last value). Nesting is limited to 128 levels and
 * strings are escaped as serde_json does, so encodings match the reference
 * implementation byte for byte.
 */
public final class Json {
    /** JSON {@code null}. */
    public static final Object NULL = new Object() {
        @Override
        public String toString() {
            return "null";
        }
    };

    private static final int MAX_DEPTH = 128;

    private final String s;
    private int i;

    private Json(String s) {
        this.s = s;
    }

    /** Parses exactly one JSON value; throws {@link IllegalArgumentException} otherwise. */
    public static Object parse(String text) {
        Json p = new Json(text);
        Object v = p.value(0);
        p.ws();
        if (p.i != p.s.length()) {
            throw p.fail("trailing characters");
        }
        return v;
    }

    private IllegalArgumentException fail(String what) {
        return new IllegalArgumentException(what + " at offset " + i);
    }

    private void ws() {
        while (i < s.length()) {
            char c = s.charAt(i);
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                break;
            }
            i++;
        }
    }

    private void literal(String word) {
        if (!s.startsWith(word, i)) {
            throw fail("expected value");
        }
        i += word.length();
    }

    private Object value(int depth) {
        if (depth > MAX_DEPTH) {
            throw fail("recursion limit exceeded");
        }
        ws();
        if (i >= s.length()) {
            throw fail("EOF while parsing a value");
        }
        char c = s.charAt(i);
        switch (c) {
            case 'n':
                literal("null");
                return NULL;
            case 't':
                literal("true");
                return Boolean.TRUE;
            case 'f':
                literal("false");
                return Boolean.FALSE;
            case '"':
                return string();
            case '[': {
                i++;
                List<Object> list = new ArrayList<>();
                ws();
                if (i < s.length() && s.charAt(i) == ']') {
                    i++;
                    return list;
                }
                while (true) {
                    list.add(value(depth + 1));
                    ws();
                    if (i < s.length() && s.charAt(i) == ',') {
                        i++;
                    } else if (i < s.length() && s.charAt(i) == ']') {
                        i++;
                        return list;
                    } else {
                        throw fail("expected `,` or `]`");
                    }
                }
            }
            case '{': {
                i++;
                Map<String, Object> map = new LinkedHashMap<>();
                ws();
                if (i < s.length() && s.charAt(i) == '}') {
                    i++;
                    return map;
                }
                while (true) {
                    ws();
                    if (i >= s.length() || s.charAt(i) != '"') {
                        throw fail("key must be a string");
                    }
                    String key = string();
                    ws();
                    if (i >= s.length() || s.charAt(i) != ':') {
                        throw fail("expected `:`");
                    }
                    i++;
                    map.remove(key);
                    map.put(key, value(depth + 1));
                    ws();
                    if (i < s.length() && s.charAt(i) == ',') {
                        i++;
                    } else if (i < s.length() && s.charAt(i) == '}') {
                        i++;
                        return map;
                    } else {
                        throw fail("expected `,` or `}`");
                    }
                }
            }
            default:
                if (c == '-' || (c >= '0' && c <= '9')) {
                    return number();
                }
                throw fail("expected value");
        }
    }

    private boolean digit() {
        return i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9';
    }

    private Object number() {
        int start = i;
        boolean integral = true;
        if (s.charAt(i) == '-') {
            i++;
        }
        if (!digit()) {
            throw fail("invalid number");
        }
        if (s.charAt(i) == '0') {
            i++;
            if (digit()) {
                throw fail("leading zero");
            }
        } else {
            while (digit()) {
                i++;
            }
        }
        if (i < s.length() && s.charAt(i) == '.') {
            integral = false;
            i++;
            if (!digit()) {
                throw fail("invalid number");
            }
            while (digit()) {
                i++;
            }
        }
        if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
            integral = false;
            i++;
            if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) {
                i++;
            }
            if (!digit()) {
                throw fail("invalid number");
            }
            while (digit()) {
                i++;
            }
        }
        String text = s.substring(start, i);
        return integral ? new BigInteger(text) : new BigDecimal(text);
    }

    private int hex4() {
        if (i + 4 > s.length()) {
            throw fail("truncated \\u escape");
        }
        int v = 0;
        for (int k = 0; k < 4; k++) {
            int d = Character.digit(s.charAt(i++), 16);
            if (d < 0) {
                throw fail("bad \\u escape");
            }
            v = v * 16 + d;
        }
        return v;
    }

    private String string() {
        i++;
        StringBuilder b = new StringBuilder();
        while (true) {
            if (i >= s.length()) {
                throw fail("EOF while parsing a string");
            }
            char c = s.charAt(i++);
            if (c == '"') {
                return b.toString();
            }
            if (c < 0x20) {
                throw fail("control character in string");
            }
            if (c != '\\') {
                b.append(c);
                continue;
            }
            if (i >= s.length()) {
                throw fail("EOF in escape");
            }
            char e = s.charAt(i++);
            switch (e) {
                case '"': b.append('"'); break;
                case '\\': b.append('\\'); break;
                case '/': b.append('/'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case 'n': b.append('\n'); break;
                case 'r': b.append('\r'); break;
                case 't': b.append('\t'); break;
                case 'u': {
                    int cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00) {
                        if (!s.startsWith("\\u", i)) {
                            throw fail("lone surrogate");
                        }
                        i += 2;
                        int lo = hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) {
                            throw fail("lone surrogate");
                        }
                        b.append((char) cp).append((char) lo);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        throw fail("lone surrogate");
                    } else {
                        b.append((char) cp);
                    }
                    break;
                }
                default:
                    throw fail("invalid escape");
            }
        }
    }

    /** Appends the compact JSON of {@code v} to {@code out}. */
    public static void write(StringBuilder out, Object v) {
        if (v == null || v == NULL) {
            out.append("null");
        } else if (v instanceof Boolean || v instanceof BigInteger || v instanceof Long || v instanceof Integer) {
            out.append(v);
        } else if (v instanceof BigDecimal) {
            out.append(((BigDecimal) v).toString());
        } else if (v instanceof String) {
            quote(out, (String) v);
        } else if (v instanceof List) {
            out.append('[');
            boolean first = true;
            for (Object x : (List<?>) v) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                write(out, x);
            }
            out.append(']');
        } else if (v instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                quote(out, (String) e.getKey());
                out.append(':');
                write(out, e.getValue());
            }
            out.append('}');
        } else {
            throw new IllegalArgumentException("not a JSON value: " + v.getClass());
        }
    }

    /** The compact JSON of {@code v}. */
    public static String write(Object v) {
        StringBuilder b = new StringBuilder();
        write(b, v);
        return b.toString();
    }

    /** Appends {@code s} as a JSON string literal, escaped like serde_json. */
    public static void quote(StringBuilder out, String s) {
        out.append('"');
        for (int k = 0; k < s.length(); k++) {
            char c = s.charAt(k);
            switch (c) {
                case '"': out.append("\\\""); break;
                case '\\': out.append("\\\\"); break;
                case '\b': out.append("\\b"); break;
                case '\f': out.append("\\f"); break;
                case '\n': out.append("\\n"); break;
                case '\r': out.append("\\r"); break;
                case '\t': out.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        out.append('"');
    }

    /** Structural equality: maps as unordered maps, numbers by value. */
    public static boolean equal(Object a, Object b) {
        if (a instanceof Map && b instanceof Map) {
            Map<?, ?> x = (Map<?, ?>) a;
            Map<?, ?> y = (Map<?, ?>) b;
            if (!x.keySet().equals(y.keySet())) {
                return false;
            }
            for (Object k : x.keySet()) {
                if (!equal(x.get(k), y.get(k))) {
                    return false;
                }
            }
            return true;
        }
        if (a instanceof List && b instanceof List) {
            List<?> x = (List<?>) a;
            List<?> y = (List<?>) b;
            if (x.size() != y.size()) {
                return false;
            }
            for (int k = 0; k < x.size(); k++) {
                if (!equal(x.get(k), y.get(k))) {
                    return false;
                }
            }
            return true;
        }
        if (a instanceof BigDecimal && b instanceof BigDecimal) {
            return ((BigDecimal) a).compareTo((BigDecimal) b) == 0;
        }
        return Objects.equals(a, b);
    }
}
