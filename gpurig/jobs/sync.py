"""The working directory to a host, moving only what changed: the host's manifest, the difference, one tar of it.

Like rsync's quick check, a file is sent when the host lacks it, or its size,
its modification time (whole seconds) or its executable bits differ; a link
when its target differs. What the host holds and the working directory no
longer has is deleted there. The difference travels as one tar over the
host's SSH connection (one round trip for the manifest, one for the tar);
the host stages it and moves it into place only once the whole of it arrived,
so a full disk or a lost connection leaves the last synced copy as it was.
A job's own files (its job.json, the agent, the sampler) ride in the same tar.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import stat
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpurig.errors import GpurigError
from gpurig.jobs.remote import JobAgent
from gpurig.jobs.tree import Entry, Tree

CONTROL = "gpurig-sync.json"
EXEC_BITS = 0o111


@dataclass(frozen=True)
class SyncPlan:
    """What a sync sends and deletes, and what stays as it is."""

    send: tuple[Entry, ...]
    delete: tuple[str, ...]
    unchanged: int

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.send if e.kind == "file")

    @property
    def files(self) -> int:
        return sum(1 for e in self.send if e.kind != "dir")


@dataclass(frozen=True)
class SyncResult:
    """What a sync did: the plan, and what the host said it moved into place."""

    plan: SyncPlan
    moved: int
    sent_bytes: int  # the tar's size on the wire (headers included)


def sync_key(workdir: Path) -> str:
    """The host's folder for this working directory of this machine: its name, and a digest of where it is."""
    where = f"{socket.gethostname()}:{workdir.resolve()}"
    name = re.sub(r"[^A-Za-z0-9._-]", "_", workdir.resolve().name)[:48].lstrip("._-") or "workdir"
    return f"{name}-{hashlib.sha256(where.encode()).hexdigest()[:10]}"


def plan_sync(tree: Tree, remote: Mapping[str, list]) -> SyncPlan:
    """Compare the local tree with the host's manifest (path -> [kind, size, mtime, mode(, target)])."""
    send: list[Entry] = []
    unchanged = 0
    for entry in tree.entries:
        theirs = remote.get(entry.path)
        if theirs is None or theirs[0] != entry.kind or _differs(entry, theirs):
            send.append(entry)
        else:
            unchanged += 1
    local = {e.path for e in tree.entries}
    gone = {p for p in remote if p not in local}
    # a folder that goes takes its contents with it: name only the top of each removed subtree
    tops = sorted(p for p in gone if not any(q in gone for q in _parents(p)))
    return SyncPlan(tuple(send), tuple(tops), unchanged)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _differs(entry: Entry, theirs: list) -> bool:
    if entry.kind == "file":
        return theirs[1] != entry.size or theirs[2] != entry.mtime or (theirs[3] & EXEC_BITS) != (entry.mode & EXEC_BITS)
    if entry.kind == "link":
        return (theirs[4] if len(theirs) > 4 else None) != entry.target
    return False


class _Pipe(io.RawIOBase):
    """A write-only file whose bytes go to ``write`` (tarfile's stream mode writes through it), counted."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        chunk = bytes(data)
        self._write(chunk)
        self.count += len(chunk)
        return len(chunk)


def tar_feed(tree: Tree, plan: SyncPlan, job: str | None = None, job_files: Mapping[str, bytes] | None = None,
             counted: list[int] | None = None) -> Callable[[Callable[[bytes], None]], None]:
    """The ``Streams.feed`` writing the tar: the control document, the job's files, then every entry to send."""

    def feed(write: Callable[[bytes], None]) -> None:
        pipe = _Pipe(write)
        # 1 MiB writes: every write is a Python call down to the SSH channel, and 10 kB records made a sync of 1 GB cost 100,000 of them
        with tarfile.open(fileobj=pipe, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1 << 20) as tar:
            _add_bytes(tar, CONTROL, json.dumps({"delete": list(plan.delete), "job": job}).encode(), 0o600)
            for name, data in sorted((job_files or {}).items()):
                _add_bytes(tar, f"job/{name}", data, 0o600)
            for entry in plan.send:
                _add_entry(tar, tree.root, entry)
        if counted is not None:
            counted.append(pipe.count)

    return feed


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _add_entry(tar: tarfile.TarFile, root: Path, entry: Entry) -> None:
    info = tarfile.TarInfo(f"code/{entry.path}")
    info.mode, info.mtime = entry.mode, entry.mtime
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return
    if entry.kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, entry.target or ""
        tar.addfile(info)
        return
    path = root / entry.path
    try:
        with _open_scanned(path, entry.path) as f:
            size = _size(f)
            if size != entry.size:
                raise GpurigError(f"{entry.path} changed while it was being sent", "run again once nothing writes to it")
            info.size = size
            tar.addfile(info, f)
    except OSError as err:
        raise GpurigError(f"cannot read {path}: {err.strerror or err}", "fix its permissions, or add it to .gpurigignore") from None


def _size(f) -> int:
    import os

    return os.fstat(f.fileno()).st_size


def sync(agent: JobAgent, key: str, tree: Tree, *, job: str | None = None, job_files: Mapping[str, bytes] | None = None,
         timeout: float | None = None) -> SyncResult:
    """Sync ``tree`` into the host's folder ``key`` (and leave the job's bundle there): two round trips."""
    remote = agent.manifest(key)
    plan = plan_sync(tree, remote)
    counted: list[int] = []
    said = agent.apply(key, tar_feed(tree, plan, job, job_files, counted), timeout=timeout)
    return SyncResult(plan, int(said.get("files") or 0), counted[0] if counted else 0)


def _open_scanned(path: Path, shown: str) -> BinaryIO:
    """The file the scan found, opened as it was then: a regular file, reached without following a link.

    A FIFO swapped in since the scan would hang the read (O_NONBLOCK, then a
    check on the open descriptor), and a link would send what it points to.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GpurigError(f"{shown} changed while it was being sent (it is no longer a regular file)", "run again once nothing changes it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
