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
    """0: gpurig's warnings only, one line each; 1 (-v): gpurig's info; 2 (-vv): debug, paramiko and tracebacks."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _StderrHandler(tracebacks=verbosity >= 2)
    gpurig_log = logging.getLogger("gpurig")
    gpurig_log.handlers[:] = [handler]
    gpurig_log.setLevel(level)
    gpurig_log.propagate = False
    for name in _NOISY:
        noisy = logging.getLogger(name)
        noisy.propagate = False
        if verbosity >= 2:
            noisy.handlers[:] = [handler]
            noisy.setLevel(logging.DEBUG)
        else:
            noisy.handlers[:] = [logging.NullHandler()]
            noisy.setLevel(logging.CRITICAL + 1)


def silence_broken_pipe() -> None:
    """After the reader of stdout went away (``gpurig matrix | head -2``): no traceback, no flush error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
