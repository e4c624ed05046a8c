"""docker-py's HTTP client over a byte stream a Connection opens: one stream per HTTP connection.

On a remote host the stream is an SSH channel of gpurig's own transport
running ``docker system dial-stdio`` (the engine's unix socket on
stdin/stdout, as the docker CLI's own ``ssh://`` mode does). The transport is
the one gpurig opened and checked the host key of, so nothing here trusts an
unknown key (docker-py's own ``ssh://`` mode would). An exec's output is
read from its hijacked stream here too, to its end or a deadline
(``read_to_end``, ``demux``) and the stream closed (``close_hijacked``).
Only ``gpurig.connect.engine`` and ``engineopen`` use this module; the
stream part is httpwire's.
"""

from __future__ import annotations

import select
import struct
import time

import docker
import docker.utils.socket
import urllib3.connection
from docker.transport.basehttpadapter import BaseHTTPAdapter
from docker.transport.sshconn import SSHConnectionPool

from gpurig.connect.httpwire import OverStream, StreamOpener

API_VERSION = "1.41"  # Docker 20.10, the oldest engine gpurig provisions; newer engines answer it too


class _StreamConnection(OverStream, urllib3.connection.HTTPConnection):
    """One HTTP connection = one stream (an SSH channel running ``docker system dial-stdio``)."""

    def __init__(self, open_stream: StreamOpener, timeout) -> None:
        super().__init__("localhost", timeout=timeout)
        self._open_stream = open_stream


class _StreamPool(SSHConnectionPool):
    def __init__(self, open_stream: StreamOpener, timeout, maxsize) -> None:
        super().__init__(ssh_client=None, timeout=timeout, maxsize=maxsize, host="gpurig")
        self._open_stream = open_stream

    def _new_conn(self):
        return _StreamConnection(self._open_stream, self.timeout)

    def _get_conn(self, timeout):
        # docker-py's pool skips urllib3's dropped-connection check: a pooled channel whose dial-stdio
        # ended (dockerd restarted) would fail the next request once. Closed, it is opened again.
        conn = super()._get_conn(timeout)
        chan = getattr(conn, "sock", None)
        if chan is not None and (chan.closed or chan.eof_received):
            conn.close()
        return conn


class _StreamAdapter(BaseHTTPAdapter):
    def __init__(self, open_stream: StreamOpener, timeout: float, max_pool_size: int = 8) -> None:
        self._pool = _StreamPool(open_stream, timeout, max_pool_size)
        super().__init__()

    def get_connection(self, url, proxies=None):
        return self._pool

    def close(self) -> None:
        super().close()
        self._pool.close()


class StreamAPIClient(docker.APIClient):
    """docker-py's APIClient with every request sent through ``open_stream`` (a callable giving a stream)."""

    def __init__(self, open_stream: StreamOpener, timeout: float) -> None:
        # An explicit version skips docker-py's detection request, which would go out before the adapter is mounted.
        super().__init__(base_url="tcp://gpurig.invalid:2375", version=API_VERSION, timeout=timeout)
        self._custom_adapter = _StreamAdapter(open_stream, timeout)
        self.mount("http+docker://ssh", self._custom_adapter)
        self._unmount("http://", "https://")
        # "ssh" in the URL makes docker-py read attach/log streams from the stream (its SSH code path).
        self.base_url = "http+docker://ssh"


def api_client(open_stream: StreamOpener | None, base_url: str, timeout: float, tls=None) -> docker.APIClient:
    """A client over ``open_stream`` when there is one, else over ``base_url`` (this machine's engine: the endpoint
    its docker CLI uses, with the context's ``tls`` settings; an ``ssh://`` one through the ssh client, as the CLI does)."""
    if open_stream is None:
        return docker.APIClient(base_url=base_url, version=API_VERSION, timeout=timeout, tls=tls or False,
                                use_ssh_client=base_url.startswith("ssh://"))
    return StreamAPIClient(open_stream, timeout)


def read_to_end(sock, deadline: float) -> bytes | None:
    """Every byte of a hijacked stream until the engine closes it; None when ``deadline`` (monotonic) came first.

    docker-py's own reader waits on the socket without a limit, so a hung
    process in the container would hang gpurig: here every wait is bounded.
    """
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
            return None
        chunk = docker.utils.socket.read(sock, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def demux(data: bytes) -> tuple[bytes, bytes]:
    """(stdout, stderr) of a non-tty stream: frames of an 8-byte header (stream 1 or 2, size) and that many bytes."""
    out: list[bytes] = []
    err: list[bytes] = []
    at = 0
    while at + 8 <= len(data):
        kind, size = struct.unpack(">BxxxL", data[at:at + 8])
        (err if kind == 2 else out).append(data[at + 8:at + 8 + size])
        at += 8 + size
    return b"".join(out), b"".join(err)


def close_hijacked(sock) -> None:
    """Close an exec's hijacked stream and the HTTP response under it (docker-py keeps it on the socket where it can)."""
    response = getattr(sock, "_response", None)
    if response is not None:
        response.close()
    sock.close()
