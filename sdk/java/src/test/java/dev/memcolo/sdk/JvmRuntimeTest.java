package dev.memcolo.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.management.HotSpotDiagnosticMXBean;
import java.lang.management.ManagementFactory;
import org.junit.jupiter.api.Test;

class JvmRuntimeTest {
    @Test
    void highLowersSoftMaxHeapSizeAndItComesBack() throws Exception {
        HotSpotDiagnosticMXBean hs = ManagementFactory.getPlatformMXBean(HotSpotDiagnosticMXBean.class);
        long orig = Long.parseLong(hs.getVMOption("SoftMaxHeapSize").getValue());
        AllowRateGate gate = new AllowRateGate(1);
        JvmRuntime rt = new JvmRuntime(gate, 1 << 20);
        gate.signalReceived(System.nanoTime());
        rt.high(new Notification(1, "high", 1L << 20));
        gate.signalHandled(System.nanoTime());
        long shrunk = rt.lastShrunkSoftMaxHeapBytes();
        assertTrue(shrunk > 0 && shrunk < orig, "SoftMaxHeapSize not lowered: " + shrunk + " of " + orig);
        long deadline = System.currentTimeMillis() + 20_000;
        while (rt.shrunkSoftMaxHeapBytes() != -1) {
            assertTrue(System.currentTimeMillis() < deadline, "never restored");
            Thread.sleep(20);
        }
        assertEquals(orig, Long.parseLong(hs.getVMOption("SoftMaxHeapSize").getValue()));
        assertTrue(JvmRuntime.rssBytes() > 0);
    }
}
