package dev.memcolo.sdk;

import java.lang.instrument.Instrumentation;
import java.util.logging.Logger;

/**
 * A Java agent that makes any JVM service an elastic memcolo process without code
 * changes: {@code java -javaagent:memcolo-sdk-0.1.0.jar[=name=svc,socket=/path,numEpochs=5] ...}.
 * It registers the JVM with {@code memcolo agent} and installs {@link JvmRuntime}:
 * {@link System#gc()} on low and high, with SoftMaxHeapSize and the heap free ratios
 * lowered on high (see {@link JvmRuntime} for the JVM flags that make the JVM return
 * memory). With no agent running it stays idle and retries in the background.
 *
 * <p>Options (comma-separated {@code key=value}): {@code name} (default: the main
 * command), {@code socket}, {@code class} (default elastic), {@code expected} (bytes),
 * {@code numEpochs}, {@code timeoutMs}.
 */
public final class MemcoloAgent {
    private static final Logger LOG = Logger.getLogger("dev.memcolo.sdk");
    private static volatile Client client;

    private MemcoloAgent() {}

    public static void premain(String args, Instrumentation inst) {
        start(args);
    }

    public static void agentmain(String args, Instrumentation inst) {
        start(args);
    }

    /** The client the agent started, or null. */
    public static Client client() {
        return client;
    }

    static synchronized Client start(String args) {
        if (client != null) {
            return client;
        }
        Client.Builder b = Client.builder();
        int numEpochs = AllowRateGate.DEFAULT_NUM_EPOCHS;
        String name = System.getProperty("sun.java.command", "jvm").split(" ")[0];
        if (args != null && !args.isBlank()) {
            for (String kv : args.split(",")) {
                String[] p = kv.split("=", 2);
                if (p.length != 2) {
                    LOG.warning("memcolo agent option `" + kv + "` is not key=value; ignored");
                    continue;
                }
                try {
                    switch (p[0].trim()) {
                        case "name": name = p[1]; break;
                        case "socket": b.socketPath(p[1]); break;
                        case "class": b.cls(p[1]); break;
                        case "expected": b.expectedReclaimBytes(Long.parseLong(p[1])); break;
                        case "numEpochs": numEpochs = Integer.parseInt(p[1]); break;
                        case "timeoutMs": b.handlerTimeout(java.time.Duration.ofMillis(Long.parseLong(p[1]))); break;
                        default: LOG.warning("unknown memcolo agent option `" + p[0] + "`; ignored");
                    }
                } catch (IllegalArgumentException e) {
                    LOG.warning("bad memcolo agent option `" + kv + "`: " + e.getMessage() + "; ignored");
                }
            }
        }
        b.name(name).gate(new AllowRateGate(Math.max(1, numEpochs)));
        Client c = b.build();
        JvmRuntime.install(c);
        client = c.start();
        return client;
    }
}
