"""Everything gpurig shows a person: consoles, log lines, tables, fleet progress and recap.

Library code never prints; it returns data or calls a callback, and the CLI
hands those to this package. ``console`` carries results (stdout), and
``err_console`` progress, warnings and recaps (stderr).
"""

from __future__ import annotations

import logging
import os
import sys

from rich.console import Console
from rich.markup import escape

from gpurig.connect import LIBRARY_LOGGERS
from gpurig.strict.validate import printable


def _width(stream) -> int | None:
    # Piped or captured output has no terminal width; rich would assume 80 and
    # squeeze tables. $COLUMNS still wins.
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 200


console = Console(highlight=False, emoji=False, soft_wrap=True, width=_width(sys.stdout))
err_console = Console(highlight=False, emoji=False, soft_wrap=True, stderr=True, width=_width(sys.stderr))


def outside(text: object) -> str:
    """Text that came from outside (a host name, a note, a host's output, a recorded run) ready for a rich markup string.

    Its control characters are shown as escapes (a terminal never obeys an
    escape sequence in it) and its square brackets are escaped (it is never
    read as markup). Table cells and plain lines use ``printable`` alone.
    """
    return escape(printable(text))


# Loggers whose lines only help someone debugging gpurig itself (the SSH library's: see gpurig.connect).
_NOISY = LIBRARY_LOGGERS


class _StderrHandler(logging.Handler):
    """Log lines to whatever sys.stderr is at the time (rich's live display redirects it)."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def emit(self, record: logging.LogRecord) -> None:
        try:
            # a message may quote a host's output: its escape sequences are shown, not obeyed
            message = printable(record.getMessage())
            text = f"gpurig: {record.levelname.lower()}: {message}"
            if record.name.split(".")[0] != "gpurig":
                text = f"{record.name}: {record.levelname.lower()}: {message}"
            if self.tracebacks and record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            sys.stderr.write(text + "\n")
        except Exception:  # a logging failure must never take the run down
            self.handleError(record)


def configure_logging(verbosity: int = 0) -> None:
    """The one place that decides what is logged and where: 0 warnings, 1 (-v) info, 2 (-vv) debug, to stderr.

    Lines go one each to stderr (tracebacks only at -vv). The SSH library's own lines
    (every failed handshake is ~65 traceback lines) pass only at -vv; below
    that they are dropped, never printed by logging's last-resort handler.
    """
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _StderrHandler(tracebacks=verbosity >= 2)
    gpurig_log = logging.getLogger("gpurig")
    gpurig_log.handlers[:] = [handler]
    gpurig_log.setLevel(level)
    for name in _NOISY:
        noisy = logging.getLogger(name)
        noisy.handlers[:] = [handler] if verbosity >= 2 else [logging.NullHandler()]
        noisy.propagate = verbosity >= 2
        noisy.setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)


def silence_broken_pipe() -> None:
    """After the reader of stdout went away (``gpurig matrix | head -2``): no traceback, no flush error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def flush_stdout() -> None:
    """Flush what is still buffered for stdout now, where a closed pipe can be handled quietly (exit 141),
    not at interpreter exit, where Python can only print "Exception ignored ... BrokenPipeError"."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_broken_pipe()
        raise SystemExit(141) from None
