"""Writing files so that readers see the old content or the whole new one, never half; and where an output may go.

``atomic_write`` is the only place gpurig writes a file it owns: temp file in
the same directory, fsync, chmod, rename. Every output a user names on the
command line (``--json``, ``--csv``, ``--plot``, ``--record``, ``init DIR``)
goes through ``output_path``/``output_dir`` first, which check the whole path,
not only its last part: every symlink on the way (a folder as much as the
file) is followed only when it belongs to this user or to root, as the
kernel's protected_symlinks does in sticky folders; a link planted by someone
else must not make root write into /etc. ``write_output`` then writes: a
regular file (or a new one) is replaced atomically; a character device, FIFO
or terminal that exists (``/dev/null``, ``/dev/stdout``) is opened and
written, never replaced; a block device or a directory is refused.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpurig.errors import GpurigError

RUNS = "gpurig-runs"  # under the working directory: where a job's artifacts land by default (never synced up)


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
    """A JSON report to ``target``: ``-`` is stdout, anything else as ``write_output`` writes it (0644)."""
    write_text_report(target, to_json(data, default))


def write_text_report(target: str | Path, text: str, flag: str = "--json") -> None:
    """``write_report`` for text already made (JUnit XML...); ``flag`` names the option in errors."""
    if str(target) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_output(target, text, flag)


def write_output(target: str | Path, data: bytes | str, flag: str, mode: int = 0o644) -> None:
    """Write ``data`` where ``target`` leads (checked by ``output_path``): a special file in place, else atomically."""
    path, st = output_path(target, flag)
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(path, "wb") as f:  # /dev/stdout -> /proc/self/fd/1 -> a pipe: opened through the links
                f.write(data.encode() if isinstance(data, str) else data)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, mode)
    except OSError as err:
        raise GpurigError(f"cannot write {path}: {err.strerror}", f"choose a writable {flag} path") from None


def output_path(target: str | Path, flag: str) -> tuple[Path, os.stat_result | None]:
    """(the file ``target`` leads to, what is there now or None): every link on the way checked; directories and block devices refused."""
    path = resolve_checked(target, flag)
    try:
        st = path.stat()
    except FileNotFoundError:
        return path, None
    except OSError as err:
        raise GpurigError(f"cannot write {target}: {err.strerror}", f"choose another {flag} path") from None
    if stat.S_ISDIR(st.st_mode):
        raise GpurigError(f"{flag} {target} is a directory", "give a file name" + (", or - for stdout" if flag in _STDOUT_FLAGS else ""))
    if stat.S_ISBLK(st.st_mode):
        # A disk: writing a report over it would destroy it, and replacing the node would break the system.
        raise GpurigError(f"{flag} {target} is a block device", "give a file name" + (", or - for stdout" if flag in _STDOUT_FLAGS else ""))
    return path, st


def output_dir(target: str | Path, flag: str) -> Path:
    """The directory ``target`` leads to (it may not exist yet), every link on the way checked; anything but a directory refused."""
    path = resolve_checked(target, flag)
    if path.exists() and not path.is_dir():
        raise GpurigError(f"{flag} {target} exists and is not a directory", f"give {flag} a new or an existing directory")
    return path


_STDOUT_FLAGS = ("--json", "--junit")
_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS


def resolve_checked(target: str | Path, flag: str) -> Path:
    """The path ``target`` leads to, resolved as the kernel would, refusing any symlink on the way owned by another user than this one or root.

    Links under /proc (``/dev/stdout`` -> ``/proc/self/fd/1`` -> ``pipe:[N]``) name
    no path: the walk stops at them and the kernel follows them on open.
    """
    text = os.fspath(target)
    pending = [p for p in text.split("/") if p not in ("", ".")]
    current = "/" if text.startswith("/") else os.getcwd()
    me = os.geteuid()
    followed = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            current = os.path.dirname(current)  # ``current`` holds no link, so its parent is the kernel's
            continue
        step = os.path.join(current, name)
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            return Path(os.path.join(step, *pending))  # nothing further exists to be a link
        except OSError as err:
            raise GpurigError(f"cannot write {text}: {step}: {err.strerror}", f"choose another {flag} path") from None
        if not stat.S_ISLNK(st.st_mode) or current.startswith("/proc/") or current == "/proc":
            current = step
            continue
        if st.st_uid not in (me, 0):
            named = text if step in (text, os.path.abspath(text)) else f"{text}: {step}"  # a folder on the way, or a link's link
            raise GpurigError(f"{flag} {named} is a symlink owned by another user (uid {st.st_uid})",
                              f"remove the link or choose another {flag} path")
        followed += 1
        if followed > _MAX_LINKS:
            raise GpurigError(f"{flag} path {text} has too many levels of symlinks", f"choose another {flag} path")
        link = os.readlink(step)
        pending[:0] = [p for p in link.split("/") if p not in ("", ".")]
        if link.startswith("/"):
            current = "/"
    return Path(current)


def shown(path: Path | None, root: Path) -> str:
    """A path as the user reads it: relative to the project when inside it."""
    if path is None:
        return ""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def append_jsonl(path: Path, entries: Iterable[dict[str, Any]], *, max_bytes: int, max_line: int,
                 shrink: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Path:
    """Append each entry to a history file as one JSON line, one ``write`` each to a file opened with O_APPEND (two writers never
    interleave within a line); past ``max_bytes`` the file becomes ``NAME.1`` first (the one before is dropped). A torn last line
    (a writer killed mid-write) is ended with a newline; a line over ``max_line`` is ``shrink``'s entry, cut to the bound."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if os.lstat(path).st_size > max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")
        for entry in entries:
            line = (json.dumps(entry, separators=(",", ":"), default=str) + "\n").encode()
            if len(line) > max_line:
                line = (json.dumps((shrink or dict)(entry), separators=(",", ":"), default=str) + "\n").encode()[:max_line]
            os.write(fd, line)
    finally:
        os.close(fd)
    return path


def read_jsonl(path: Path, *, max_bytes: int, max_line: int) -> tuple[list[dict[str, Any]], list[dict[str, str]], int]:
    """A history file and its rotated ``NAME.1`` (that one first): every line that is a JSON object, oldest first; the files that
    could not be read ({path, why}); how many were read. A torn or oversized line is skipped; a link, a device or a file over the
    bound is named, never read."""
    entries: list[dict[str, Any]] = []
    unread: list[dict[str, str]] = []
    files = 0
    bound = 2 * max_bytes + max_line
    for each in (path.with_name(path.name + ".1"), path):
        try:
            st = os.lstat(each)
        except FileNotFoundError:
            continue
        except OSError as err:
            unread.append({"path": str(each), "why": err.strerror or str(err)})
            continue
        if not stat.S_ISREG(st.st_mode):
            unread.append({"path": str(each), "why": "not a regular file (a link or a device is not gpurig's history)"})
            continue
        if st.st_size > bound:
            unread.append({"path": str(each), "why": f"{st.st_size} bytes, over gpurig's bound of {bound}"})
            continue
        try:
            with open(each, "rb") as fh:
                data = fh.read(bound + 1)
        except OSError as err:
            unread.append({"path": str(each), "why": err.strerror or str(err)})
            continue
        files += 1
        for raw in data.splitlines():
            if len(raw) > max_line:
                continue
            try:
                entry = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if isinstance(entry, dict):
                entries.append(entry)
    return entries, unread, files
