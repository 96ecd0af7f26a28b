package dev.memcolo.sdk;

import java.util.function.LongSupplier;

/**
 * The adaptive allocation protocol of M3 (EuroSys'21) §4.2: after a high signal only
 * every ⌊1/r⌋-th allocation proceeds at once; the others first run the application's
 * eviction callback (an allocation is never failed), with
 * {@code r = min(time since the last high signal / (epoch × NUM_epochs), 1)} and
 * epoch the time the application took to handle that signal, but at least a minimum
 * epoch. Until the first high signal has been handled there is no epoch and r = 0; a
 * later signal drops r to 0 at its receipt and r climbs with the previous epoch until its
 * handlers return. ⌊1/r⌋ is computed as ⌊window / elapsed⌋ in whole nanoseconds, so the
 * gate takes the decisions of the other SDKs and of libmemcolo on the same clock readings
 * ({@code sdk/testvectors/gate.json}).
 * Thread-safe; times are nanoseconds of {@link System#nanoTime()} unless given.
 *
 * <p>The minimum epoch ({@link #DEFAULT_MIN_EPOCH_NS}, 1 s) is one poll of M3's monitor
 * (§6) and of {@code memcolo agent} with its default {@code poll_ms}. M3 ends the epoch
 * "when memory has been returned", and memory counts as returned for the node when the
 * monitor sees it. A handler that returns in a few milliseconds (dropping cache blocks)
 * would otherwise reopen the gate before the next poll has even seen the node leave
 * the red zone, and the application would regrow at once (bench/m3: the JVM job's
 * epochs of ~11 ms put r back at 100 % within one agent poll).
 */
public final class AllowRateGate {
    /** NUM_epochs of M3's Go-Cache and Memcached (§4.2); Spark used 1. */
    public static final int DEFAULT_NUM_EPOCHS = 5;
    /** The shortest epoch a gate uses by default, ns (see the class comment). */
    public static final long DEFAULT_MIN_EPOCH_NS = 1_000_000_000L;

    private final int numEpochs;
    private final long minEpochNs;
    private final LongSupplier clockNs;
    private boolean hasSignal;
    private boolean hasEpoch;
    private long lastSignalNs;
    private long epochNs;
    private long count;

    public AllowRateGate() {
        this(DEFAULT_NUM_EPOCHS);
    }

    public AllowRateGate(int numEpochs) {
        this(numEpochs, System::nanoTime);
    }

    /** @throws IllegalArgumentException if numEpochs &lt; 1 */
    public AllowRateGate(int numEpochs, LongSupplier clockNs) {
        this(numEpochs, DEFAULT_MIN_EPOCH_NS, clockNs);
    }

    /**
     * @param minEpochNs the shortest epoch in ns (0: the handling time alone, M3 §4.2 to
     *     the letter)
     * @throws IllegalArgumentException if numEpochs &lt; 1 or minEpochNs &lt; 0
     */
    public AllowRateGate(int numEpochs, long minEpochNs, LongSupplier clockNs) {
        if (numEpochs < 1) {
            throw new IllegalArgumentException("numEpochs must be at least 1, got " + numEpochs);
        }
        if (minEpochNs < 0) {
            throw new IllegalArgumentException("minEpochNs must be >= 0, got " + minEpochNs);
        }
        this.numEpochs = numEpochs;
        this.minEpochNs = minEpochNs;
        this.clockNs = clockNs;
    }

    /** The shortest epoch this gate uses, ns. */
    public long minEpochNs() {
        return minEpochNs;
    }

    /** A high signal arrived at {@code nowNs}: the rate drops to 0. */
    public synchronized void signalReceived(long nowNs) {
        hasSignal = true;
        lastSignalNs = nowNs;
        count = 0;
    }

    /** The handlers of the last signal finished at {@code nowNs}. */
    public synchronized void signalHandled(long nowNs) {
        if (hasSignal) {
            epochNs = Math.max(minEpochNs, nowNs - lastSignalNs);
            hasEpoch = true;
        }
    }

    /** The epoch of the last handled signal in ns (at least the minimum), or -1. */
    public synchronized long epochNs() {
        return hasEpoch ? epochNs : -1;
    }

    /**
     * The time since the last signal and the window (epoch × NUM_epochs) in ns: {0, 0}
     * without a signal (full rate), {0, 1} while the first signal has no epoch yet (rate
     * 0). A window beyond the range of long saturates.
     */
    private long[] elapsedWindow(long nowNs) {
        if (!hasSignal) {
            return new long[] {0, 0};
        }
        if (!hasEpoch) {
            return new long[] {0, 1};
        }
        long window;
        try {
            window = Math.multiplyExact(epochNs, (long) numEpochs);
        } catch (ArithmeticException e) {
            window = Long.MAX_VALUE;
        }
        return new long[] {Math.max(0, nowNs - lastSignalNs), window};
    }

    /** The allow rate r in [0, 1] at {@code nowNs}. */
    public synchronized double allowRate(long nowNs) {
        long[] ew = elapsedWindow(nowNs);
        return ew[0] >= ew[1] ? 1.0 : (double) ew[0] / ew[1];
    }

    public double allowRate() {
        return allowRate(clockNs.getAsLong());
    }

    /** Whether an allocation at {@code nowNs} proceeds at once (r recomputed per call). */
    public synchronized boolean admit(long nowNs) {
        long[] ew = elapsedWindow(nowNs);
        if (ew[0] >= ew[1]) {
            count = 0;
            return true;
        }
        count++;
        if (ew[0] == 0) {
            return false;
        }
        if (count >= ew[1] / ew[0]) {
            count = 0;
            return true;
        }
        return false;
    }

    public boolean admit() {
        return admit(clockNs.getAsLong());
    }

    /** Runs {@code evict} unless this allocation is admitted; returns whether it ran. */
    public boolean beforeAlloc(Runnable evict) {
        if (admit()) {
            return false;
        }
        evict.run();
        return true;
    }
}
