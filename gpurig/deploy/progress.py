"""Byte progress of a host's image pull, from the JSON events dockerd streams while it pulls.

dockerd names each layer by the first 12 hex digits of its digest and says
``Pulling fs layer`` for each layer it will fetch, ``Already exists`` for
each it has, then ``Downloading`` with ``progressDetail: {current, total}``
in compressed bytes. ``PullProgress`` turns that into (done, total) over the
layers actually fetched; several pulls may share one, so that progress runs
over all of them. Where the bytes are counted on the wire instead (a port
forward's meter), ``moved`` gives them and wins over the events' own counts.
"""

from __future__ import annotations

from collections.abc import Callable

from gpurig.errors import last_line

Progress = Callable[[int, int], None]  # (bytes done, bytes in all; 0 while not known)


class PullFailed(Exception):
    """The pull ended with an error event or a lost connection."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.disk_full = "no space left on device" in message


class PullProgress:
    def __init__(self, progress: Progress, sizes: dict[str, int] | None = None, moved: Callable[[], int | None] = lambda: None) -> None:
        self.progress = progress
        self.sizes = sizes or {}  # short id -> compressed size, known before the pull says it
        self.moved = moved
        self.layers: dict[str, list[int]] = {}  # short id -> [done, total], for the layers fetched
        self._last: tuple[int, int] | None = None

    @property
    def total(self) -> int:
        return sum(t for _, t in self.layers.values())

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
        done = sum(d for d, _ in self.layers.values()) if wire is None else wire
        self._say(min(done, total) if total else done, total)

    def _say(self, done: int, total: int) -> None:
        if (done, total) != self._last:
            self._last = (done, total)
            self.progress(done, total)
