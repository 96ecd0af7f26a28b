// The JVM job of the M3 benchmark (bench/m3): an iterative analytics job on the JVM
// in the manner of Spark's k-means/PageRank over a cached RDD (M3, EuroSys'21 §7.1.1),
// with a block cache as the upper memory layer and the JVM (G1) as the lower one.
//
// The data set is `--partitions` partitions of `--partition-mib` MiB. Each of `--iters`
// iterations visits every partition in order: a cached partition is scanned in memory;
// a missing one is read again (a modelled read: `--read-ms-per-mib` per MiB, slept, as
// the disk of this shared VM sits in the host's page cache), materialised on the heap,
// scanned, and kept in the cache if there is room. Every visit also takes `--task-ms`
// of task time that memory does not change (the rest of a Spark task's pipeline;
// modelled as a wait so that three jobs fit on this 2-core VM beside its other users). As Spark's MemoryStore, the cache
// never evicts blocks of the data set it is filling to make room for another of the
// same data set (that only thrashes a cyclic scan): a block that does not fit is
// dropped after use. The run time therefore falls with the number of cached blocks,
// i.e. with the memory the job holds.
//
//   static  (--cache-mib N > 0): at most N MiB of blocks, the job's own setting
//           (with -Xmx, what M3's Oracle tunes); no agent.
//   elastic (--cache-mib 0): the cache has no size; the job registers with
//           `memcolo agent` (sdk/java Client) and reclaims in layers (M3 §4.2, Table 1):
//           low: call down to the JVM only (a collection); high/top: evict 1/8 of the
//           blocks, least recently used first (M3 §6), then call down to the JVM
//           (JvmRuntime: SoftMaxHeapSize and heap free ratios lowered, collection, so
//           that G1 uncommits the freed regions). After a high signal the allow-rate
//           gate (M3 §4.2; NUM_epochs --num-epochs, default 1 as M3's Spark) admits
//           only every ⌊1/r⌋-th new block into the cache; the others are dropped
//           after use.
//
// Blocks are byte[] of one G1 region less the array header (run with
// -XX:G1HeapRegionSize=2m): humongous objects, never copied by young collections and
// reclaimed eagerly when dropped.
//
// Every --report-ms it prints a JSON line {"t_s", "useful_bytes", "heap_committed_bytes",
// "rss_bytes", "done_frac", ...}; at the end {"done": true, "elapsed_s", ...}.

import dev.memcolo.sdk.AllowRateGate;
import dev.memcolo.sdk.Client;
import dev.memcolo.sdk.JvmRuntime;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.Arrays;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.locks.LockSupport;

public final class IterJob {
    static final int ARRAY_BYTES = (2 << 20) - 64; // one 2 MiB G1 region, humongous

    final int partitions;
    final int arraysPerPartition;
    final int iters;
    final double readMsPerMib;
    final double taskMs;
    final long cacheBytes; // 0: elastic
    final LinkedHashMap<Integer, byte[][]> cache = new LinkedHashMap<>(1024, 0.75f, true);
    long cachedBytes;
    long hits, misses, rejected, evictedBySignal;
    volatile long visited;
    long checksum;
    Client client;

    IterJob(int partitions, int partitionMib, int iters, double readMsPerMib, double taskMs, long cacheBytes) {
        this.taskMs = taskMs;
        this.partitions = partitions;
        this.arraysPerPartition = Math.max(1, partitionMib / 2);
        this.iters = iters;
        this.readMsPerMib = readMsPerMib;
        this.cacheBytes = cacheBytes;
    }

    long partitionBytes() {
        return (long) arraysPerPartition * ARRAY_BYTES;
    }

    synchronized byte[][] lookup(int p) {
        byte[][] b = cache.get(p);
        if (b != null) {
            hits++;
        } else {
            misses++;
        }
        return b;
    }

    /** Keeps a freshly read block if there is room (static) or the gate admits it (elastic). */
    synchronized void offer(int p, byte[][] block, AllowRateGate gate) {
        long n = partitionBytes();
        boolean keep;
        if (cacheBytes > 0) {
            keep = cachedBytes + n <= cacheBytes;
        } else {
            keep = gate == null || gate.admit();
        }
        if (keep) {
            cache.put(p, block);
            cachedBytes += n;
        } else {
            rejected++;
        }
    }

    /** Upper layer on high/top: evict ⌈1/8⌉ of the blocks, LRU first (M3 §6). */
    synchronized long evictEighth() {
        int n = (cache.size() + 7) / 8;
        long freed = 0;
        Iterator<Map.Entry<Integer, byte[][]>> it = cache.entrySet().iterator();
        for (int i = 0; i < n && it.hasNext(); i++) {
            it.next();
            it.remove();
            freed += partitionBytes();
        }
        cachedBytes -= freed;
        evictedBySignal += n;
        return freed;
    }

    static void waitUntil(long untilNs) {
        for (long left; (left = untilNs - System.nanoTime()) > 0; ) {
            LockSupport.parkNanos(left);
        }
    }

    byte[][] read(int p) {
        long sleepNs = (long) (readMsPerMib * partitionBytes() / (1 << 20) * 1e6);
        long until = System.nanoTime() + sleepNs;
        byte[][] b = new byte[arraysPerPartition][];
        for (int i = 0; i < arraysPerPartition; i++) {
            b[i] = new byte[ARRAY_BYTES];
            Arrays.fill(b[i], (byte) (p + i));
        }
        waitUntil(until);
        return b;
    }

    void scan(byte[][] b) {
        long s = 0;
        for (byte[] a : b) {
            for (int i = 0; i < a.length; i += 64) {
                s += a[i];
            }
        }
        checksum += s;
    }

    void run() {
        AllowRateGate gate = client == null ? null : client.gate();
        for (int it = 0; it < iters; it++) {
            for (int p = 0; p < partitions; p++) {
                long taskEnd = System.nanoTime() + (long) (taskMs * 1e6);
                byte[][] b = lookup(p);
                if (b == null) {
                    long readStart = System.nanoTime();
                    b = read(p);
                    taskEnd += System.nanoTime() - readStart; // the task time adds to the read
                    offer(p, b, gate);
                }
                scan(b);
                waitUntil(taskEnd);
                visited++;
            }
        }
    }

    static long gcCount() {
        long n = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            n += Math.max(0, gc.getCollectionCount());
        }
        return n;
    }

    static long gcTimeMs() {
        long n = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            n += Math.max(0, gc.getCollectionTime());
        }
        return n;
    }

    String report(long startNs, boolean done) {
        long hitsNow, missesNow, cached;
        synchronized (this) {
            hitsNow = hits;
            missesNow = misses;
            cached = cachedBytes;
        }
        var heap = ManagementFactory.getMemoryMXBean().getHeapMemoryUsage();
        StringBuilder sb = new StringBuilder();
        sb.append(String.format(Locale.ROOT,
                "{\"t_s\":%.3f,\"useful_bytes\":%d,\"heap_committed_bytes\":%d,\"heap_used_bytes\":%d,"
                        + "\"rss_bytes\":%d,\"done_frac\":%.5f,\"hits\":%d,\"misses\":%d,\"rejected\":%d,"
                        + "\"evicted_by_signal\":%d,\"gc_count\":%d,\"gc_time_ms\":%d",
                (System.nanoTime() - startNs) / 1e9, cached, heap.getCommitted(), heap.getUsed(),
                JvmRuntime.rssBytes(), (double) visited / ((long) partitions * iters), hitsNow, missesNow,
                rejected, evictedBySignal, gcCount(), gcTimeMs()));
        if (client != null) {
            sb.append(String.format(Locale.ROOT,
                    ",\"allow_rate\":%.3f,\"notifications\":%d,\"failed_notifications\":%d,\"registered\":%b",
                    client.gate().allowRate(), client.notifications(), client.failedNotifications(),
                    client.registered()));
        }
        if (done) {
            sb.append(String.format(Locale.ROOT, ",\"done\":true,\"elapsed_s\":%.3f,\"checksum\":%d",
                    (System.nanoTime() - startNs) / 1e9, checksum));
        }
        return sb.append('}').toString();
    }

    public static void main(String[] args) throws Exception {
        long startNs = System.nanoTime();
        int partitions = 256, partitionMib = 4, iters = 10, reportMs = 500, numEpochs = 1;
        double readMsPerMib = 8, taskMs = 12;
        long cacheMib = 0;
        String name = "iterjob";
        for (int i = 0; i + 1 < args.length; i += 2) {
            String v = args[i + 1];
            switch (args[i]) {
                case "--partitions": partitions = Integer.parseInt(v); break;
                case "--partition-mib": partitionMib = Integer.parseInt(v); break;
                case "--iters": iters = Integer.parseInt(v); break;
                case "--read-ms-per-mib": readMsPerMib = Double.parseDouble(v); break;
                case "--task-ms": taskMs = Double.parseDouble(v); break;
                case "--cache-mib": cacheMib = Long.parseLong(v); break;
                case "--name": name = v; break;
                case "--num-epochs": numEpochs = Integer.parseInt(v); break;
                case "--report-ms": reportMs = Integer.parseInt(v); break;
                default: throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }
        IterJob job = new IterJob(partitions, partitionMib, iters, readMsPerMib, taskMs, cacheMib << 20);
        if (cacheMib == 0) {
            job.client = Client.builder().name(name).expectedReclaimBytes(64L << 20)
                    .gate(new AllowRateGate(numEpochs))
                    .on(Client.Level.HIGH, n -> job.evictEighth())
                    .on(Client.Level.TOP, n -> job.evictEighth())
                    .build();
            JvmRuntime.install(job.client); // the layer below the cache: low = collection only
            job.client.start();
        }
        final int period = reportMs;
        Thread reporter = new Thread(() -> {
            while (true) {
                try {
                    Thread.sleep(period);
                } catch (InterruptedException e) {
                    return;
                }
                System.out.println(job.report(startNs, false));
                System.out.flush();
            }
        }, "report");
        reporter.setDaemon(true);
        reporter.start();
        job.run();
        reporter.interrupt();
        reporter.join();
        System.out.println(job.report(startNs, true));
        System.out.flush();
        if (job.client != null) {
            job.client.close();
        }
    }
}
