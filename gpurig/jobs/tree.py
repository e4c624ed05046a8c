"""Which files of a working directory ``invoke run`` sends to the host, and why each of the others is not sent.

The walk is iterative, never follows a symlink, and never enters an ignored
directory, so an ignored dataset or virtualenv costs one entry however big it
is. The ignore files are ``.gpurigignore`` at the root if there is one (it
alone decides: a project can send what git ignores, or keep out what git
tracks), else every ``.gitignore`` with ``.git/info/exclude``, as git reads
them. A few paths are ignored whatever those files say.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpurig.deploy.progress import human_size
from gpurig.errors import GpurigError, counted
from gpurig.jobs.ignore import IgnoreRules

# .git is the local repository (a file in a worktree); .gpurig-runs is where fetched artifacts land.
ALWAYS_IGNORED: tuple[str, ...] = ("/.git", "/.gpurig-runs")
MAX_ENTRIES = 1_000_000
MAX_IGNORE_FILE = 4 * 1024 * 1024  # far more than any real ignore file; a bigger one is a mistake, not patterns
GPURIGIGNORE = ".gpurigignore"

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_DENIED = "cannot be read (permission denied), not synced"


class TreeError(GpurigError):
    """A working directory that cannot be scanned: missing, not a directory, too big, or with an unreadable ignore file."""


@dataclass(frozen=True)
class Entry:
    """One thing to recreate on the host: a file (size, mtime, mode), a directory (mode) or a symlink (its link text)."""

    path: str  # posix, relative to the root, no leading "./"
    kind: Literal["file", "dir", "link"]
    size: int = 0
    mtime: int = 0  # whole seconds, files only: with the size, what says a file changed
    mode: int = 0  # permission bits (stat.S_IMODE), executable bits included; 0 for a link
    target: str = ""  # a link's text, always relative and resolving inside the root


@dataclass(frozen=True)
class Skipped:
    """A path that is not ignored but cannot be sent, and the one line a user reads about it."""

    path: str  # as a user reads it: bytes that are not UTF-8 are shown as \\xNN
    why: str


@dataclass(frozen=True)
class Tree:
    """A scanned working directory: what to send (sorted by path), what could not be, how many paths the ignore files left out."""

    root: Path
    entries: tuple[Entry, ...]
    skipped: tuple[Skipped, ...]
    ignored: int  # ignored files and directories together; an ignored directory counts once, its contents not at all
    rules: str  # which ignore files decided: ".gpurigignore" or ".gitignore"

    def summary(self) -> str:
        """One line: what is sent, how big, and how much was skipped and ignored."""
        files = [e for e in self.entries if e.kind == "file"]
        links = sum(e.kind == "link" for e in self.entries)
        parts = [f"{counted(len(files), 'file')} ({human_size(sum(e.size for e in files))})", counted(len(self.entries) - len(files) - links, "folder")]
        if links:
            parts.append(counted(links, "link"))
        if self.skipped:
            parts.append(f"{len(self.skipped):,} skipped")
        parts.append(f"{self.ignored:,} ignored by {self.rules}")
        return ", ".join(parts)


def scan(root: Path | str, *, always_ignored: Sequence[str] = ALWAYS_IGNORED, max_entries: int = MAX_ENTRIES) -> Tree:
    """Walk ``root`` and sort what is in it into entries to send, skipped paths (with why) and a count of ignored ones.

    ``always_ignored`` are gitignore patterns relative to the root that no
    ignore file can undo. Raises TreeError for a root that is missing or not a
    directory, an ignore file that cannot be read, or more than
    ``max_entries`` entries and skipped paths together.
    """
    root = Path(os.path.abspath(root))
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            raise TreeError(f"the working directory {root} is not a directory", "run from your project's folder, or pass a folder")
    except (FileNotFoundError, NotADirectoryError):
        raise TreeError(f"the working directory {root} does not exist", "run from your project's folder, or pass one that exists") from None
    except PermissionError:
        raise TreeError(f"cannot read the working directory {root}: permission denied", "run as a user who can read it") from None
    always = IgnoreRules()
    always.add("", "\n".join(always_ignored), "the paths gpurig never sends")
    rules, own = _top_rules(root)
    walk = _Walk(root, os.path.realpath(root), always, rules, not own, max_entries)
    walk.run()
    return Tree(root, tuple(sorted(walk.entries, key=lambda e: e.path)), tuple(sorted(walk.skipped, key=lambda s: s.path)), walk.ignored,
                GPURIGIGNORE if own else ".gitignore")


def _top_rules(root: Path) -> tuple[IgnoreRules, bool]:
    """The rules known before the walk, and whether they are .gpurigignore's (then no .gitignore is read)."""
    rules = IgnoreRules()
    own = root / GPURIGIGNORE
    if os.path.lexists(own):
        # followed if it is a symlink: `ln -s .gitignore .gpurigignore` is a fair way to say "git's root rules, nothing else"
        try:
            data = _read(own, follow=True)
        except PermissionError:
            data = None
        if data is None:
            raise TreeError(f"{own} is not a readable file", f"make {GPURIGIGNORE} a regular, readable file, or remove it to use .gitignore")
        rules.add("", data, GPURIGIGNORE)
        return rules, True
    exclude = _info_exclude(root)
    if exclude is not None:
        try:
            data = _read(exclude, follow=True)
        except PermissionError:
            data = None  # outside the tree and git's own business; git only warns about it too
        if data:
            rules.add("", data, ".git/info/exclude")
    return rules, False


def _info_exclude(root: Path) -> Path | None:
    """.git/info/exclude, or the common git directory's for a worktree (whose .git is a file saying "gitdir: ...").

    .git, and the gitdir and commondir it leads to, are read by ``_read`` as every ignore file is: a FIFO or
    /dev/zero there must not hang or fill the scan, and what is no readable file means no exclude file.
    """
    dot_git = root / ".git"
    if dot_git.is_dir():
        return dot_git / "info" / "exclude"
    first = _first_line(dot_git)
    if first is None or not first.startswith("gitdir: "):
        return None
    gitdir = root / first.removeprefix("gitdir: ").strip()
    common = _first_line(gitdir / "commondir")
    return (gitdir / common.strip() if common else gitdir) / "info" / "exclude"


def _first_line(path: Path) -> str | None:
    try:
        data = _read(path, follow=True)
    except (PermissionError, TreeError):
        return None
    return data.decode("utf-8", "replace").split("\n", 1)[0] if data else None


def _read(path: Path | str, *, follow: bool, dir_fd: int | None = None) -> bytes | None:
    """An ignore file's bytes; None if it is no regular file (or, in-tree, a symlink, which git does not follow either).

    PermissionError passes through: what to do about an ignore file that cannot be read depends on which one it is.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)  # O_NONBLOCK: a FIFO must not hang us
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None
        raise TreeError(f"cannot read {path}: {e.strerror}", "make it a readable file, or remove it") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_IGNORE_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_IGNORE_FILE:
        raise TreeError(f"{path} is over {MAX_IGNORE_FILE // 2**20} MiB, too big to be an ignore file", "shorten it, or remove it")
    return data


class _Walk:
    """One scan's state: a stack of directories to list, and what was found so far."""

    def __init__(self, root: Path, real_root: str, always: IgnoreRules, rules: IgnoreRules, read_gitignores: bool, max_entries: int) -> None:
        self.root, self.real_root, self.always, self.rules = str(root), real_root, always, rules
        self.read_gitignores, self.max_entries = read_gitignores, max_entries
        self.entries: list[Entry] = []
        self.skipped: list[Skipped] = []
        self.ignored = 0
        self.euid = os.geteuid()
        self.effective_ids = os.access in os.supports_effective_ids
        self.stack: list[tuple[str, int]] = []

    def run(self) -> None:
        self.stack.append(("", 0))
        while self.stack:
            rel, mode = self.stack.pop()
            full = os.path.join(self.root, rel) if rel else self.root
            try:
                # Listed, stat'ed and its .gitignore opened through the folder's descriptor: by path, each
                # system call walked every level again, and a tree 2,000 folders deep cost 2,000 x 2,000 steps.
                dir_fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except PermissionError:
                if not rel:
                    raise TreeError(f"cannot list the working directory {full}: permission denied", "run as a user who can read it") from None
                self.skip(rel, "is a folder that cannot be listed (permission denied), nothing in it is synced")
                continue
            except (FileNotFoundError, NotADirectoryError):
                self.skip(rel, "disappeared during the scan, not synced")
                continue
            except OSError as err:
                if not rel:
                    raise TreeError(f"cannot list the working directory {full}: {err.strerror}", "run from a folder you can list") from None
                # a path past PATH_MAX (ENAMETOOLONG), an I/O error: that folder alone is left out, and said so
                self.skip(rel, f"is a folder that cannot be listed ({err.strerror}), nothing in it is synced")
                continue
            try:
                self.folder(rel, mode, full, dir_fd)
            finally:
                os.close(dir_fd)

    def folder(self, rel: str, mode: int, full: str, dir_fd: int) -> None:
        """Take one folder's .gitignore, keep the folder, and sort what is in it."""
        if self.read_gitignores and not self.gitignore(rel, full, dir_fd):
            return
        if rel:
            self.keep(Entry(rel, "dir", mode=mode))
        with os.scandir(dir_fd) as listing:  # a duplicate of dir_fd: its entries' stat() is fstatat() in the folder
            for item in listing:
                found = self.entry(rel, full, item)
                if found is not None:
                    self.stack.append(found)
                    self.count()

    def gitignore(self, rel: str, full: str, dir_fd: int) -> bool:
        """Take the directory's .gitignore, if any, before anything in it is sorted; False if it cannot be read."""
        try:
            data = _read(".gitignore", follow=False, dir_fd=dir_fd)
        except PermissionError:
            if not rel:
                raise TreeError(f"cannot read {full}/.gitignore: permission denied, so what it ignores is unknown", "make it readable, or remove it") from None
            # failing closed for this folder alone: sending what its .gitignore may have kept out would be worse than sending none of it
            self.skip(rel, "has a .gitignore that cannot be read (permission denied), so nothing in it is synced")
            return False
        if data:
            self.rules.add(rel, data, posixpath.join(rel, ".gitignore"))
        return True

    def keep(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.count()

    def skip(self, path: str, why: str) -> None:
        self.skipped.append(Skipped(_shown_path(path), why))
        self.count()

    def count(self) -> None:
        if len(self.entries) + len(self.skipped) + len(self.stack) > self.max_entries:
            raise TreeError(f"the working directory {self.root} has more than {counted(self.max_entries, 'entry', 'entries')} to send",
                            f"add what the job does not need (datasets, checkpoints, environments) to {GPURIGIGNORE}")

    def entry(self, parent: str, folder: str, item: os.DirEntry) -> tuple[str, int] | None:
        """Sort one directory entry; a directory to walk comes back as (path, mode)."""
        path = f"{parent}/{item.name}" if parent else item.name
        try:
            is_dir = item.is_dir(follow_symlinks=False)  # from the listing's d_type: an ignored entry costs no stat
        except OSError:
            is_dir = False
        if self.always.excluded(path, is_dir) or self.rules.excluded(path, is_dir):
            self.ignored += 1
            return None
        if not _utf8(item.name):
            self.skip(path, "has a name that is not valid UTF-8, so it cannot be sent; rename it or ignore it")
            return None
        try:
            st = item.stat(follow_symlinks=False)
        except PermissionError:
            self.skip(path, _DENIED)
            return None
        except FileNotFoundError:
            self.skip(path, "disappeared during the scan, not synced")
            return None
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            return path, stat.S_IMODE(mode)
        if stat.S_ISREG(mode):
            if self.readable(os.path.join(folder, item.name), st):
                self.keep(Entry(path, "file", st.st_size, st.st_mtime_ns // 1_000_000_000, stat.S_IMODE(mode)))
            else:
                self.skip(path, _DENIED)
        elif stat.S_ISLNK(mode):
            self.link(parent, path, os.path.join(folder, item.name))
        else:
            self.skip(path, special(mode))
        return None

    def readable(self, full: str, st: os.stat_result) -> bool:
        """Whether this process may read a file: told before sending, not found out halfway through a sync."""
        if st.st_uid == self.euid and st.st_mode & stat.S_IRUSR:
            return True  # the common case, decided without another system call
        return os.access(full, os.R_OK, effective_ids=self.effective_ids)

    def link(self, parent: str, path: str, full: str) -> None:
        """Keep a symlink that stays inside the root by its text and by the real filesystem; skip any other, saying why."""
        try:
            target = os.readlink(full)
        except PermissionError:
            self.skip(path, _DENIED)
            return
        except OSError:
            self.skip(path, "disappeared during the scan, not synced")
            return
        if not _utf8(target):
            self.skip(path, f"is a symlink to {_shown_path(target)!r}, which is not valid UTF-8, so it cannot be sent")
            return
        shown = target if target.isprintable() else repr(target)
        if os.path.isabs(target):
            self.skip(path, f"is an absolute symlink (to {shown}), not synced: make it relative to a path inside the working directory")
            return
        lexical = posixpath.normpath(posixpath.join(parent, target))
        if lexical == ".." or lexical.startswith("../"):
            self.skip(path, f"is a symlink to {shown}, outside the working directory, not synced")
            return
        real = os.path.realpath(full)
        if real != self.real_root and not real.startswith(self.real_root.rstrip("/") + "/"):
            self.skip(path, f"is a symlink to {shown}, which resolves to {_shown_path(real)}, outside the working directory, not synced")
            return
        try:
            os.stat(full)
        except OSError as e:
            problem = "a symlink loop" if e.errno == errno.ELOOP else "nothing there"
            self.skip(path, f"is a dangling symlink (to {shown}: {problem}), not synced")
            return
        self.keep(Entry(path, "link", target=target))


def special(mode: int) -> str:
    """Why a FIFO, socket or device (anything not a file, folder or symlink) is not sent."""
    kind = next((name for test, name in _KINDS if test(mode)), "not a file, folder or symlink")
    return f"is {kind}, not synced"


def _utf8(name: str) -> bool:
    """Whether a name from the filesystem is valid UTF-8 (Python carries other bytes as lone surrogates)."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown_path(path: str) -> str:
    return path if _utf8(path) else os.fsencode(path).decode("utf-8", "backslashreplace")
