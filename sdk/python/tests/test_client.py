"""The client against a fake agent: a real Unix socket server in the test."""

import logging
import os
import socket
import threading
import time

import pytest

from memcolo import Client, protocol

WAIT_S = 20.0  # generous bound for waits; nothing asserts on durations


class FakeAgent:
    def __init__(self, path):
        self.path = path
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.srv.settimeout(WAIT_S)
        self.conn = None
        self.buf = b""

    def accept(self):
        self.conn, _ = self.srv.accept()
        self.conn.settimeout(WAIT_S)
        self.buf = b""
        return self

    def recv(self):
        while b"\n" not in self.buf:
            chunk = self.conn.recv(65536)
            assert chunk, "client closed the connection"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return protocol.decode_request(line)

    def send_raw(self, data):
        self.conn.sendall(data if isinstance(data, bytes) else data.encode())

    def send(self, msg):
        self.send_raw(protocol.encode(msg, protocol.REPLIES))

    def handshake(self):
        reg = self.recv()
        assert reg["type"] == "register" and reg["notify"] == "socket" and "pid" not in reg
        self.send({"type": "registered", "pid": os.getpid(), "class": reg["class"]})
        return reg

    def notify(self, seq, level, target_bytes):
        self.send({"type": "notify", "seq": seq, "level": level, "target_bytes": target_bytes})
        r = self.recv()
        assert r["type"] == "reclaimed", r
        self.send({"type": "ok"})
        return r

    def close(self):
        if self.conn:
            self.conn.close()
        self.srv.close()
        os.unlink(self.path)


def wait_for(cond, what):
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.01)


@pytest.fixture
def sock_path(tmp_path):
    return str(tmp_path / "agent.sock")


def test_register_and_layered_handlers(sock_path):
    agent = FakeAgent(sock_path)
    order = []
    client = Client(name="cache", expected_reclaim_bytes=1 << 20, socket_path=sock_path)

    @client.on_high
    def app(note):
        order.append("app")
        return note.target_bytes // 2

    client.on("high", lambda note: order.append("runtime") or 100)
    client.on_low(lambda note: note.target_bytes)
    with client:
        reg = agent.accept().handshake()
        assert reg == {
            "type": "register",
            "class": "elastic",
            "name": "cache",
            "expected_reclaim_bytes": 1 << 20,
            "notify": "socket",
        }
        assert client.wait_registered(WAIT_S)
        r = agent.notify(7, "high", 4096)
        assert (r["seq"], r["bytes"], r["ok"]) == (7, 2148, True)
        assert order == ["app", "runtime"]
        r = agent.notify(8, "low", 10)
        assert (r["seq"], r["bytes"], r["ok"]) == (8, 10, True)
        r = agent.notify(9, "top", 10)  # no top handler: answered, nothing given back
        assert (r["seq"], r["bytes"], r["ok"]) == (9, 0, True)
        assert client.gate.epoch_s is not None
        assert client.notifications == 3
    agent.close()


def test_failing_and_overlong_handlers_are_reported(sock_path):
    agent = FakeAgent(sock_path)
    release = threading.Event()
    client = Client(socket_path=sock_path, handler_timeout_s=0.3)

    @client.on_low
    def boom(note):
        raise RuntimeError("cache locked")

    @client.on_top
    def slow(note):
        release.wait(WAIT_S)
        return 5

    with client:
        agent.accept().handshake()
        r = agent.notify(1, "low", 1)
        assert (r["seq"], r["bytes"], r["ok"]) == (1, 0, False)
        r = agent.notify(2, "top", 1)
        assert (r["seq"], r["ok"]) == (2, False)
        # Still running: the next notification is refused at once.
        r = agent.notify(3, "top", 1)
        assert (r["seq"], r["ok"]) == (3, False)
        release.set()
        wait_for(lambda: not client._busy.locked(), "slow handler")
        r = agent.notify(4, "top", 1)
        assert (r["seq"], r["bytes"], r["ok"]) == (4, 5, True)
        assert client.failed_notifications == 3
    agent.close()


def test_reconnects_when_the_agent_restarts(sock_path):
    agent = FakeAgent(sock_path)
    hooks = []
    client = Client(socket_path=sock_path, backoff_min_s=0.02, backoff_max_s=0.2)
    client.on_reconnect(lambda: hooks.append(1))
    client.on_low(lambda note: 1)
    with client:
        agent.accept().handshake()
        wait_for(lambda: client.registrations == 1, "registration")
        agent.close()  # the agent vanishes
        wait_for(lambda: not client.registered, "disconnect")
        time.sleep(0.3)
        agent = FakeAgent(sock_path)  # ... and comes back
        agent.accept().handshake()
        wait_for(lambda: client.registrations == 2, "re-registration")
        wait_for(lambda: hooks == [1], "reconnect hook")
        r = agent.notify(11, "low", 1)
        assert (r["seq"], r["bytes"], r["ok"]) == (11, 1, True)
    agent.close()


def test_bad_lines_are_logged_once_and_ignored(sock_path, caplog):
    agent = FakeAgent(sock_path)
    client = Client(socket_path=sock_path)
    client.on_low(lambda note: note.target_bytes)
    with caplog.at_level(logging.WARNING, logger="memcolo"), client:
        agent.accept().handshake()
        agent.send_raw("garbage\n")
        agent.send_raw("more garbage\n")
        agent.send_raw('{"v":1,"type":"hologram"}\n')
        agent.send_raw('{"v":2,"type":"notify","seq":1,"level":"low","target_bytes":1}\n')
        agent.send_raw('{"v":1,"type":"notify","seq":1,"le\n')
        agent.send_raw("x" * 200000 + "\n")
        agent.send({"type": "error", "code": "internal", "message": "x"})
        r = agent.notify(2, "low", 42)
        assert (r["seq"], r["bytes"], r["ok"]) == (2, 42, True)
        assert client.registrations == 1 and client.notifications == 1
    ignoring = [rec for rec in caplog.records if "ignoring a message" in rec.getMessage()]
    assert len(ignoring) == 2  # one malformed, one newer-version: each logged once
    agent.close()


def test_no_agent_is_not_an_error(sock_path):
    client = Client(socket_path=sock_path, backoff_min_s=0.01, backoff_max_s=0.05)
    client.start()
    time.sleep(0.2)
    assert not client.registered
    assert client.gate.allow_rate() == 1.0
    client.close()


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError):
        Client(cls="vip")
    with pytest.raises(ValueError):
        Client(expected_reclaim_bytes=-1)
    with pytest.raises(ValueError):
        Client().on("red", lambda n: 0)
