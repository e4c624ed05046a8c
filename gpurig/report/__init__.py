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


def _width(stream) -> int | None:
    # Piped or captured output has no terminal width; rich would assume 80 and
    # squeeze tables. $COLUMNS still wins.
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 200


console = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err_console = Console(highlight=False, soft_wrap=True, stderr=True, width=_width(sys.stderr))

# Loggers whose lines only help someone debugging gpurig itself: paramiko logs every failed
# handshake as ~65 traceback lines, which would bury the one reason line per host.
_NOISY = ("paramiko",)


class _StderrHandler(logging.Handler):
    """Log lines to whatever sys.stderr is at the time (rich's live display redirects it)."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"gpurig: {record.levelname.lower()}: {record.getMessage()}"
            if record.name.split(".")[0] != "gpurig":
                text = f"{record.name}: {record.levelname.lower()}: {record.getMessage()}"
            if self.tracebacks and record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            sys.stderr.write(text + "\n")
        except Exception:  # a logging failure must never take the run down
            self.handleError(record)


def configure_logging(verbosity: int = 0) -> None:
    """Where log lines go: stderr, one line each (tracebacks only at -vv).

    What is logged at each verbosity (gpurig's levels, paramiko only at -vv)
    is decided in one place, ``gpurig.connect.ssh.configure_logging``.
    """
    from gpurig.connect.ssh import configure_logging as set_levels

    handler = _StderrHandler(tracebacks=verbosity >= 2)
    gpurig_log = logging.getLogger("gpurig")
    gpurig_log.handlers[:] = [handler]
    for name in _NOISY:
        logging.getLogger(name).handlers[:] = [handler] if verbosity >= 2 else [logging.NullHandler()]
    set_levels(verbosity)


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
