"""Whether a process still runs: what the interrupt tests ask of every process a run started."""

from __future__ import annotations

import os


def running(pid: int) -> bool:
    """True while ``pid`` exists (a zombie not yet reaped counts: its parent has not seen it end)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
