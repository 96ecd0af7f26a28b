package dev.memcolo.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.math.BigInteger;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The client against a fake agent: a real Unix socket server in the test. */
class ClientTest {
    static final long WAIT_MS = 20_000; // generous bound; nothing asserts on durations

    @TempDir
    Path dir;

    static final class FakeAgent implements AutoCloseable {
        final Path path;
        final ServerSocketChannel server;
        SocketChannel conn;
        final ByteArrayOutputStream pending = new ByteArrayOutputStream();

        FakeAgent(Path path) throws IOException {
            this.path = path;
            server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
            server.bind(UnixDomainSocketAddress.of(path));
        }

        FakeAgent accept() throws IOException {
            conn = server.accept();
            return this;
        }

        Map<String, Object> recv() throws Exception {
            ByteBuffer one = ByteBuffer.allocate(1);
            pending.reset();
            while (true) {
                one.clear();
                if (conn.read(one) < 0) {
                    throw new IOException("client closed");
                }
                if (one.get(0) == '\n') {
                    return Protocol.decodeRequest(pending.toString(StandardCharsets.UTF_8));
                }
                pending.write(one.get(0));
            }
        }

        void sendRaw(String s) throws IOException {
            ByteBuffer b = ByteBuffer.wrap(s.getBytes(StandardCharsets.UTF_8));
            while (b.hasRemaining()) {
                conn.write(b);
            }
        }

        void send(Map<String, Object> msg) throws IOException {
            sendRaw(Protocol.encode(Protocol.Direction.REPLY, msg));
        }

        Map<String, Object> handshake() throws Exception {
            Map<String, Object> reg = recv();
            assertEquals("register", reg.get("type"));
            assertEquals("socket", reg.get("notify"));
            assertFalse(reg.containsKey("pid"), "a client registers itself");
            Map<String, Object> ok = new LinkedHashMap<>();
            ok.put("type", "registered");
            ok.put("pid", BigInteger.valueOf(ProcessHandle.current().pid()));
            ok.put("class", reg.get("class"));
            send(ok);
            return reg;
        }

        Map<String, Object> notify(long seq, String level, long target) throws Exception {
            Map<String, Object> n = new LinkedHashMap<>();
            n.put("type", "notify");
            n.put("seq", BigInteger.valueOf(seq));
            n.put("level", level);
            n.put("target_bytes", BigInteger.valueOf(target));
            send(n);
            Map<String, Object> r = recv();
            assertEquals("reclaimed", r.get("type"));
            assertEquals(BigInteger.valueOf(seq), r.get("seq"));
            send(Map.of("type", "ok"));
            return r;
        }

        @Override
        public void close() throws IOException {
            if (conn != null) {
                conn.close();
            }
            server.close();
            Files.deleteIfExists(path);
        }
    }

    static void waitFor(String what, BooleanSupplier cond) throws InterruptedException {
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (!cond.getAsBoolean()) {
            assertTrue(System.currentTimeMillis() < deadline, "timed out waiting for " + what);
            Thread.sleep(10);
        }
    }

    static long bytes(Map<String, Object> r) {
        return ((BigInteger) r.get("bytes")).longValue();
    }

    static boolean ok(Map<String, Object> r) {
        return (Boolean) r.get("ok");
    }

    @Test
    void registersAndRunsLayersInOrder() throws Exception {
        Path sock = dir.resolve("agent.sock");
        List<String> order = Collections.synchronizedList(new ArrayList<>());
        try (FakeAgent agent = new FakeAgent(sock);
                Client c = Client.builder().socketPath(sock.toString()).name("cache").expectedReclaimBytes(1 << 20)
                        .on(Client.Level.HIGH, n -> {
                            order.add("app");
                            return n.targetBytes() / 2;
                        })
                        .on(Client.Level.HIGH, n -> {
                            order.add("runtime");
                            return 100;
                        })
                        .on(Client.Level.LOW, Notification::targetBytes)
                        .build().start()) {
            Map<String, Object> reg = agent.accept().handshake();
            assertEquals("elastic", reg.get("class"));
            assertEquals("cache", reg.get("name"));
            assertEquals(BigInteger.valueOf(1 << 20), reg.get("expected_reclaim_bytes"));
            waitFor("registration", c::registered);
            Map<String, Object> r = agent.notify(7, "high", 4096);
            assertTrue(ok(r));
            assertEquals(2148, bytes(r));
            assertEquals(List.of("app", "runtime"), order);
            assertEquals(10, bytes(agent.notify(8, "low", 10)));
            r = agent.notify(9, "top", 10);
            assertTrue(ok(r));
            assertEquals(0, bytes(r));
            assertTrue(c.gate().epochNs() >= 0);
            assertEquals(3, c.notifications());
        }
    }

    @Test
    void failingAndOverlongHandlersAreReported() throws Exception {
        Path sock = dir.resolve("agent.sock");
        CountDownLatch release = new CountDownLatch(1);
        try (FakeAgent agent = new FakeAgent(sock);
                Client c = Client.builder().socketPath(sock.toString()).handlerTimeout(Duration.ofMillis(300))
                        .on(Client.Level.LOW, n -> {
                            throw new IllegalStateException("cache locked");
                        })
                        .on(Client.Level.TOP, n -> {
                            release.await(WAIT_MS, TimeUnit.MILLISECONDS);
                            return 5;
                        })
                        .build().start()) {
            agent.accept().handshake();
            assertFalse(ok(agent.notify(1, "low", 1)));
            assertFalse(ok(agent.notify(2, "top", 1)), "overlong handler");
            assertFalse(ok(agent.notify(3, "top", 1)), "notification while the handler still runs");
            release.countDown();
            Map<String, Object> r = null;
            for (long seq = 4; seq < 200 && (r == null || !ok(r)); seq++) {
                r = agent.notify(seq, "top", 1);
                if (!ok(r)) {
                    Thread.sleep(20);
                }
            }
            assertNotNull(r);
            assertTrue(ok(r));
            assertEquals(5, bytes(r));
            assertTrue(c.failedNotifications() >= 3);
        }
    }

    @Test
    void reconnectsWhenTheAgentRestarts() throws Exception {
        Path sock = dir.resolve("agent.sock");
        AtomicInteger hooks = new AtomicInteger();
        FakeAgent agent = new FakeAgent(sock);
        try (Client c = Client.builder().socketPath(sock.toString())
                .backoff(Duration.ofMillis(20), Duration.ofMillis(200))
                .onReconnect(hooks::incrementAndGet)
                .on(Client.Level.LOW, n -> 1)
                .build().start()) {
            agent.accept().handshake();
            waitFor("registration", () -> c.registrations() == 1);
            agent.close(); // the agent vanishes
            waitFor("disconnect", () -> !c.registered());
            Thread.sleep(300);
            agent = new FakeAgent(sock); // ... and comes back
            agent.accept().handshake();
            waitFor("re-registration", () -> c.registrations() == 2);
            waitFor("reconnect hook", () -> hooks.get() == 1);
            assertEquals(1, bytes(agent.notify(11, "low", 1)));
        } finally {
            agent.close();
        }
    }

    @Test
    void badLinesAreLoggedOnceAndIgnored() throws Exception {
        Path sock = dir.resolve("agent.sock");
        List<String> logs = Collections.synchronizedList(new ArrayList<>());
        Logger logger = Logger.getLogger("dev.memcolo.sdk");
        Handler capture = new Handler() {
            @Override
            public void publish(LogRecord record) {
                logs.add(record.getMessage());
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        logger.addHandler(capture);
        try (FakeAgent agent = new FakeAgent(sock);
                Client c = Client.builder().socketPath(sock.toString()).on(Client.Level.LOW, Notification::targetBytes)
                        .build().start()) {
            agent.accept().handshake();
            agent.sendRaw("garbage\nmore garbage\n{\"v\":1,\"type\":\"hologram\"}\n");
            agent.sendRaw("{\"v\":2,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":1}\n");
            agent.sendRaw("{\"v\":1,\"type\":\"notify\",\"seq\":1,\"le\n");
            agent.sendRaw("x".repeat(200_000) + "\n");
            agent.sendRaw("{\"v\":1,\"type\":\"error\",\"code\":\"internal\",\"message\":\"x\"}\n");
            Map<String, Object> r = agent.notify(2, "low", 42);
            assertTrue(ok(r));
            assertEquals(42, bytes(r));
            assertEquals(1, c.registrations());
            assertEquals(1, c.notifications());
            assertEquals(2, logs.stream().filter(m -> m.contains("ignoring a message")).count(), logs.toString());
        } finally {
            logger.removeHandler(capture);
        }
    }

    @Test
    void noAgentIsNotAnError() throws Exception {
        try (Client c = Client.builder().socketPath(dir.resolve("none.sock").toString())
                .backoff(Duration.ofMillis(10), Duration.ofMillis(50)).build().start()) {
            Thread.sleep(200);
            assertFalse(c.registered());
            assertEquals(1.0, c.gate().allowRate());
        }
    }

    @Test
    void badConfigurationIsAClearError() {
        assertThrows(IllegalArgumentException.class, () -> Client.builder().cls("vip"));
        assertThrows(IllegalArgumentException.class, () -> Client.builder().expectedReclaimBytes(-1));
    }

    @Test
    void javaAgentRegistersAndCollectsOnSignals() throws Exception {
        Path sock = dir.resolve("agent.sock");
        try (FakeAgent agent = new FakeAgent(sock)) {
            Client c = MemcoloAgent.start("name=svc,socket=" + sock + ",numEpochs=1,bogus");
            try {
                Map<String, Object> reg = agent.accept().handshake();
                assertEquals("svc", reg.get("name"));
                long gcs = JvmRuntime.collectionCount();
                assertTrue(ok(agent.notify(1, "low", 1 << 20)));
                assertTrue(ok(agent.notify(2, "high", 1 << 20)));
                assertTrue(JvmRuntime.collectionCount() > gcs, "no collection ran");
            } finally {
                c.close();
            }
        }
    }
}
