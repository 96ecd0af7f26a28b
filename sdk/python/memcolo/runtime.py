"""The Python runtime as the lowest reclamation layer (M3 §4.1): collect garbage with
:mod:`gc`, then give glibc's free heap pages back to the kernel with ``malloc_trim(3)``.

On ``low`` a young collection (generations 0-1, cheap); on ``high``/``top`` a full one,
mirroring M3's young vs. mixed JVM collections (§4.2).
"""

import ctypes
import ctypes.util
import gc
import os

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_libc = None


def _load_libc():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            _libc = False
    return _libc


def rss_bytes():
    """Resident set size of this process in bytes (``/proc/self/statm``), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def malloc_trim():
    """Calls glibc ``malloc_trim(0)``. Returns True if it released memory; False where
    the C library has no malloc_trim (musl) or nothing could be released."""
    libc = _load_libc()
    fn = getattr(libc, "malloc_trim", None) if libc else None
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return bool(fn(0))


def reclaim(level="high"):
    """Collects garbage (young on ``low``, full otherwise), trims the C heap and
    returns the drop in RSS in bytes (0 if RSS did not drop)."""
    before = rss_bytes()
    if level == "low":
        gc.collect(1)
    else:
        gc.collect()
    malloc_trim()
    after = rss_bytes()
    if before is None or after is None:
        return 0
    return max(0, before - after)
