"""A command's stdin and stdout as bytes (``Streams``), the thread that feeds its stdin (``Feeder``), and what wakes its read loop (``OutputWake``).

For what is not text: a tar sent to a host (``gpurig run``'s sync) or
received from it (a job's artifacts). Both connection kinds take them
(``Connection.run(..., streams=Streams(...))``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Feed = Callable[[Callable[[bytes], None]], None]  # writes the command's stdin through the function it is given, then returns


@dataclass(frozen=True)
class Streams:
    """A command's stdin and stdout as bytes, for what is not text: a tar sent (``feed``) or received (``on_bytes``).

    ``feed`` runs in a thread of its own while the command runs; stdin is
    closed when it returns. Stdout given to ``on_bytes`` is neither decoded
    nor kept in the Result (a stream of gigabytes costs no memory).
    """

    feed: Feed | None = None
    on_bytes: Callable[[bytes], None] | None = None


class SinkFailed(Exception):
    """``Streams.on_bytes`` raised OSError (this machine's disk is full, say): the command is stopped and that error raised as it is,
    never taken for the connection's failing."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def guarded_sink(on_bytes: Callable[[bytes], None]) -> Callable[[bytes], None]:
    def sink(data: bytes) -> None:
        try:
            on_bytes(data)
        except OSError as err:
            raise SinkFailed(err) from err
    return sink


class Feeder:
    """Runs a ``Streams.feed`` in a thread, writing through ``write`` and calling ``done`` (EOF) after it; its error kept for ``join``.

    A write that fails because the command has gone (it exited, or was
    stopped) ends the feed quietly: the command's own status says why.
    """

    def __init__(self, feed: Feed, write: Callable[[bytes], None], done: Callable[[], None]) -> None:
        self.error: BaseException | None = None
        self._stopped = threading.Event()

        def run() -> None:
            try:
                feed(self._write(write))
                done()
            except _FeedStopped:
                pass
            except BaseException as err:  # noqa: B036 - kept for join(), which raises it in the command's thread
                self.error = err
                try:
                    done()
                except OSError:
                    pass

        self._thread = threading.Thread(target=run, name="gpurig-feed", daemon=True)
        self._thread.start()

    def _write(self, write: Callable[[bytes], None]) -> Callable[[bytes], None]:
        def checked(data: bytes) -> None:
            if self._stopped.is_set():
                raise _FeedStopped()
            try:
                write(data)
            except OSError as err:
                raise _FeedStopped() from err
        return checked

    def stop(self) -> None:
        self._stopped.set()

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the feed to end; an error it raised (reading the files it sends, say) is raised here."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error


class _FeedStopped(Exception):
    """The command stopped reading (it exited, or was stopped): the feed ends."""


class OutputWake:
    """Wakes a command's read loop when its channel's stdout or stderr gets data, an EOF or a close.

    paramiko's ``Channel.fileno()`` makes an OS pipe for ``select``: each
    chunk of output then costs its transport thread a write and the loop a
    select and a read, ~50 of them for a facts probe. This is the object
    paramiko's buffers take in its place (``BufferedPipe.set_event``): they
    ``set()`` it from the transport thread; the loop ``rearm()``s it before it
    looks at the channel and ``wait()``s on it after, so nothing that came in
    between is missed. A buffer's own ``clear()`` is ignored: the loop, not
    one of the two buffers, knows when both are drained.

    ``batched``: nobody reads the output as it comes (no handler, no
    prompt to answer), so the loop is woken by the end of the output (EOF,
    close) and every ``BATCH`` chunks, not by each chunk: the thread switch
    per chunk was most of a probe's read cost. BATCH chunks of at most
    paramiko's 32 kB packets stay well inside its 2 MB window, so the host
    never waits for the loop to read; the loop's own timeout still looks
    at the channel four times a second.
    """

    BATCH = 32

    def __init__(self, chan: Any, batched: bool = False) -> None:
        self._event = threading.Event()
        self._chan = chan
        self._batched = batched
        self._chunks = 0
        chan.in_buffer.set_event(self)
        chan.in_stderr_buffer.set_event(self)

    def set(self) -> None:
        # paramiko's transport thread, holding the buffer's lock: no call back into the buffer here.
        self._chunks += 1
        if not self._batched or self._chunks >= self.BATCH or self._chan.eof_received or self._chan.closed:
            self._chunks = 0
            self._event.set()

    def clear(self) -> None:
        pass

    def rearm(self) -> None:
        self._event.clear()

    def wait(self, timeout: float) -> None:
        self._event.wait(timeout)
