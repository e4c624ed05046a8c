"""Console output shared by the tasks (rich): one console for results, one for progress and warnings."""

from __future__ import annotations

import os
import sys

from rich.console import Console


def _width(stream) -> int | None:
    # Piped or captured output has no terminal width; rich would assume 80 and
    # squeeze tables into unreadable ellipses. $COLUMNS still wins.
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 200


console = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err_console = Console(highlight=False, soft_wrap=True, stderr=True, width=_width(sys.stderr))
