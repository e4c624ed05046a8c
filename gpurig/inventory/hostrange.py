"""Ansible's host ranges (``gpu[01:08]``, ``node[a:f]``, ``r[1:9:2]``), expanded only after they are counted and capped."""

from __future__ import annotations

import re
import string

from gpurig.errors import InventoryError
from gpurig.strict import validate

MAX_NAMES_PER_PATTERN = 10_000
_NAME_RANGE = re.compile(r"\[([0-9a-zA-Z]*):([0-9a-zA-Z]*)(?::([0-9]+))?\]")


def count_host_pattern(pattern: str) -> int:
    """How many names ``pattern`` expands to, without expanding it (ranges checked as ``expand_host_pattern`` does)."""
    total = 1
    for start, end, step in _ranges(pattern):
        total *= len(range(start, end + 1, step))
    return total


def expand_host_pattern(pattern: str) -> list[str]:
    """Ansible's ranges in host names: ``gpu[01:03]`` -> gpu01, gpu02, gpu03; ``node[a:c]`` -> nodea..nodec.

    Refuses (InventoryError) a malformed range or one past MAX_NAMES_PER_PATTERN names.
    """
    if "[" not in pattern:
        return [pattern]
    count = count_host_pattern(pattern)
    if count > MAX_NAMES_PER_PATTERN:
        raise InventoryError(
            f"host pattern {validate.excerpt(pattern)} expands to {count:,} names, over the limit of {MAX_NAMES_PER_PATTERN:,}",
            "split the range or list the hosts",
        )
    names = [""]
    last = 0
    for m in _NAME_RANGE.finditer(pattern):
        start, end, step = _range_bounds(m)
        lit = pattern[last: m.start()]
        if m.group(1).isdigit() or m.group(1) == "":
            width = len(m.group(1)) if m.group(1).startswith("0") else 0
            items = [str(i).zfill(width) for i in range(start, end + 1, step)]
        else:
            items = [string.ascii_letters[i] for i in range(start, end + 1, step)]
        names = [n + lit + item for n in names for item in items]
        last = m.end()
    return [n + pattern[last:] for n in names]


def _ranges(pattern: str) -> list[tuple[int, int, int]]:
    return [_range_bounds(m) for m in _NAME_RANGE.finditer(pattern)]


def _range_bounds(m: re.Match) -> tuple[int, int, int]:
    """(start, end, step) of one ``[a:b:s]``: numbers, or single letters as indexes into string.ascii_letters."""
    start, end, step = m.group(1), m.group(2), m.group(3)
    bad = None
    if step is not None and (len(step) > 9 or int(step) == 0):
        bad = "has a step of 0 or too large"
    elif (start == "" or start.isdigit()) and end.isdigit():
        if len(start) > 9 or len(end) > 9:
            bad = "has more than 9 digits"
        elif start.startswith("0") and len(start) > 1 and len(start) != len(end):
            bad = "has zero-padded bounds of different widths"
        elif int(start or 0) > int(end):
            bad = "ends before it starts"
        else:
            return int(start or 0), int(end), int(step or 1)
    elif len(start) == 1 and len(end) == 1 and start in string.ascii_letters and end in string.ascii_letters:
        # Ansible counts letters in string.ascii_letters order: a..z, then A..Z
        first, last = string.ascii_letters.index(start), string.ascii_letters.index(end)
        if first > last:
            bad = "ends before it starts"
        else:
            return first, last, int(step or 1)
    else:
        bad = "must be numbers [1:9] or single letters [a:f]"
    raise InventoryError(f"host range {validate.excerpt(m.group(0))} {bad}", "write a range as [01:20], [1:20:2] or [a:f]")
