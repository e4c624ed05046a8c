"""Byte progress of an image's pull and push, from the JSON events dockerd streams, and the pace of its lines.

dockerd names each layer by the first 12 hex digits of its digest and says
``Pulling fs layer`` for each layer it will fetch, ``Already exists`` for
each it has, then ``Downloading`` with ``progressDetail: {current, total}``
in compressed bytes. ``PullProgress`` turns that into (done, total) over the
layers actually fetched; several pulls may share one, so that progress runs
over all of them. Where the bytes are counted on the wire instead (a port
forward's meter), ``moved`` gives them and wins over the events' own counts.
``PushProgress`` does the same for a push into the local registry, layer by
layer. ``CountPace`` keeps byte counts to one line a second per host; what a
delivery says it is doing is never held back. ``human_size`` is how gpurig
writes any count of bytes for a person (moved, uploaded, an image's size, a
job's files).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpurig.errors import last_line

Progress = Callable[[int, int], None]  # (bytes done, bytes in all; 0 while not known)


def human_size(nbytes: int) -> str:
    """Bytes for a person to read, in decimal units as ``docker images`` shows them: "512 B", "12 kB", "1.02 GB"."""
    value = float(nbytes)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit in ("B", "kB") else f"{value:.2f} {unit}"
        value /= 1000
    return f"{value:.2f} TB"


class PullFailed(Exception):
    """The pull ended with an error event or a lost connection."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.disk_full = "no space left on device" in message


class _LayerProgress:
    """Per-layer [done, total] byte counts, told to ``progress`` whenever their sum changes."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.layers: dict[str, list[int]] = {}  # short id -> [done, total], for the layers moved
        self._last: tuple[int, int] | None = None

    @property
    def done(self) -> int:
        return sum(d for d, _ in self.layers.values())

    @property
    def total(self) -> int:
        return sum(t for _, t in self.layers.values())

    def _say(self, done: int, total: int) -> None:
        if (done, total) != self._last:
            self._last = (done, total)
            self.progress(done, total)


class PullProgress(_LayerProgress):
    def __init__(self, progress: Progress, sizes: dict[str, int] | None = None, moved: Callable[[], int | None] = lambda: None) -> None:
        super().__init__(progress)
        self.sizes = sizes or {}  # short id -> compressed size, known before the pull says it
        self.moved = moved

    def feed(self, event: dict) -> None:
        """One event of the pull; PullFailed for an error event."""
        if "error" in event:
            detail = (event.get("errorDetail") or {}).get("message")
            raise PullFailed(last_line(str(event.get("error") or detail)))
        layer, status = event.get("id"), str(event.get("status", ""))
        if layer and status.startswith("Pulling fs layer"):
            self.layers[layer] = [0, self.sizes.get(layer, 0)]
        elif layer in self.layers and status == "Downloading":
            detail = event.get("progressDetail") or {}
            known = self.layers[layer][1]
            self.layers[layer] = [int(detail.get("current") or 0), int(detail.get("total") or known)]
        elif layer in self.layers and status in ("Download complete", "Pull complete"):
            self.layers[layer][0] = self.layers[layer][1]
        self._report()

    def finish(self) -> int:
        """The pull completed: everything fetched is done. Returns the bytes in all."""
        total = self.total
        self._say(total, total)
        return total

    def _report(self) -> None:
        total = self.total
        wire = self.moved()
        done = self.done if wire is None else wire
        self._say(min(done, total) if total else done, total)


class PushProgress(_LayerProgress):
    """(bytes done, bytes in all) of a push, over the layers it uploads; the layers the registry has already count as done."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(progress)
        self.present: set[str] = set()  # layers the registry already held

    def feed(self, event: dict) -> None:
        layer, status = event.get("id"), str(event.get("status", ""))
        if not layer:
            return
        if status == "Pushing":
            detail = event.get("progressDetail") or {}
            known = self.layers.get(layer, [0, 0])[1]
            total = int(detail.get("total") or known)
            self.layers[layer] = [min(int(detail.get("current") or 0), total), total]  # tar headers go past the total
        elif status == "Pushed" and layer in self.layers:
            self.layers[layer][0] = self.layers[layer][1]
        elif status == "Layer already exists" or status.startswith("Mounted from"):
            self.present.add(layer)
        else:
            return
        self._say(self.done, self.total)

    def summary(self) -> str:
        """'3 of 9 layers uploaded (1.2 GB)' once the push is done."""
        uploaded = len(self.layers)
        return f"{uploaded} of {uploaded + len(self.present)} layers uploaded ({human_size(self.total)})"


class CountPace:
    """Whether a byte-count line may be printed now: at most one each ``every_s`` per host, and always the last one.

    Only counts are paced: a transfer reports many times a second, but the lines
    saying what a delivery does (and why) are each printed, however close together.
    """

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def allow(self, host: str, done: int, total: int) -> bool:
        now = self.clock()
        with self._lock:
            final = bool(total) and done >= total
            if not final and now - self._last.get(host, now - self.every_s) < self.every_s:
                return False
            self._last[host] = now
            return True

    def phase(self, host: str) -> None:
        """A new phase began on ``host``: its first count is shown at once."""
        with self._lock:
            self._last.pop(host, None)
