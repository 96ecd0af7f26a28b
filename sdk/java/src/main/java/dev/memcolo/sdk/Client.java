package dev.memcolo.sdk;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.math.BigInteger;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Logger;

/**
 * A registered elastic application's link to {@code memcolo agent} (M3, EuroSys'21 §4).
 *
 * <p>One daemon thread connects to the agent's Unix socket ({@code $MEMCOLO_SOCKET} or
 * {@value Protocol#DEFAULT_SOCKET}), registers, and for every {@code notify} runs the
 * handlers of its level on a handler thread, upper layer first (the application, then
 * its runtime, e.g. {@link JvmRuntime}: M3 §3-4), then answers {@code reclaimed} with
 * the notification's seq, the bytes given back and the time taken. A handler that
 * throws or overruns the handler timeout is reported with {@code ok: false}. When the
 * agent goes away the client reconnects with exponential backoff; with no agent at all
 * it retries quietly and never throws to the application. Lines it cannot decode are
 * logged once per kind and ignored.
 *
 * <pre>{@code
 * Client client = Client.builder().name("cache").expectedReclaimBytes(256L << 20)
 *     .on(Client.Level.HIGH, n -> cache.evict(n.targetBytes()))
 *     .build();
 * JvmRuntime.install(client);   // lower layer: GC + SoftMaxHeapSize
 * client.start();
 * }</pre>
 */
public final class Client implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger("dev.memcolo.sdk");

    /** Environment variable that overrides the socket path. */
    public static final String SOCKET_ENV = "MEMCOLO_SOCKET";

    /** Notification levels (M3 §3, §5). */
    public enum Level {
        LOW, HIGH, TOP;

        public String wire() {
            return name().toLowerCase();
        }

        static Level of(String wire) {
            return valueOf(wire.toUpperCase());
        }
    }

    private final Path socketPath;
    private final String cls;
    private final String name;
    private final Long expectedReclaimBytes;
    private final Duration handlerTimeout;
    private final Duration backoffMin;
    private final Duration backoffMax;
    private final AllowRateGate gate;
    private final Map<Level, List<Handler>> handlers = new EnumMap<>(Level.class);
    private final List<Runnable> onReconnect = new ArrayList<>();

    private final AtomicBoolean stop = new AtomicBoolean();
    private final AtomicBoolean busy = new AtomicBoolean();
    private final AtomicBoolean registered = new AtomicBoolean();
    private final AtomicLong registrations = new AtomicLong();
    private final AtomicLong notifications = new AtomicLong();
    private final AtomicLong failed = new AtomicLong();
    private final Set<String> warned = ConcurrentHashMap.newKeySet();
    private final ExecutorService handlerThread = Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "memcolo-handlers");
        t.setDaemon(true);
        return t;
    });
    private volatile SocketChannel channel;
    private Thread thread;

    private Client(Builder b) {
        String path = b.socketPath;
        if (path == null) {
            path = System.getenv(SOCKET_ENV);
        }
        if (path == null || path.isEmpty()) {
            path = Protocol.DEFAULT_SOCKET;
        }
        this.socketPath = Path.of(path);
        this.cls = b.cls;
        this.name = b.name;
        this.expectedReclaimBytes = b.expectedReclaimBytes;
        this.handlerTimeout = b.handlerTimeout;
        this.backoffMin = b.backoffMin;
        this.backoffMax = b.backoffMax.compareTo(b.backoffMin) < 0 ? b.backoffMin : b.backoffMax;
        this.gate = b.gate != null ? b.gate : new AllowRateGate();
        for (Level l : Level.values()) {
            handlers.put(l, new ArrayList<>(b.handlers.get(l)));
        }
        onReconnect.addAll(b.onReconnect);
    }

    public static Builder builder() {
        return new Builder();
    }

    /** Builds a {@link Client}. Defaults: class elastic, handler timeout 10 s, backoff 100 ms to 5 s. */
    public static final class Builder {
        private String socketPath;
        private String cls = "elastic";
        private String name;
        private Long expectedReclaimBytes;
        private Duration handlerTimeout = Duration.ofSeconds(10);
        private Duration backoffMin = Duration.ofMillis(100);
        private Duration backoffMax = Duration.ofSeconds(5);
        private AllowRateGate gate;
        private final Map<Level, List<Handler>> handlers = new EnumMap<>(Level.class);
        private final List<Runnable> onReconnect = new ArrayList<>();

        private Builder() {
            for (Level l : Level.values()) {
                handlers.put(l, new ArrayList<>());
            }
        }

        public Builder socketPath(String path) {
            this.socketPath = path;
            return this;
        }

        /** "elastic" (default), "be" or "lc". */
        public Builder cls(String cls) {
            if (!List.of("elastic", "be", "lc").contains(cls)) {
                throw new IllegalArgumentException("unknown class " + cls + " (expected lc, be or elastic)");
            }
            this.cls = cls;
            return this;
        }

        public Builder name(String name) {
            this.name = name;
            return this;
        }

        /** What a high signal should give back, in bytes (M3 §5.1). */
        public Builder expectedReclaimBytes(long bytes) {
            if (bytes < 0) {
                throw new IllegalArgumentException("expectedReclaimBytes must not be negative");
            }
            this.expectedReclaimBytes = bytes;
            return this;
        }

        public Builder handlerTimeout(Duration d) {
            this.handlerTimeout = d;
            return this;
        }

        public Builder backoff(Duration min, Duration max) {
            this.backoffMin = min;
            this.backoffMax = max;
            return this;
        }

        public Builder gate(AllowRateGate gate) {
            this.gate = gate;
            return this;
        }

        /** Adds {@code h} as the next (lower) layer for {@code level}. */
        public Builder on(Level level, Handler h) {
            handlers.get(level).add(h);
            return this;
        }

        /** Runs after each re-registration that follows a lost connection. */
        public Builder onReconnect(Runnable hook) {
            onReconnect.add(hook);
            return this;
        }

        public Client build() {
            return new Client(this);
        }
    }

    /** Adds a lower layer after build (before {@link #start()}). */
    public synchronized Client on(Level level, Handler h) {
        handlers.get(level).add(h);
        return this;
    }

    public AllowRateGate gate() {
        return gate;
    }

    public boolean registered() {
        return registered.get();
    }

    public long registrations() {
        return registrations.get();
    }

    public long notifications() {
        return notifications.get();
    }

    public long failedNotifications() {
        return failed.get();
    }

    /** Starts the daemon thread; returns at once. */
    public synchronized Client start() {
        if (thread == null) {
            thread = new Thread(this::run, "memcolo-client");
            thread.setDaemon(true);
            thread.start();
        }
        return this;
    }

    /** Stops the client; the agent sees the connection close. */
    @Override
    public void close() {
        stop.set(true);
        SocketChannel ch = channel;
        if (ch != null) {
            try {
                ch.close();
            } catch (IOException ignored) {
                // closing anyway
            }
        }
        Thread t;
        synchronized (this) {
            t = thread;
        }
        if (t != null) {
            t.interrupt();
            try {
                t.join(5000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        handlerThread.shutdownNow();
    }

    private void warnOnce(String kind, String msg) {
        if (warned.add(kind)) {
            LOG.warning(msg + " (logged once)");
        }
    }

    private void run() {
        long backoffMs = backoffMin.toMillis();
        boolean reconnect = false;
        while (!stop.get()) {
            SocketChannel ch = null;
            try {
                ch = SocketChannel.open(StandardProtocolFamily.UNIX);
                ch.connect(UnixDomainSocketAddress.of(socketPath));
            } catch (IOException e) {
                closeQuietly(ch);
                ch = null;
                warnOnce("connect", "memcolo agent not reachable at " + socketPath + ": " + e.getMessage()
                        + "; retrying in the background");
            }
            if (ch != null) {
                backoffMs = backoffMin.toMillis();
                channel = ch;
                String why;
                try {
                    why = session(ch, reconnect);
                } catch (IOException e) {
                    why = String.valueOf(e.getMessage());
                } catch (RuntimeException e) {
                    LOG.log(java.util.logging.Level.WARNING, "memcolo client error", e);
                    why = e.toString();
                } finally {
                    registered.set(false);
                    channel = null;
                    closeQuietly(ch);
                }
                reconnect = true;
                if (stop.get()) {
                    return;
                }
                LOG.info("connection to memcolo agent lost: " + why + "; reconnecting");
            }
            try {
                Thread.sleep(backoffMs);
            } catch (InterruptedException e) {
                return;
            }
            backoffMs = Math.min(backoffMs * 2, backoffMax.toMillis());
        }
    }

    private static void closeQuietly(SocketChannel ch) {
        if (ch != null) {
            try {
                ch.close();
            } catch (IOException ignored) {
                // nothing to do
            }
        }
    }

    private static void write(SocketChannel ch, String line) throws IOException {
        ByteBuffer b = ByteBuffer.wrap(line.getBytes(StandardCharsets.UTF_8));
        while (b.hasRemaining()) {
            ch.write(b);
        }
    }

    private String session(SocketChannel ch, boolean reconnect) throws IOException {
        Map<String, Object> reg = new LinkedHashMap<>();
        reg.put("type", "register");
        reg.put("class", cls);
        if (name != null) {
            reg.put("name", name);
        }
        if (expectedReclaimBytes != null) {
            reg.put("expected_reclaim_bytes", BigInteger.valueOf(expectedReclaimBytes));
        }
        reg.put("notify", "socket");
        write(ch, Protocol.encode(Protocol.Direction.REQUEST, reg));
        ByteBuffer buf = ByteBuffer.allocate(65536);
        ByteArrayOutputStream line = new ByteArrayOutputStream();
        boolean discarding = false;
        boolean[] pending = {reconnect};
        while (!stop.get()) {
            buf.clear();
            int n = ch.read(buf);
            if (n < 0) {
                return "agent closed the connection";
            }
            for (int k = 0; k < n; k++) {
                byte c = buf.get(k);
                if (c != '\n') {
                    if (!discarding) {
                        line.write(c);
                        if (line.size() > Protocol.MAX_LINE_BYTES + 1) {
                            warnOnce("too_long", "agent sent a line over " + Protocol.MAX_LINE_BYTES + " bytes; discarded");
                            line.reset();
                            discarding = true;
                        }
                    }
                    continue;
                }
                if (!discarding) {
                    handleLine(ch, line.toString(StandardCharsets.UTF_8), pending);
                }
                discarding = false;
                line.reset();
            }
        }
        return "closed";
    }

    private void handleLine(SocketChannel ch, String line, boolean[] reconnectPending) throws IOException {
        Map<String, Object> msg;
        try {
            msg = Protocol.decodeReply(line);
        } catch (ProtocolException e) {
            warnOnce(e.code().equals("unsupported_version") ? "newer_version" : "malformed",
                    "ignoring a message from the agent: " + e.getMessage());
            return;
        }
        switch ((String) msg.get("type")) {
            case "registered":
                registered.set(true);
                registrations.incrementAndGet();
                if (reconnectPending[0]) {
                    reconnectPending[0] = false;
                    for (Runnable hook : onReconnect) {
                        try {
                            hook.run();
                        } catch (RuntimeException e) {
                            warnOnce("reconnect_hook", "onReconnect hook threw " + e);
                        }
                    }
                }
                break;
            case "notify": {
                Notification n = new Notification(((BigInteger) msg.get("seq")).longValue(), (String) msg.get("level"),
                        ((BigInteger) msg.get("target_bytes")).longValue());
                long[] result = dispatch(n); // ok, bytes, ns
                notifications.incrementAndGet();
                if (result[0] == 0) {
                    failed.incrementAndGet();
                }
                Map<String, Object> out = new LinkedHashMap<>();
                out.put("type", "reclaimed");
                out.put("seq", new BigInteger(Long.toUnsignedString(n.seq())));
                out.put("bytes", new BigInteger(Long.toUnsignedString(result[1])));
                out.put("duration_ms", BigInteger.valueOf(TimeUnit.NANOSECONDS.toMillis(result[2])));
                out.put("ok", result[0] != 0);
                write(ch, Protocol.encode(Protocol.Direction.REQUEST, out));
                break;
            }
            case "error":
                LOG.warning("agent answered with an error (" + msg.get("code") + "): " + msg.get("message"));
                break;
            default:
                break;
        }
    }

    private long[] dispatch(Notification n) {
        long received = System.nanoTime();
        boolean gated = !n.level().equals("low");
        if (gated) {
            gate.signalReceived(received);
        }
        try {
            if (!busy.compareAndSet(false, true)) {
                warnOnce("busy", "a notification arrived while an overlong handler still runs; reported as failed");
                return new long[] {0, 0, 0};
            }
            List<Handler> layers;
            synchronized (this) {
                layers = new ArrayList<>(handlers.get(Level.of(n.level())));
            }
            Future<long[]> f = handlerThread.submit(() -> {
                long start = System.nanoTime();
                try {
                    long total = 0;
                    for (Handler h : layers) {
                        total += h.reclaim(n);
                    }
                    return new long[] {1, total, System.nanoTime() - start};
                } catch (Exception | Error e) {
                    if (e instanceof VirtualMachineError) {
                        throw e;
                    }
                    LOG.warning("handler for " + n.level() + " failed: " + e);
                    return new long[] {0, 0, System.nanoTime() - start};
                } finally {
                    busy.set(false);
                }
            });
            try {
                return f.get(handlerTimeout.toNanos(), TimeUnit.NANOSECONDS);
            } catch (TimeoutException e) {
                LOG.warning("handler for " + n.level() + " ran past " + handlerTimeout.toMillis() + " ms; reported as failed");
                return new long[] {0, 0, System.nanoTime() - received};
            } catch (ExecutionException e) {
                return new long[] {0, 0, System.nanoTime() - received};
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return new long[] {0, 0, System.nanoTime() - received};
            }
        } finally {
            if (gated) {
                gate.signalHandled(System.nanoTime());
            }
        }
    }
}
