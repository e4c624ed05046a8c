"""The one reader of files gpurig did not write itself, or cannot trust: bounded, never blocking, regular files only.

Every user- or host-supplied file (specs, inventories, lock files, facts
reports, rollout states, build reports) is opened here, without blocking and
checked on the open descriptor: a FIFO would hang the read, /dev/zero never
ends, a 1 GiB file would be read whole, and a check by name could be raced.
JSON is parsed with the same depth cap as YAML (gpurig/strict/yamlio.py):
json's decoder recurses, so 100,000 nested brackets raised RecursionError,
and a document that deep would break every walk after it too. Every failure
is the caller's error class with one line: file, problem, fix.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from gpurig.errors import GpurigError

MAX_BYTES = 5 * 1024 * 1024
MAX_DEPTH = 64
_SPLIT = "split it (group_vars/, host_vars/) or remove generated bulk"


def open_regular(path: str | Path, *, error: type[GpurigError], what: str, fix_missing: str, limit: int = MAX_BYTES,
                 kind: str = "a YAML file", fix_large: str = "") -> BinaryIO:
    """A user's file opened for reading: a regular file of at most ``limit`` bytes; else ``error`` with one line.

    Opened without blocking and checked on the open descriptor: a FIFO would
    hang the read, /dev/zero never ends, and a check by name could be raced.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{what} {path} not found", fix_missing) from None
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror}", "check the path and its permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path} is not a regular file", f"point at {kind}, not a device, FIFO or directory")
        if st.st_size > limit:
            raise error(f"{what} {path} is {st.st_size / 2**20:.1f} MiB, over the {_mib(limit)} limit",
                        fix_large or (_SPLIT if limit == MAX_BYTES else "use a smaller file"))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, *, error: type[GpurigError], what: str, fix_missing: str, limit: int = MAX_BYTES,
               kind: str = "a YAML file", fix_large: str = "") -> bytes:
    """The bytes of a user's file, as ``open_regular`` allows; a file that grew past ``limit`` while read is refused too."""
    path = Path(path)
    try:
        with open_regular(path, error=error, what=what, fix_missing=fix_missing, limit=limit, kind=kind, fix_large=fix_large) as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror}", "check the file's permissions") from None
    if len(data) > limit:
        raise error(f"{what} {path} is over the {_mib(limit)} limit", fix_large or "split it into smaller files")
    return data


def read_text(path: str | Path, *, error: type[GpurigError], what: str, fix_missing: str, limit: int = MAX_BYTES,
              kind: str = "a YAML file", fix_large: str = "") -> str:
    """The text of a user's file: regular, at most ``limit`` bytes, UTF-8; else ``error`` with one line."""
    data = read_bytes(path, error=error, what=what, fix_missing=fix_missing, limit=limit, kind=kind, fix_large=fix_large)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{path}: byte {err.start} is not UTF-8", "save the file as UTF-8") from None


def load_json(path: str | Path, *, error: type[GpurigError], what: str, fix: str, limit: int = MAX_BYTES,
              missing_ok: bool = False) -> Any:
    """One JSON document from a file, read as ``read_text`` reads and parsed as ``parse_json``; ``fix`` says how to
    make a good one. With ``missing_ok``, a file that does not exist is None."""
    path = Path(path)
    if missing_ok and not os.path.lexists(path):
        return None
    # over the limit, the document's own fix: the default (split an inventory into group_vars/) is no fix for a state or a report
    text = read_text(path, error=error, what=what, fix_missing=fix, limit=limit, kind="a JSON file", fix_large=fix)
    return parse_json(text, f"{what} {path}", error=error, fix=fix)


def parse_json(text: str, source: str, *, error: type[GpurigError], fix: str, max_depth: int = MAX_DEPTH) -> Any:
    """``text`` as JSON, at most ``max_depth`` levels of arrays and objects deep; else ``error``: ``source``, the problem, ``fix``."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise error(f"{source}: nested deeper than {max_depth} levels", fix) from None
    except ValueError as err:
        raise error(f"{source}: cannot be read as JSON ({str(err).splitlines()[0][:120]})", fix) from None
    if too_deep(doc, max_depth):
        raise error(f"{source}: nested deeper than {max_depth} levels", fix)
    return doc


def too_deep(doc: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether lists and dicts nest deeper than ``max_depth`` in ``doc``; iterative, so any depth is only counted."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        if depth > max_depth:
            return True
        stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))
    return False


def _mib(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit:,} bytes"
