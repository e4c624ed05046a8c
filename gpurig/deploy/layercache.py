"""A host's layer cache (checks/layer_cache.py) started over its SSH connection for one run, and stopped with its counts.

The script runs on a channel: its stdin is the channel's, so when gpurig
closes it (the run's end, a failure, Ctrl-C: the interrupt closes every
channel) the cache stops and nothing of it listens. The shell line that
starts it removes its store folder once it has exited, whichever way, so no
layer is left in the login user's home.

A thread reads the channel from the start: the cache says nothing more until
it stops, so a channel that ends before ``stop`` asked means the cache is gone
(its process ended, its host's connection dropped), and ``on_end`` hears it at
once, while the engines pulling through it would wait out their retries.
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.connect.launcher import embedded_line
from gpurig.errors import HostError
from gpurig.skeleton import shipped_text

log = logging.getLogger(__name__)

SCRIPT = "checks/layer_cache.py"
START_TIMEOUT_S = 45
STOP_TIMEOUT_S = 30


class LayerCacheError(HostError):
    """A cache that did not start on a host; the host pulls without one (its children go elsewhere)."""


@dataclass
class LayerCache:
    """A running cache: ``port`` on the host's 127.0.0.1."""

    host: str
    port: int
    store: str
    _stream: Any = field(default=None, repr=False)
    _said: bytearray = field(default_factory=bytearray, repr=False)  # what the cache printed after "listening"
    _reader: threading.Thread | None = field(default=None, repr=False)
    _stopping: bool = field(default=False, repr=False)

    def watch(self, on_end: Callable[[str], None] | None) -> None:
        """Read the channel in a thread from now on; ``on_end(why)`` once it ends without ``stop`` having asked."""
        stream = self._stream

        def read() -> None:
            try:
                self._drain(stream)
            except OSError as err:
                log.info("%s: reading the layer cache's channel: %s", self.host, err)
            if not self._stopping and on_end is not None:
                on_end(f"the layer cache on {self.host} ended before its pulls did (its process ended, or the connection to the host dropped)")

        self._reader = threading.Thread(target=read, name=f"layer-cache-{self.host}", daemon=True)
        self._reader.start()

    def _drain(self, stream: Any) -> None:
        """What the cache says, to the channel's end."""
        while chunk := stream.recv(65536):
            self._said += chunk

    def stop(self) -> dict[str, int]:
        """Stop it (stdin ends) and return its closing counts (fetched, served, blobs; empty when it said none); safe twice."""
        stream, self._stream = self._stream, None
        if stream is None:
            return {}
        self._stopping = True
        try:
            stream.settimeout(STOP_TIMEOUT_S)
            stream.shutdown_write()
            if self._reader is not None:
                self._reader.join(STOP_TIMEOUT_S)
            else:
                self._drain(stream)
        except OSError as err:
            log.info("%s: stopping the layer cache: %s", self.host, err)
        finally:
            try:
                stream.close()
            except OSError:
                pass
        for line in reversed(bytes(self._said).decode(errors="replace").splitlines()):
            try:
                said = json.loads(line)
            except ValueError:
                continue
            if isinstance(said, dict) and said.get("event") == "stopped":
                return {k: int(said.get(k) or 0) for k in ("fetched", "served", "blobs")}
        return {}


def start_cache(conn: Connection, upstream_port: int, on_end: Callable[[str], None] | None = None) -> LayerCache:
    """A cache on ``conn``'s host whose upstream is its own 127.0.0.1:``upstream_port`` (a forward to the build machine's registry,
    or a peer link to its parent's cache); LayerCacheError when it does not say it listens. ``on_end(why)``: it ended unasked."""
    store = f".cache/gpurig/layer-cache-{secrets.token_hex(6)}"  # under the login user's home, where the channel starts
    args = ["--upstream", f"http://127.0.0.1:{int(upstream_port)}", "--store", store]
    line = embedded_line(shipped_text(SCRIPT), "layer_cache.py", args)
    # deaf to the hangup a lost connection may send; the store goes once the cache has exited (stdin closed)
    script = f"trap '' HUP; {line}; rm -rf -- {shlex.quote(store)}"
    wrapped = f"sh -c {shlex.quote(script)}"
    opener = conn.stream_opener(wrapped)
    if opener is None:
        raise LayerCacheError("the host is this machine: it serves no other host", "", host=conn.name)
    stream: Any = opener(START_TIMEOUT_S)
    cache = LayerCache(conn.name, 0, store, stream)
    try:
        said = _first_line(stream)
        if said.get("event") != "listening":
            raise LayerCacheError(f"its layer cache did not start: {said.get('why') or 'it said nothing (is python3 on the host?)'}",
                                  "", host=conn.name)
        cache.port = int(said["port"])
        stream.settimeout(None)
        cache.watch(on_end)
        return cache
    except BaseException:
        cache.stop()
        raise


def _first_line(stream: Any) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = stream.recv(4096)
        except OSError as err:
            return {"why": f"no answer: {err or type(err).__name__}"}
        if not chunk:
            break
        data += chunk
    try:
        said = json.loads(data.decode(errors="replace").strip().splitlines()[0]) if data.strip() else {}
    except ValueError:
        return {"why": data.decode(errors="replace").strip()[-200:]}
    return said if isinstance(said, dict) else {}
