package dev.memcolo.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared allow-rate gate vectors (sdk/testvectors/gate.json, generated from the Rust
 * SDK's gate): every case replayed on {@link AllowRateGate} with a synthetic clock (the
 * file's nanoseconds are this gate's).
 */
class GateVectorsTest {
    private static long num(Object o) {
        return ((Number) o).longValue();
    }

    @SuppressWarnings("unchecked")
    @TestFactory
    Stream<DynamicTest> gateVectors() throws Exception {
        List<Object> cases = (List<Object>) VectorsTest.load("gate.json").get("cases");
        assertFalse(cases.isEmpty(), "gate.json has no cases");
        return cases.stream().map(o -> {
            Map<String, Object> c = (Map<String, Object>) o;
            String name = (String) c.get("name");
            return DynamicTest.dynamicTest(name, () -> replay(name, c));
        });
    }

    @SuppressWarnings("unchecked")
    private static void replay(String name, Map<String, Object> c) {
        AllowRateGate g = new AllowRateGate((int) num(c.get("num_epochs")),
                num(c.get("min_epoch_ns")), () -> 0L);
        List<Object> steps = (List<Object>) c.get("steps");
        for (int i = 0; i < steps.size(); i++) {
            Map<String, Object> s = (Map<String, Object>) steps.get(i);
            String where = name + " step " + i + " " + Json.write(s);
            String op = (String) s.get("op");
            switch (op) {
                case "signal":
                    if (!"low".equals(s.get("level"))) {
                        g.signalReceived(num(s.get("t_ns")));
                    }
                    break;
                case "handled":
                    if (!"low".equals(s.get("level"))) {
                        g.signalHandled(num(s.get("t_ns")));
                    }
                    break;
                case "rate":
                    assertEquals(((Number) s.get("rate")).doubleValue(),
                            g.allowRate(num(s.get("t_ns"))), 1e-12, where);
                    break;
                case "admit": {
                    List<Object> want = (List<Object>) s.get("admitted");
                    List<Object> got = new ArrayList<>();
                    for (int k = 0; k < want.size(); k++) {
                        got.add(g.admit(num(s.get("t_ns"))));
                    }
                    assertEquals(want, got, where);
                    break;
                }
                case "epoch": {
                    Object want = s.get("epoch_ns");
                    assertEquals(want == Json.NULL ? -1 : num(want), g.epochNs(), where);
                    break;
                }
                default:
                    assertTrue(false, "unknown op in " + where);
            }
        }
    }
}
