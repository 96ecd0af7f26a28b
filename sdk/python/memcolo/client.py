"""The client: registers with ``memcolo agent`` and answers its pressure notifications.

One background thread connects to the agent's Unix socket (``$MEMCOLO_SOCKET`` or
``/run/memcolo/agent.sock``), sends ``register``, and for every ``notify`` runs the
handlers of its level on a handler thread, then answers ``reclaimed`` with the
notification's ``seq``, the bytes the handlers gave back and the time taken (ms).
A handler that raises, or runs past ``handler_timeout_s``, is reported with
``ok: false``; the application keeps running. When the agent goes away the client
reconnects with exponential backoff and registers again; with no agent at all it
keeps retrying quietly. Lines it cannot decode are logged once per kind and ignored.
"""

import collections
import logging
import os
import queue
import socket
import threading
import time

from . import protocol, runtime
from .gate import AllowRateGate

log = logging.getLogger("memcolo")

#: Environment variable that overrides the agent's socket path.
SOCKET_ENV = "MEMCOLO_SOCKET"

Notification = collections.namedtuple("Notification", "seq level target_bytes")
Notification.__doc__ = """A pressure notification: ``seq`` (echoed in ``reclaimed``),
``level`` (``"low"``, ``"high"`` or ``"top"``) and ``target_bytes`` (about how much to
give back, bytes)."""


class Client:
    """A registered elastic application's link to the agent.

    Handlers (``on``, or the ``on_low``/``on_high``/``on_top`` decorators) take a
    :class:`Notification` and return the bytes they gave back (None counts as 0).
    Handlers of one level run in the order they were added: add the application's
    layer first and its runtime last (M3 §3-4), e.g. with :meth:`add_python_runtime`.
    """

    def __init__(
        self,
        name=None,
        cls="elastic",
        expected_reclaim_bytes=None,
        socket_path=None,
        handler_timeout_s=10.0,
        backoff_min_s=0.1,
        backoff_max_s=5.0,
        gate=None,
    ):
        if cls not in protocol.CLASSES:
            raise ValueError("unknown class %r (expected lc, be or elastic)" % (cls,))
        if expected_reclaim_bytes is not None and (
            type(expected_reclaim_bytes) is not int or expected_reclaim_bytes < 0
        ):
            raise ValueError("expected_reclaim_bytes must be a non-negative int")
        self.socket_path = socket_path or os.environ.get(SOCKET_ENV) or protocol.DEFAULT_SOCKET
        self.name = name
        self.cls = cls
        self.expected_reclaim_bytes = expected_reclaim_bytes
        self.handler_timeout_s = handler_timeout_s
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = max(backoff_max_s, backoff_min_s)
        self.gate = gate if gate is not None else AllowRateGate()
        self._handlers = {level: [] for level in protocol.LEVELS}
        self._on_reconnect = []
        self._stop = threading.Event()
        self._registered = threading.Event()
        self._sock = None
        self._thread = None
        self._jobs = queue.Queue()
        self._worker = None
        self._busy = threading.Lock()
        self._warned = set()
        self.registrations = 0
        self.notifications = 0
        self.failed_notifications = 0

    # -- configuration -------------------------------------------------------

    def on(self, level, handler):
        """Adds ``handler`` as the next (lower) layer for ``level``."""
        if level not in self._handlers:
            raise ValueError("unknown level %r (expected low, high or top)" % (level,))
        self._handlers[level].append(handler)
        return handler

    def on_low(self, handler):
        return self.on("low", handler)

    def on_high(self, handler):
        return self.on("high", handler)

    def on_top(self, handler):
        return self.on("top", handler)

    def on_reconnect(self, hook):
        """``hook()`` runs after each re-registration that follows a lost connection."""
        self._on_reconnect.append(hook)
        return hook

    def add_python_runtime(self):
        """Adds the Python runtime (gc + malloc_trim, :mod:`memcolo.runtime`) as the
        lowest layer of every level."""
        for level in protocol.LEVELS:
            self.on(level, lambda note: runtime.reclaim(note.level))

    # -- lifecycle -----------------------------------------------------------

    @property
    def registered(self):
        """Whether the agent acknowledged the registration on the current connection."""
        return self._registered.is_set()

    def wait_registered(self, timeout_s=None):
        return self._registered.wait(timeout_s)

    def start(self):
        """Starts the background thread and returns at once."""
        if self._thread is not None:
            return self
        self._worker = threading.Thread(target=self._run_worker, name="memcolo-handlers", daemon=True)
        self._worker.start()
        self._thread = threading.Thread(target=self._run, name="memcolo-client", daemon=True)
        self._thread.start()
        return self

    def close(self):
        """Stops the client; the agent sees the connection close."""
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._jobs.put(None)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- internals -----------------------------------------------------------

    def _warn_once(self, kind, msg, *args):
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(msg + " (logged once)", *args)

    def _run(self):
        backoff = self.backoff_min_s
        reconnect = False
        while not self._stop.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
            except OSError as e:
                sock.close()
                self._warn_once(
                    "connect",
                    "memcolo agent not reachable at %s: %s; retrying in the background",
                    self.socket_path,
                    e,
                )
            else:
                backoff = self.backoff_min_s
                self._sock = sock
                try:
                    why = self._session(sock, reconnect)
                except OSError as e:
                    why = str(e)
                except Exception as e:  # never let the client thread die
                    log.exception("memcolo client error")
                    why = repr(e)
                finally:
                    self._registered.clear()
                    self._sock = None
                    sock.close()
                reconnect = True
                if self._stop.is_set():
                    break
                log.info("connection to memcolo agent lost: %s; reconnecting", why)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.backoff_max_s)

    def _session(self, sock, reconnect):
        sock.sendall(
            protocol.encode(
                {
                    "type": "register",
                    "class": self.cls,
                    "name": self.name,
                    "expected_reclaim_bytes": self.expected_reclaim_bytes,
                    "notify": "socket",
                }
            ).encode()
        )
        sock.settimeout(0.2)
        buf = b""
        discarding = False
        while not self._stop.is_set():
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                return "agent closed the connection"
            buf += chunk
            while True:
                pos = buf.find(b"\n")
                if pos < 0:
                    break
                line, buf = buf[:pos], buf[pos + 1 :]
                if discarding:
                    discarding = False
                    continue
                if self._handle_line(sock, line, reconnect):
                    reconnect = False
            if len(buf) > protocol.MAX_LINE_BYTES + 1:
                self._warn_once("too_long", "agent sent a line over %d bytes; discarded", protocol.MAX_LINE_BYTES)
                buf = b""
                discarding = True
        return "closed"

    def _handle_line(self, sock, line, reconnect):
        """Handles one line; returns True when it completed a registration."""
        try:
            msg = protocol.decode_reply(line)
        except protocol.ProtocolError as e:
            kind = "newer_version" if e.code == "unsupported_version" else "malformed"
            self._warn_once(kind, "ignoring a message from the agent: %s", e)
            return False
        t = msg["type"]
        if t == "registered":
            self.registrations += 1
            self._registered.set()
            if reconnect:
                for hook in self._on_reconnect:
                    try:
                        hook()
                    except Exception:
                        self._warn_once("reconnect_hook", "on_reconnect hook raised")
            return True
        if t == "notify":
            note = Notification(msg["seq"], msg["level"], msg["target_bytes"])
            ok, nbytes, duration_s = self._dispatch(note)
            self.notifications += 1
            if not ok:
                self.failed_notifications += 1
            reply = {
                "type": "reclaimed",
                "seq": note.seq,
                "bytes": min(max(0, nbytes), (1 << 64) - 1),
                "duration_ms": int(duration_s * 1000),
                "ok": ok,
            }
            sock.sendall(protocol.encode(reply).encode())
        elif t == "error":
            log.warning("agent answered with an error (%s): %s", msg["code"], msg["message"])
        return False

    def _dispatch(self, note):
        received = time.monotonic()
        gated = note.level in ("high", "top")
        if gated:
            self.gate.signal_received(received)
        if not self._busy.acquire(blocking=False):
            self._warn_once("busy", "a notification arrived while an overlong handler still runs; reported as failed")
            return False, 0, 0.0
        done = queue.Queue(maxsize=1)
        self._jobs.put((note, done))
        try:
            ok, nbytes, duration_s = done.get(timeout=self.handler_timeout_s)
        except queue.Empty:
            log.warning("handler for %s ran past %.1f s; reported as failed", note.level, self.handler_timeout_s)
            ok, nbytes, duration_s = False, 0, time.monotonic() - received
        if gated:
            self.gate.signal_handled(time.monotonic())
        return ok, nbytes, duration_s

    def _run_worker(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            note, done = job
            start = time.monotonic()
            total, ok = 0, True
            for handler in list(self._handlers[note.level]):
                try:
                    got = handler(note)
                    if got is not None:
                        total += int(got)
                except Exception as e:  # a failing handler never takes the process down
                    log.warning("handler for %s failed: %r", note.level, e)
                    ok, total = False, 0
                    break
            self._busy.release()
            done.put((ok, total, time.monotonic() - start))
