"""SSH port forwards: a port on the host's 127.0.0.1 pumped to an address here (reverse), or a port here to one on the host (local).

``ReverseForward`` asks the host's sshd to listen on its own 127.0.0.1 (a
port it picks) and pumps every connection made there to the target,
counting the bytes that cross the SSH connection (``Meter``). Delivery uses
it so that a host's dockerd pulls from the build machine's registry:
Docker lets dockerd use plain HTTP for registries on 127.0.0.0/8, so the
host pulls ``127.0.0.1:<port>/<repo>:<tag>`` through SSH with no daemon
setting.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

CHUNK = 256 * 1024
# Connections one forward pumps at once. A host's dockerd opens a handful (a few layers at a time); each costs two
# threads here, so a host that opens thousands (a bug, a scan) is refused beyond this instead of exhausting threads.
MAX_PUMPED = 256


class Meter:
    """Bytes that crossed the SSH connection, both ways, counted by the pumps (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down = 0  # build machine -> host
        self.up = 0

    def add(self, down: int = 0, up: int = 0) -> None:
        with self._lock:
            self.down += down
            self.up += up

    @property
    def total(self) -> int:
        with self._lock:
            return self.down + self.up


def pump(chan, sock: socket.socket, meter: Meter, stop: threading.Event) -> None:
    """Copy a forwarded channel and a local socket into each other until both sides said EOF, counting bytes."""

    def one_way(read: Callable[[int], bytes], write: Callable[[bytes], None], eof: Callable[[], None], count: Callable[[int], None]) -> None:
        try:
            while not stop.is_set():
                data = read(CHUNK)
                if not data:
                    break
                write(data)
                count(len(data))
        except (OSError, EOFError):
            pass
        finally:
            try:
                eof()
            except (OSError, EOFError):
                pass

    up = threading.Thread(target=one_way, daemon=True, args=(
        chan.recv, sock.sendall, lambda: sock.shutdown(socket.SHUT_WR), lambda n: meter.add(up=n)))
    try:
        up.start()
    except RuntimeError:  # can't start new thread: this connection ends, unpumped
        _close_pair(chan, sock)
        return
    one_way(sock.recv, chan.sendall, chan.shutdown_write, lambda n: meter.add(down=n))
    up.join()
    chan.close()
    sock.close()


class _Pumps:
    """The connections a forward pumps: started each in a thread, all ended at once by ``_end_all`` (a forward's close)."""

    def __init__(self, meter: Meter | None) -> None:
        self.meter = meter or Meter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open: set = set()  # (channel, socket) pairs being pumped
        self._threads: list[threading.Thread] = []

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def _spawn(self, serve: Callable[[Any], None], end: Any, name: str) -> bool:
        """``serve(end)`` in a thread of its own, kept for ``_end_all`` to wait on; False (nothing started) once the
        forward is closing, pumps ``MAX_PUMPED`` connections already, or no thread can be started: the caller closes ``end``."""
        if self._stop.is_set():
            return False
        thread = threading.Thread(target=serve, args=(end,), daemon=True, name=name)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            if len(self._threads) >= MAX_PUMPED:
                return False
            self._threads.append(thread)
        try:
            thread.start()
        except RuntimeError:  # can't start new thread: this connection is refused, the forward goes on
            with self._lock:
                self._threads.remove(thread)
            return False
        return True

    def _pump(self, chan, sock: socket.socket) -> None:
        """Pump one connection until both sides said EOF or the forward closes."""
        with self._lock:
            self._open.add((chan, sock))
        if self._stop.is_set():  # close() ran while this connection was being made, and may have collected the pairs before it
            _close_pair(chan, sock)
        try:
            pump(chan, sock, self.meter, self._stop)
        finally:
            with self._lock:
                self._open.discard((chan, sock))

    def _end_all(self) -> None:
        """End every pumped connection now (the forward's ``_stop`` is set) and wait for their threads."""
        with self._lock:
            pairs, threads = list(self._open), list(self._threads)
        for chan, sock in pairs:  # an interrupted delivery: the host's pull fails now, not at its timeout
            _close_pair(chan, sock)
        for thread in threads:
            thread.join(timeout=5)


class ReverseForward(_Pumps):
    """127.0.0.1:``port`` on the host, each connection pumped to ``target`` (host, port) on this machine."""

    def __init__(self, transport, target: tuple[str, int], meter: Meter | None = None) -> None:
        super().__init__(meter)
        self.transport = transport
        self.target = target
        self.port = 0

    def open(self) -> int:
        """Ask the host's sshd to listen; paramiko.SSHException when it refuses (AllowTcpForwarding)."""
        if not self.port:
            self.port = self.transport.request_port_forward("127.0.0.1", 0, handler=self._accept)
        return self.port

    def __enter__(self) -> ReverseForward:
        self.open()
        return self

    def close(self) -> None:
        self._stop.set()
        try:
            if self.port and self.transport.is_active():
                # Not Transport.cancel_port_forward: it clears the handler first, and a connection the host's sshd
                # opened just before the cancel then meets None on paramiko's thread, which dies of the TypeError.
                # The handler stays: _accept closes what arrives after _stop.
                self.transport.global_request("cancel-tcpip-forward", ("127.0.0.1", self.port), wait=True)
        except Exception:  # noqa: BLE001 - the connection may already be gone; nothing is left to cancel then
            pass
        self._end_all()

    def _accept(self, chan, origin, server) -> None:
        """paramiko calls this on its transport thread for each new connection: hand it to a pump thread at once.

        It never raises: an exception here would end paramiko's transport thread, and with it the SSH connection.
        """
        try:
            if self._spawn(self._serve, chan, "gpurig-forward"):
                return
        except Exception:  # noqa: BLE001 - see above; the connection is refused instead
            pass
        try:
            chan.close()
        except Exception:  # noqa: BLE001 - the transport may be going; nothing is left to close then
            pass

    def _serve(self, chan) -> None:
        try:
            sock = socket.create_connection(self.target, timeout=10)
        except OSError:
            chan.close()
            return
        sock.settimeout(None)
        self._pump(chan, sock)


class LocalForward(_Pumps):
    """127.0.0.1:``port`` on this machine, each connection made there carried to an address as the host sees it.

    Each accepted connection gets its own channel (``open_channel``, a
    direct-tcpip channel of the SSH connection): a service on the host's
    loopback (a dashboard, a Prometheus, a Jupyter) reached from here with
    nothing listening on the host's network. A connection whose channel the
    host refuses is closed at once, so the client sees the end, not a hang.
    """

    def __init__(self, open_channel: Callable[[], object], meter: Meter | None = None) -> None:
        super().__init__(meter)
        self._open_channel = open_channel
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="gpurig-local-forward")
        self._acceptor.start()

    def __enter__(self) -> LocalForward:
        return self

    def close(self) -> None:
        self._stop.set()
        try:  # shutdown, not close alone: it wakes the accept() blocked in the acceptor thread
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        self._acceptor.join(timeout=5)
        self._end_all()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._server.accept()
            except OSError:
                return  # closed
            if not self._spawn(self._serve, sock, "gpurig-local-forward"):
                sock.close()

    def _serve(self, sock: socket.socket) -> None:
        try:
            chan = self._open_channel()
        except Exception:  # noqa: BLE001 - the host refused the channel or the connection is gone: this client's connection ends
            sock.close()
            return
        self._pump(chan, sock)


def _close_pair(chan, sock: socket.socket) -> None:
    """End a pumped connection now: close() alone does not wake a pump blocked in recv() on an idle connection."""
    chan.close()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
