package dev.memcolo.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class AllowRateGateTest {
    static final long S = 1_000_000_000L;

    @Test
    void fullRateWithoutSignals() {
        AllowRateGate g = new AllowRateGate(5, () -> 100 * S);
        for (int k = 0; k < 50; k++) {
            assertTrue(g.admit());
        }
    }

    @Test
    void linearGrowthOverNumEpochs() {
        AllowRateGate g = new AllowRateGate(5);
        g.signalReceived(10 * S);
        assertEquals(0.0, g.allowRate(13 * S));
        assertFalse(g.admit(13 * S));
        g.signalHandled(12 * S); // epoch 2 s, window 10 s
        assertEquals(0.1, g.allowRate(11 * S), 1e-9);
        assertEquals(0.5, g.allowRate(15 * S), 1e-9);
        assertEquals(1.0, g.allowRate(21 * S));
        assertEquals(2 * S, g.epochNs());
    }

    @Test
    void onlyEveryFloorOneOverRthAllocationProceeds() {
        AllowRateGate g = new AllowRateGate(1);
        g.signalReceived(0);
        g.signalHandled(10 * S);
        boolean[] want = {false, false, false, true, false, false, false, true};
        for (boolean w : want) {
            assertEquals(w, g.admit(2_500_000_000L));
        }
    }

    @Test
    void beforeAllocEvictsRightAfterASignal() {
        long[] now = {0};
        AllowRateGate g = new AllowRateGate(5, () -> now[0]);
        int[] evicted = {0};
        assertFalse(g.beforeAlloc(() -> evicted[0]++));
        g.signalReceived(0);
        assertTrue(g.beforeAlloc(() -> evicted[0]++));
        assertEquals(1, evicted[0]);
        assertThrows(IllegalArgumentException.class, () -> new AllowRateGate(0));
    }

    @Test
    void fastHandlerIsHeldToTheMinimumEpoch() {
        // Handled in 11 ms, NUM_epochs 1: without a floor r would be 1 after 11 ms; with
        // the 1 s floor it is 0.2 at the next poll of an agent polling every 200 ms.
        AllowRateGate g = new AllowRateGate(1);
        g.signalReceived(0);
        g.signalHandled(11_000_000L);
        assertEquals(S, g.epochNs());
        assertEquals(0.2, g.allowRate(S / 5), 1e-9);
        boolean[] want = {false, false, false, false, true};
        for (boolean w : want) {
            assertEquals(w, g.admit(S / 5));
        }
        assertEquals(1.0, g.allowRate(S));
        // Handling longer than the floor is the epoch itself.
        g.signalReceived(2 * S);
        g.signalHandled(5 * S);
        assertEquals(3 * S, g.epochNs());
    }

    @Test
    void zeroFloorIsThePaperToTheLetter() {
        AllowRateGate g = new AllowRateGate(1, 0, () -> 0L);
        g.signalReceived(0);
        g.signalHandled(11_000_000L);
        assertEquals(1.0, g.allowRate(11_000_000L));
        assertThrows(IllegalArgumentException.class, () -> new AllowRateGate(1, -1, () -> 0L));
    }
}
