"""gpurig.deploy.layercache's LayerCache on a socket pair standing in for its SSH channel: a cache that ends unasked is heard
at once; one that ``stop`` asks to end is not, and gives its closing counts."""

from __future__ import annotations

import socket
import threading

from gpurig.deploy.layercache import LayerCache


class Channel:
    """The build machine's end of the cache's channel: a socket with paramiko's shutdown_write."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


def watched() -> tuple[LayerCache, socket.socket, list[str], threading.Event]:
    ours, host = socket.socketpair()
    cache = LayerCache("a100-01", 40001, ".cache/gpurig/layer-cache-x", Channel(ours))
    ended: list[str] = []
    heard = threading.Event()
    cache.watch(lambda why: (ended.append(why), heard.set()))
    return cache, host, ended, heard


def test_a_cache_whose_channel_ends_unasked_is_heard_at_once_with_its_host():
    cache, host, ended, heard = watched()
    host.close()  # the cache's process was killed: sh exits, the channel ends
    assert heard.wait(10)
    assert ended == ["the layer cache on a100-01 ended before its pulls did (its process ended, or the connection to the host dropped)"]
    assert cache.stop() == {}  # nothing more to say, and stopping it is safe


def test_a_cache_stop_asks_to_end_gives_its_counts_and_is_not_taken_for_a_death():
    cache, host, ended, heard = watched()

    def the_cache() -> None:  # on stdin's end it says its counts and exits
        while host.recv(4096):
            pass
        host.sendall(b'{"event": "stopped", "fetched": 5, "served": 15, "blobs": 2}\n')
        host.close()

    threading.Thread(target=the_cache, daemon=True).start()
    assert cache.stop() == {"fetched": 5, "served": 15, "blobs": 2}
    assert not heard.is_set() and ended == []
    assert cache.stop() == {}
