package dev.memcolo.sdk;

import java.util.function.LongSupplier;

/**
 * The adaptive allocation protocol of M3 (EuroSys'21) §4.2: after a high signal only
 * every ⌊1/r⌋-th allocation proceeds at once; the others first run the application's
 * eviction callback (an allocation is never failed), with
 * {@code r = min(time since the last high signal / (epoch × NUM_epochs), 1)} and
 * epoch the time the application took to handle that signal. Until the first high
 * signal has been handled there is no epoch and r = 0. Thread-safe; times are
 * nanoseconds of {@link System#nanoTime()} unless given.
 */
public final class AllowRateGate {
    /** NUM_epochs of M3's Go-Cache and Memcached (§4.2); Spark used 1. */
    public static final int DEFAULT_NUM_EPOCHS = 5;

    private final int numEpochs;
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
        if (numEpochs < 1) {
            throw new IllegalArgumentException("numEpochs must be at least 1, got " + numEpochs);
        }
        this.numEpochs = numEpochs;
        this.clockNs = clockNs;
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
            epochNs = Math.max(0, nowNs - lastSignalNs);
            hasEpoch = true;
        }
    }

    /** The epoch of the last handled signal in ns, or -1. */
    public synchronized long epochNs() {
        return hasEpoch ? epochNs : -1;
    }

    private double rate(long nowNs) {
        if (!hasSignal) {
            return 1.0;
        }
        if (!hasEpoch) {
            return 0.0;
        }
        double window = (double) epochNs * numEpochs;
        if (window <= 0) {
            return 1.0;
        }
        return Math.min(Math.max(0, nowNs - lastSignalNs) / window, 1.0);
    }

    public synchronized double allowRate(long nowNs) {
        return rate(nowNs);
    }

    public double allowRate() {
        return allowRate(clockNs.getAsLong());
    }

    /** Whether an allocation at {@code nowNs} proceeds at once (r recomputed per call). */
    public synchronized boolean admit(long nowNs) {
        double r = rate(nowNs);
        if (r >= 1.0) {
            count = 0;
            return true;
        }
        count++;
        if (r <= 0.0) {
            return false;
        }
        long every = Math.max(1, (long) Math.floor(1.0 / r));
        if (count >= every) {
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
