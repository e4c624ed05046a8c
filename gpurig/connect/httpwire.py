"""HTTP over a byte stream a Connection opens, one stream per HTTP connection: the Docker engine's API and slurmrestd's alike.

``OverStream`` makes an ``http.client``-style connection (urllib3's are
such) take its socket from an opener, not from a TCP connect: an SSH
channel running ``docker system dial-stdio``, or a direct-tcpip channel to a
port on the host's loopback. Nothing listens on the network, and the channel
rides the connection whose host key gpurig checked.
"""

from __future__ import annotations

import http.client
import io
import threading
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
        self._open_stream = lambda timeout: ChannelSocket(open_stream(timeout))


class ChannelSocket:
    """A channel that closes the way a socket does: ``close()`` waits for the files made from it.

    ``http.client`` closes its connection as soon as it has read the headers
    of an answer that ends the connection (HTTP/1.0, ``Connection: close``)
    and reads the body through the file it made from the socket. A socket
    stays open until that file is closed too; a channel closed at once drops
    the part of the body still on its way.
    """

    def __init__(self, chan: Any) -> None:
        self.channel = chan
        self._lock = threading.Lock()
        self._files = 0
        self._closing = False

    def sendall(self, data: bytes) -> None:
        self.channel.sendall(data)

    def settimeout(self, timeout: float | None) -> None:
        self.channel.settimeout(timeout)

    def makefile(self, mode: str = "rb", buffering: int = -1) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"a channel's file is read as bytes ('rb'), not {mode!r}")
        with self._lock:
            self._files += 1
        return io.BufferedReader(_ChannelReader(self))

    def close(self) -> None:
        with self._lock:
            self._closing = True
            if self._files:
                return
        self.channel.close()

    def _file_closed(self) -> None:
        with self._lock:
            self._files -= 1
            last = self._closing and not self._files
        if last:
            self.channel.close()


class _ChannelReader(io.RawIOBase):
    """The raw file under ``ChannelSocket.makefile``: reads the channel, tells the socket when it is closed."""

    def __init__(self, owner: ChannelSocket) -> None:
        super().__init__()
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._owner.channel.recv(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._owner._file_closed()
