"""memcolo SDK for elastic applications (M3, EuroSys'21 §4).

- :class:`Client`: register with ``memcolo agent``, handle ``low``/``high``/``top``
  notifications in layers, report bytes reclaimed and time taken, reconnect.
- :class:`AllowRateGate`: the adaptive allocation protocol (M3 §4.2).
- :mod:`memcolo.runtime`: the Python runtime as a layer (gc + malloc_trim).
- :mod:`memcolo.protocol`: the wire protocol (docs/protocol.md).
"""

from .client import Client, Notification, SOCKET_ENV
from .gate import AllowRateGate, DEFAULT_MIN_EPOCH_S, DEFAULT_NUM_EPOCHS
from .protocol import DEFAULT_SOCKET, PROTOCOL_VERSION, ProtocolError

__all__ = [
    "AllowRateGate",
    "Client",
    "DEFAULT_MIN_EPOCH_S",
    "DEFAULT_NUM_EPOCHS",
    "DEFAULT_SOCKET",
    "Notification",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "SOCKET_ENV",
]
__version__ = "0.1.0"
