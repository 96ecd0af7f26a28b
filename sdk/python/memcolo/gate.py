"""The adaptive allocation protocol of M3 (EuroSys'21) §4.2.

After a high-pressure signal only every floor(1/r)-th allocation proceeds at once;
the others first call the application's eviction callback, so the application
replaces data instead of growing. An allocation is never failed::

    r = min(time since the last high signal / (epoch * NUM_epochs), 1)
    epoch = max(time the application took to handle that signal, minimum epoch)

Until the first high signal has been handled there is no epoch: from its receipt to
the end of its handling r = 0 (every allocation evicts first).

The minimum epoch (:data:`DEFAULT_MIN_EPOCH_S`, 1 s) is one poll of M3's monitor (§6)
and of ``memcolo agent`` with its default ``poll_ms``. M3 ends the epoch "when memory
has been returned", and memory counts as returned for the node when the monitor sees
it. A handler that returns in a few milliseconds would otherwise reopen the gate
before the next poll has even seen the node leave the red zone, and the application
would regrow at once (bench/m3: JVM epochs of ~11 ms, Go cache ~15 ms).
"""

import math
import threading
import time

#: M3 used NUM_epochs = 5 for Go-Cache and Memcached, 1 for Spark (§4.2).
DEFAULT_NUM_EPOCHS = 5

#: The shortest epoch a gate uses, seconds (see the module docstring).
DEFAULT_MIN_EPOCH_S = 1.0


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
        self._clock = clock
        self._lock = threading.Lock()
        self._last_signal_s = None
        self._epoch_s = None
        self._count = 0

    def signal_received(self, now=None):
        """A high signal arrived: the rate drops to 0 and climbs from there."""
        with self._lock:
            self._last_signal_s = self._clock() if now is None else now
            self._count = 0

    def signal_handled(self, now=None):
        """The handlers of the last signal finished: the epoch is receipt -> now, but
        at least ``min_epoch_s``."""
        with self._lock:
            if self._last_signal_s is not None:
                now = self._clock() if now is None else now
                self._epoch_s = max(self.min_epoch_s, now - self._last_signal_s)

    @property
    def epoch_s(self):
        """Epoch of the last handled signal in seconds (at least ``min_epoch_s``),
        or None."""
        return self._epoch_s

    def _rate(self, now):
        if self._last_signal_s is None:
            return 1.0
        if self._epoch_s is None:
            return 0.0
        window = self._epoch_s * self.num_epochs
        if window <= 0:
            return 1.0
        return min(max(0.0, now - self._last_signal_s) / window, 1.0)

    def allow_rate(self, now=None):
        """The allow rate r in [0, 1]."""
        with self._lock:
            return self._rate(self._clock() if now is None else now)

    def admit(self, now=None):
        """True if this allocation may proceed at once, False if it must evict first.
        r is recomputed on every call (M3 §4.2)."""
        with self._lock:
            r = self._rate(self._clock() if now is None else now)
            if r >= 1.0:
                self._count = 0
                return True
            self._count += 1
            if r <= 0.0:
                return False
            if self._count >= max(1, math.floor(1.0 / r)):
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
