package dev.memcolo.sdk;

import com.sun.management.HotSpotDiagnosticMXBean;
import java.io.IOException;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.logging.Logger;

/**
 * The JVM as the lower reclamation layer (M3 §4.1-4.2), with the JVM's own,
 * documented knobs:
 *
 * <ul>
 *   <li>{@code low}: {@link System#gc()}. With {@code -XX:+ExplicitGCInvokesConcurrent}
 *       (G1) this is a concurrent cycle rather than a stop-the-world full GC; no public
 *       API runs a young-only collection.
 *   <li>{@code high}/{@code top}: lower the manageable flag {@code SoftMaxHeapSize} to
 *       the committed heap minus the target (never under {@link #floorBytes}), which ZGC
 *       and Shenandoah honour by collecting and uncommitting down to it; lower
 *       {@code MaxHeapFreeRatio}/{@code MinHeapFreeRatio} so G1 shrinks the heap at the
 *       collection; then {@link System#gc()}. The flags come back to their old values
 *       along the allow rate of the client's {@link AllowRateGate} (M3 §4.2).
 * </ul>
 *
 * <p>JVM flags that make the JVM return memory to the OS:
 * G1: {@code -XX:+UseG1GC -XX:G1PeriodicGCInterval=<ms>} (JEP 346: periodic collections
 * that uncommit idle heap) and {@code -XX:+ExplicitGCInvokesConcurrent};
 * ZGC: {@code -XX:+UseZGC -XX:SoftMaxHeapSize=<size> -XX:ZUncommitDelay=<s>};
 * Shenandoah: {@code -XX:+UseShenandoahGC -XX:ShenandoahUncommitDelay=<ms>}. Always
 * leave {@code -Xmx} above {@code -Xms} so that there is something to give back.
 *
 * <p>Handlers report the drop in the process's RSS ({@code /proc/self/statm}) in bytes.
 */
public final class JvmRuntime {
    private static final Logger LOG = Logger.getLogger("dev.memcolo.sdk");

    private final AllowRateGate gate;
    private final HotSpotDiagnosticMXBean hotspot;
    private final long floorBytes;
    private long origSoftMax = -1;
    private String origMaxFree;
    private String origMinFree;
    private long shrunkSoftMax = -1;
    private long lastShrunkSoftMax = -1;
    private boolean regrowing;

    /**
     * @param gate paces the regrowth of the heap flags (null: restore after 1 s)
     * @param floorBytes the lowest SoftMaxHeapSize ever set, in bytes
     */
    public JvmRuntime(AllowRateGate gate, long floorBytes) {
        this.gate = gate;
        this.floorBytes = floorBytes;
        this.hotspot = ManagementFactory.getPlatformMXBean(HotSpotDiagnosticMXBean.class);
    }

    /** Adds the JVM as the lowest layer of every level of {@code client}. */
    public static JvmRuntime install(Client client) {
        JvmRuntime rt = new JvmRuntime(client.gate(), 64L << 20);
        client.on(Client.Level.LOW, rt::low);
        client.on(Client.Level.HIGH, rt::high);
        client.on(Client.Level.TOP, rt::high);
        return rt;
    }

    /** RSS of this process in bytes, or -1 where procfs is unavailable. */
    public static long rssBytes() {
        try {
            String[] f = Files.readString(Path.of("/proc/self/statm")).trim().split("\\s+");
            return Long.parseLong(f[1]) * 4096L;
        } catch (IOException | RuntimeException e) {
            return -1;
        }
    }

    /** Collections run so far by all collectors. */
    public static long collectionCount() {
        long n = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            n += Math.max(0, gc.getCollectionCount());
        }
        return n;
    }

    private static long drop(long before, long after) {
        return before > 0 && after >= 0 && before > after ? before - after : 0;
    }

    /** Handler for low: a collection (see the class comment). */
    public long low(Notification n) {
        long before = rssBytes();
        System.gc();
        return drop(before, rssBytes());
    }

    /** Handler for high and top: shrink the heap's soft limits, then collect. */
    public long high(Notification n) {
        long before = rssBytes();
        long committed = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getCommitted();
        long target = Math.max(floorBytes, committed - Math.max(0, n.targetBytes()));
        boolean startRegrowth;
        synchronized (this) {
            if (shrunkSoftMax < 0) {
                origSoftMax = Long.parseLong(hotspot.getVMOption("SoftMaxHeapSize").getValue());
                origMaxFree = hotspot.getVMOption("MaxHeapFreeRatio").getValue();
                origMinFree = hotspot.getVMOption("MinHeapFreeRatio").getValue();
            }
            shrunkSoftMax = Math.min(target, origSoftMax);
            lastShrunkSoftMax = shrunkSoftMax;
            setQuietly("SoftMaxHeapSize", Long.toString(shrunkSoftMax));
            setQuietly("MinHeapFreeRatio", "0");
            setQuietly("MaxHeapFreeRatio", "10");
            startRegrowth = !regrowing;
            regrowing = true;
        }
        System.gc();
        if (startRegrowth) {
            Thread t = new Thread(this::regrow, "memcolo-jvm-regrow");
            t.setDaemon(true);
            t.start();
        }
        return drop(before, rssBytes());
    }

    /** The SoftMaxHeapSize set by the last high signal, -1 when none is active. */
    public synchronized long shrunkSoftMaxHeapBytes() {
        return shrunkSoftMax;
    }

    /** The SoftMaxHeapSize the last high signal set, -1 if none ever did. */
    public synchronized long lastShrunkSoftMaxHeapBytes() {
        return lastShrunkSoftMax;
    }

    private void setQuietly(String flag, String value) {
        try {
            hotspot.setVMOption(flag, value);
        } catch (IllegalArgumentException | SecurityException e) {
            LOG.fine("cannot set " + flag + "=" + value + ": " + e.getMessage());
        }
    }

    private void regrow() {
        while (true) {
            try {
                Thread.sleep(100);
            } catch (InterruptedException e) {
                return;
            }
            double r = gate == null ? 1.0 : gate.allowRate();
            synchronized (this) {
                if (r >= 1.0) {
                    setQuietly("SoftMaxHeapSize", Long.toString(origSoftMax));
                    setQuietly("MaxHeapFreeRatio", origMaxFree);
                    setQuietly("MinHeapFreeRatio", origMinFree);
                    shrunkSoftMax = -1;
                    regrowing = false;
                    return;
                }
                setQuietly("SoftMaxHeapSize", Long.toString(shrunkSoftMax + (long) (r * (origSoftMax - shrunkSoftMax))));
            }
        }
    }
}
