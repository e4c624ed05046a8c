"""OutputWake: what paramiko's channel buffers set when output comes; a command's read loop waits on it."""

from __future__ import annotations

import threading

from paramiko.buffered_pipe import BufferedPipe

from gpurig.connect.streams import OutputWake


class Chan:
    """The parts of a paramiko Channel that OutputWake reads: its two buffers, the EOF and close flags."""

    def __init__(self) -> None:
        self.in_buffer, self.in_stderr_buffer = BufferedPipe(), BufferedPipe()
        self.eof_received = self.closed = False


def woken(wake: OutputWake) -> bool:
    return wake._event.is_set()


def test_a_loop_that_reads_as_output_comes_is_woken_by_each_chunk():
    chan = Chan()
    wake = OutputWake(chan)
    wake.rearm()
    chan.in_stderr_buffer.feed(b"password: ")
    assert woken(wake)
    wake.rearm()
    assert chan.in_stderr_buffer.read(100) == b"password: " and not woken(wake)  # a buffer drained clears nothing by itself


def test_a_batched_loop_is_woken_every_batch_of_chunks_and_at_once_by_the_end():
    chan = Chan()
    wake = OutputWake(chan, batched=True)
    wake.rearm()
    for _ in range(OutputWake.BATCH - 1):
        chan.in_buffer.feed(b"x" * 100)
    assert not woken(wake)
    chan.in_stderr_buffer.feed(b"y")  # chunks of either stream count
    assert woken(wake)
    wake.rearm()
    chan.in_buffer.feed(b"z")
    assert not woken(wake)
    chan.eof_received = True  # paramiko sets the flag, then closes the buffers
    chan.in_buffer.close()
    assert woken(wake)


def test_a_close_wakes_a_batched_loop_waiting_on_it():
    chan = Chan()
    wake = OutputWake(chan, batched=True)
    wake.rearm()
    chan.in_buffer.feed(b"partial")

    def hang_up() -> None:
        chan.closed = True
        chan.in_buffer.close()

    timer = threading.Timer(0.05, hang_up)
    timer.start()
    wake.wait(30)
    timer.join()
    assert woken(wake) and chan.in_buffer.read(100) == b"partial"

