"""HTTP over a byte stream a Connection opens, one stream per HTTP connection: the Docker engine's API and slurmrestd's alike.

``OverStream`` makes an ``http.client``-style connection (urllib3's are
such) take its socket from an opener, not from a TCP connect: an SSH
channel running ``docker system dial-stdio``, or a direct-tcpip channel to a
port on the host's loopback. Nothing listens on the network, and the channel
rides the connection whose host key gpurig checked.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable
from typing import Any

StreamOpener = Callable[[float | None], Any]  # (timeout) -> a socket-like stream (an SSH channel)


class OverStream:
    """A mixin for an HTTPConnection class: ``connect`` takes the stream from ``self._open_stream`` (set by the subclass)."""

    _open_stream: StreamOpener
    timeout: Any
    sock: Any

    def connect(self) -> None:
        self.sock = self._open_stream(self.timeout)


class ChannelHTTPConnection(OverStream, http.client.HTTPConnection):
    """``http.client.HTTPConnection`` to ``host:port`` as the far end of the stream sees it."""

    def __init__(self, open_stream: StreamOpener, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._open_stream = open_stream
