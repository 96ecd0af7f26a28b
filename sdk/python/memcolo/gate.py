"""The adaptive allocation protocol of M3 (EuroSys'21) §4.2.

After a high-pressure signal only every floor(1/r)-th allocation proceeds at once;
the others first call the application's eviction callback, so the application
replaces data instead of growing. An allocation is never failed::

    r = min(time since the last high signal / (epoch * NUM_epochs), 1)
    epoch = max(time the application took to handle that signal, minimum epoch)

Until the first high signal has been handled there is no epoch: from its receipt to
the end of its handling r = 0 (every allocation evicts first). A later signal drops r
to 0 at its receipt and r climbs with the previous epoch until its handlers return.

Times are kept as whole nanoseconds (seconds are rounded to the nanosecond) and
floor(1/r) is computed as floor(window_ns / elapsed_ns) in integers, so that the gate
takes the decisions of the other SDKs and of libmemcolo on the same clock readings
(``sdk/testvectors/gate.json``): with seconds as floats, 0.8 - 0.6 is
0.20000000000000007 and r = 0.2 would admit every 4th allocation instead of every 5th.

The minimum epoch (:data:`DEFAULT_MIN_EPOCH_S`, 1 s) is one poll of M3's monitor (§6)
and of ``memcolo agent`` with its default ``poll_ms``. M3 ends the epoch "when memory
has been returned", and memory counts as returned for the node when the monitor sees
it. A handler that returns in a few milliseconds would otherwise reopen the gate
before the next poll has even seen the node leave the red zone, and the application
would regrow at once (bench/m3: JVM epochs of ~11 ms, Go cache ~15 ms).
"""

import threading
import time

#: M3 used NUM_epochs = 5 for Go-Cache and Memcached, 1 for Spark (§4.2).
DEFAULT_NUM_EPOCHS = 5

#: The shortest epoch a gate uses, seconds (see the module docstring).
DEFAULT_MIN_EPOCH_S = 1.0


def _ns(seconds):
    """Seconds (int or float) as whole nanoseconds."""
    return int(round(seconds * 1e9))


class AllowRateGate:
    """The allow-rate gate. Thread-safe. Times are seconds from ``clock``
    (default :func:`time.monotonic`); every method takes an optional ``now``.
    ``min_epoch_s``: the shortest epoch (0: the handling time alone, M3 §4.2 to the
    letter)."""

    def __init__(self, num_epochs=DEFAULT_NUM_EPOCHS, clock=time.monotonic,
                 min_epoch_s=DEFAULT_MIN_EPOCH_S):
        if num_epochs < 1:
            raise ValueError("num_epochs must be at least 1, got %r" % (num_epochs,))
        if not min_epoch_s >= 0:
            raise ValueError("min_epoch_s must be >= 0, got %r" % (min_epoch_s,))
        self.num_epochs = num_epochs
        self.min_epoch_s = float(min_epoch_s)
        self._min_epoch_ns = _ns(min_epoch_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._last_signal_ns = None
        self._epoch_ns = None
        self._count = 0

    def _now_ns(self, now):
        return _ns(self._clock() if now is None else now)

    def signal_received(self, now=None):
        """A high signal arrived: the rate drops to 0 and climbs from there."""
        with self._lock:
            self._last_signal_ns = self._now_ns(now)
            self._count = 0

    def signal_handled(self, now=None):
        """The handlers of the last signal finished: the epoch is receipt -> now, but
        at least ``min_epoch_s``."""
        with self._lock:
            if self._last_signal_ns is not None:
                self._epoch_ns = max(self._min_epoch_ns,
                                     self._now_ns(now) - self._last_signal_ns)

    @property
    def epoch_s(self):
        """Epoch of the last handled signal in seconds (at least ``min_epoch_s``),
        or None."""
        epoch_ns = self._epoch_ns
        return None if epoch_ns is None else epoch_ns / 1e9

    def _elapsed_window_ns(self, now_ns):
        """(elapsed, window) in ns; (0, 0) without a signal (full rate), (0, 1) while
        the first signal has no epoch yet (rate 0)."""
        if self._last_signal_ns is None:
            return 0, 0
        if self._epoch_ns is None:
            return 0, 1
        return (max(0, now_ns - self._last_signal_ns),
                self._epoch_ns * self.num_epochs)

    def allow_rate(self, now=None):
        """The allow rate r in [0, 1]."""
        with self._lock:
            elapsed, window = self._elapsed_window_ns(self._now_ns(now))
            return 1.0 if elapsed >= window else elapsed / window

    def admit(self, now=None):
        """True if this allocation may proceed at once, False if it must evict first.
        r is recomputed on every call (M3 §4.2)."""
        with self._lock:
            elapsed, window = self._elapsed_window_ns(self._now_ns(now))
            if elapsed >= window:
                self._count = 0
                return True
            self._count += 1
            if elapsed == 0:
                return False
            if self._count >= window // elapsed:
                self._count = 0
                return True
            return False

    def before_alloc(self, evict):
        """Call in the allocation path: runs ``evict()`` unless admitted. Returns
        whether eviction ran."""
        if self.admit():
            return False
        evict()
        return True
