"""Files on hosts: the unified diff a plan shows beside an ``Upload`` (gpurig.steps.commands writes the file)."""

from __future__ import annotations

import difflib

BACKUP_SUFFIX = ".gpurig-bak"


def unified_diff(path: str, old: str | None, new: str) -> str:
    """``diff -u`` of the host's file (None: it does not exist) and the new content."""
    before = [] if old is None else _lines(old)
    return "".join(
        difflib.unified_diff(before, _lines(new), "/dev/null" if old is None else f"{path} (host)", f"{path} (gpurig)")
    )


def _lines(text: str) -> list[str]:
    return [line + "\n" for line in text.splitlines()]
