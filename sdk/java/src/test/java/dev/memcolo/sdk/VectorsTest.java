package dev.memcolo.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.math.BigInteger;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.api.Test;

/** The shared protocol vectors (sdk/testvectors, generated from memcolo-proto). */
class VectorsTest {
    @SuppressWarnings("unchecked")
    static Map<String, Object> load(String file) throws Exception {
        Path dir = Path.of(System.getProperty("memcolo.vectors", "../testvectors"));
        return (Map<String, Object>) Json.parse(Files.readString(dir.resolve(file)));
    }

    @SuppressWarnings("unchecked")
    @ParameterizedTest
    @CsvSource({"requests.json,REQUEST", "replies.json,REPLY"})
    void vectorsMatch(String file, Protocol.Direction dir) throws Exception {
        Map<String, Object> v = load(file);
        assertEquals(BigInteger.valueOf(Protocol.VERSION), v.get("protocol_version"));
        assertEquals(BigInteger.valueOf(Protocol.MAX_LINE_BYTES), v.get("max_line_bytes"));
        for (Object o : (List<Object>) v.get("valid")) {
            Map<String, Object> c = (Map<String, Object>) o;
            String line = (String) c.get("line");
            Map<String, Object> msg = Protocol.decode(dir, line);
            assertTrue(Json.equal(c.get("message"), msg), c.get("name") + ": decoded " + Json.write(msg));
            if ((Boolean) c.get("canonical")) {
                assertEquals(line + "\n", Protocol.encode(dir, (Map<String, Object>) c.get("message")), (String) c.get("name"));
            }
        }
        for (Object o : (List<Object>) v.get("invalid")) {
            Map<String, Object> c = (Map<String, Object>) o;
            ProtocolException e = assertThrows(ProtocolException.class,
                    () -> Protocol.decode(dir, (String) c.get("line")), (String) c.get("name"));
            assertEquals(c.get("code"), e.code(), (String) c.get("name"));
        }
        Map<String, Object> t = (Map<String, Object>) v.get("too_long");
        String line = t.get("prefix") + ((String) t.get("fill")).repeat(((BigInteger) t.get("count")).intValue()) + t.get("suffix");
        assertEquals(t.get("code"), assertThrows(ProtocolException.class, () -> Protocol.decode(dir, line)).code());
    }

    @Test
    void encodeRejectsMessagesThatBreakTheSchema() {
        assertThrows(IllegalArgumentException.class,
                () -> Protocol.encode(Protocol.Direction.REQUEST, Map.of("type", "reclaimed", "bytes", -1L, "duration_ms", 0L)));
        assertThrows(IllegalArgumentException.class, () -> Protocol.encode(Protocol.Direction.REQUEST, Map.of("type", "register")));
    }
}
