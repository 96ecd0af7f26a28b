// An elastic LRU cache on the JVM beside `memcolo agent` (M3 §4): it fills itself
// with 64 KiB values up to a size (MiB, first argument); on low it drops 1 % of its
// entries, on high/top 4 % (at least the target), then calls down to the JVM
// (JvmRuntime: System.gc(), SoftMaxHeapSize); while the allow-rate gate (M3 §4.2)
// says so, a put first drops the oldest entry.
//
//   mvn -B -q -f sdk/java package -DskipTests
//   sudo memcolo agent &
//   java -XX:+UseG1GC -XX:G1PeriodicGCInterval=5000 -XX:+ExplicitGCInvokesConcurrent \
//        -cp sdk/java/target/memcolo-sdk-0.1.0.jar sdk/java/examples/ElasticCache.java 1024
//
// Any JVM service without code changes: java -javaagent:sdk/java/target/memcolo-sdk-0.1.0.jar=name=svc -jar svc.jar

import dev.memcolo.sdk.Client;
import dev.memcolo.sdk.JvmRuntime;
import java.util.LinkedHashMap;
import java.util.Map;

public class ElasticCache {
    static final int VALUE_BYTES = 64 << 10;
    static final LinkedHashMap<Long, byte[]> items = new LinkedHashMap<>(16, 0.75f, true);

    static synchronized long evict(int percent, long atLeastBytes) {
        long n = Math.max(items.size() * (long) percent / 100, (atLeastBytes + VALUE_BYTES - 1) / VALUE_BYTES);
        long freed = 0;
        var it = items.entrySet().iterator();
        for (long k = 0; k < n && it.hasNext(); k++) {
            it.next();
            it.remove();
            freed += VALUE_BYTES;
        }
        return freed;
    }

    static synchronized void put(long key, byte[] value) {
        items.put(key, value);
    }

    public static void main(String[] args) throws Exception {
        long maxMib = args.length > 0 ? Long.parseLong(args[0]) : 1024;
        Client client = Client.builder().name("jvm-elastic-cache").expectedReclaimBytes((maxMib << 20) / 25)
                .on(Client.Level.LOW, n -> evict(1, 0))
                .on(Client.Level.HIGH, n -> evict(4, n.targetBytes()))
                .on(Client.Level.TOP, n -> evict(4, n.targetBytes()))
                .build();
        JvmRuntime.install(client); // the layer below the cache
        client.start();
        for (long key = 0, tick = 0;; tick++) {
            synchronized (ElasticCache.class) {
                if ((long) items.size() * VALUE_BYTES < maxMib << 20) {
                    client.gate().beforeAlloc(() -> evict(0, VALUE_BYTES));
                    put(key++, new byte[VALUE_BYTES]);
                }
            }
            if (tick % 1000 == 0) {
                System.out.printf("entries %d, rss %d MiB, allow rate %.2f, registered %b, notifications %d%n",
                        items.size(), JvmRuntime.rssBytes() >> 20, client.gate().allowRate(), client.registered(),
                        client.notifications());
            }
            Thread.sleep(1);
        }
    }
}
