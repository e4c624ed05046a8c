"""Writing files so that readers see the old content or the whole new one, never half.

``atomic_write`` is the only place gpurig writes a file it owns: temp file in
the same directory, fsync, chmod, rename. ``write_report`` adds what a report
path given on the command line needs: ``-`` means stdout, and a path that
exists but is not a regular file (``/dev/stdout``, a FIFO, a directory) is
written to, never replaced.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurig.errors import GpurigError


def atomic_write(path: str | Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically (temp file beside it, fsync, rename)."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".gpurig-tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_json(data: Any, default: Callable[[Any], Any] | None = None) -> str:
    return json.dumps(data, indent=2, default=default) + "\n"


def write_report(target: str | Path, data: Any, default: Callable[[Any], Any] | None = None) -> None:
    """A JSON report to ``target``: ``-`` is stdout; a regular file is replaced atomically (0644).

    A special file that exists (a terminal, /dev/stdout, a FIFO) is opened and
    written, so ``--json /dev/stdout`` as root never replaces the symlink; a
    symlink to a regular file keeps pointing there, and its target is replaced.
    A link is followed only when it belongs to this user or to root (as the
    kernel's protected_symlinks does): a link planted by someone else in /tmp
    must not make root overwrite /etc/sudoers. Block devices are never written.
    """
    write_text_report(target, to_json(data, default))


def write_text_report(target: str | Path, text: str, flag: str = "--json") -> None:
    """``write_report`` for text already made (JUnit XML...); ``flag`` names the option in errors."""
    if str(target) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(target)
    if path.is_symlink():
        owner = path.lstat().st_uid
        if owner not in (os.geteuid(), 0):
            raise GpurigError(
                f"report path {path} is a symlink owned by another user (uid {owner})",
                f"remove it or choose another {flag} path",
            )
    try:
        st = path.stat()  # what the path leads to, through links
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise GpurigError(f"cannot write report {path}: {err.strerror}", f"choose another {flag} path") from None
    try:
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise GpurigError(f"report path {path} is a directory", "give a file name, or - for stdout")
        if st is not None and stat.S_ISBLK(st.st_mode):
            raise GpurigError(f"report path {path} is a block device", "give a file name, or - for stdout")
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(path, "w") as f:  # /dev/stdout -> /proc/self/fd/1 -> a pipe: opened through the links
                f.write(text)
            return
        if path.is_symlink():
            path = Path(os.path.realpath(path))  # replace what the link points to, not the link
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text, 0o644)
    except OSError as err:
        raise GpurigError(f"cannot write report {path}: {err.strerror}", f"choose a writable {flag} path") from None
