"""A job's artifacts back to this machine: only the files that differ, each checked against the host's sha256.

The host lists the job's artifact files with their sizes and sha256; a file
already here with the same digest is not moved. The rest come as one tar
over the connection, spooled and unpacked into a staging folder beside the
destination; each file's digest is checked, and only when every one matched
are they renamed into place. A full disk, a lost connection or a digest
that differs leaves the destination as it was (and says which, in one line).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpurig.errors import GpurigError, HostError, counted
from gpurig.files import RUNS, output_dir
from gpurig.jobs.remote import JobAgent


@dataclass(frozen=True)
class Fetched:
    into: Path
    files: tuple[str, ...]  # fetched now
    unchanged: int
    bytes: int

    def line(self) -> str:
        if not self.files and not self.unchanged:
            return f"no artifact files (nothing under the --artifacts paths) for {self.into}"
        moved = f"{len(self.files)} file{'s' if len(self.files) != 1 else ''} ({self.bytes} bytes)"
        return f"{moved} fetched into {self.into}, {self.unchanged} unchanged; sha256 checked"


def default_into(job: str, workdir: str, client: str, cwd: Path | None = None, here: str | None = None) -> Path:
    """Where ``fetch`` puts a job's artifacts without ``--into``: where ``run --wait`` does, WORKDIR/gpurig-runs/JOB.

    WORKDIR is the folder the job's record names when this machine submitted
    the job and the current directory is that folder or one inside it (the
    record is the host's word: no folder elsewhere is written on it); else
    the current directory.
    """
    cwd = cwd or Path.cwd()
    recorded = Path(workdir) if workdir else None
    if recorded is not None and recorded.is_absolute() and client == (here or socket.gethostname()):
        if cwd == recorded or recorded in cwd.parents:
            return recorded / RUNS / job
    return cwd / RUNS / job


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(agent: JobAgent, job: str, into: Path) -> Fetched:
    """The job's artifacts into ``into`` (made if missing): what differs is fetched, verified, then moved into place.

    Interrupted (Ctrl-C, SIGTERM), it says what ``into`` holds: nothing of this fetch (the files move only once all arrived).
    """
    from gpurig.connect.connection import CommandInterrupted

    try:
        listing = agent.artifacts(job)
    except CommandInterrupted:
        raise CommandInterrupted(f"fetching job {job}'s artifacts was interrupted before the host listed them; nothing was written into {into}",
                                 f"bring them with gpurig fetch {job} --into {into}", host=agent.conn.name) from None
    into = output_dir(into, "--into")
    wanted, unchanged = [], 0
    for rel, (size, digest, _mode, _mtime) in sorted(listing.items()):
        local = into / rel
        parts = PurePosixPath(rel).parts
        if not parts or ".." in parts or rel.startswith("/"):
            raise HostError(f"the host named an artifact {rel!r} outside the job's folder", "report this as a gpurig bug", host=agent.conn.name)
        if local.is_file() and not local.is_symlink() and local.stat().st_size == size and sha256_of(local) == digest:
            unchanged += 1
        else:
            wanted.append(rel)
    if not wanted:
        return Fetched(into, (), unchanged, 0)
    try:
        into.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".gpurig-fetch-", dir=into))
    except OSError as err:
        raise GpurigError(f"cannot write into {into}: {err.strerror}", "free space there, or choose another --into") from None
    try:
        try:
            moved = _receive(agent, job, wanted, listing, stage)
        except CommandInterrupted:
            kept = f"; the {counted(unchanged, 'file')} already there match the host's" if unchanged else ""
            raise CommandInterrupted(f"fetching job {job}'s artifacts was interrupted: {counted(len(wanted), 'file')} to fetch, none of them "
                                     f"moved into {into}{kept}", f"bring them with gpurig fetch {job} --into {into}",
                                     host=agent.conn.name) from None
        for rel in wanted:
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            os.replace(stage / "files" / rel, dest)
    except OSError as err:
        raise GpurigError(f"cannot write the artifacts into {into}: {err.strerror}; nothing was changed there",
                          "free space there (df -h), or choose another --into") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return Fetched(into, tuple(wanted), unchanged, moved)


def _receive(agent: JobAgent, job: str, wanted: list[str], listing: dict, stage: Path) -> int:
    """The tar of ``wanted`` spooled into ``stage``, unpacked there, every digest checked; the bytes of the files."""
    spool = stage / "artifacts.tar"
    with open(spool, "wb") as out:

        def write(data: bytes) -> None:
            out.write(data)

        agent.pack(job, wanted, write)
    names = set(wanted)
    got: set[str] = set()
    total = 0
    with tarfile.open(spool, "r:") as tar:
        for member in tar:
            if member.name not in names or not member.isfile():
                raise HostError(f"the host sent {member.name!r}, which was not asked for", "report this as a gpurig bug", host=agent.conn.name)
            dest = stage / "files" / member.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            with open(dest, "wb") as f:
                shutil.copyfileobj(source, f, 1 << 20)
            os.chmod(dest, member.mode & 0o755 | 0o600)
            os.utime(dest, (member.mtime, member.mtime))
            if sha256_of(dest) != listing[member.name][1]:
                raise HostError(f"{member.name} arrived with another sha256 than the host computed (it changed meanwhile, or was damaged)",
                                "fetch again once the job has stopped writing it", host=agent.conn.name)
            got.add(member.name)
            total += member.size
    missing = sorted(names - got)
    if missing:
        raise HostError(f"{counted(len(missing), 'artifact file')} did not arrive, e.g. {missing[0]} (removed meanwhile?)", "fetch again",
                        host=agent.conn.name)
    return total
