"""The tree scan `invoke run` syncs from: what git would list is what is sent, and every other path has a reason or is counted as ignored.

git must be installed: a missing git fails these tests rather than skipping them. The tests run as
root, whom permission bits do not stop, so the permission-denied paths are reached by making the
calls that would be refused (os.scandir, os.open, os.access) raise or answer as they would for a user.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from gpurig.jobs import tree as tree_module
from gpurig.jobs.tree import Entry, TreeError, scan, special

ROOT_GITIGNORE = "\n".join([
    "# build products",
    "*.log",
    "!keep.log",
    "/build/",
    "data/**/raw/",
    "\\#hash",
    "\\!bang",
    "trail   ",
    "esc\\ ",
    "[Tt]emp/",
    "*.py[co]",
    "**/node_modules",
    "logs/**",
    "!logs/important.txt",
    "cache/",
    "!cache/keep",
    "ignored_dir/",
    "one?",
    "[!a-c]x",
]) + "\n"

SUB_GITIGNORE = "!*.log\n/local\ndeep/*.tmp\n!secret.txt\n"
DEEP_GITIGNORE = "!x.tmp\n"

FILES = [
    "a.py", "a.pyc", "b.pyo", "x.log", "keep.log", "#hash", "!bang", "trail", "trail ", "esc ", "esc", "temp/t", "Temp/t", "tempfile",
    "build/out", "src/build/out", "data/set/raw/f", "data/raw/f", "data/set/cooked/f", "node_modules/m.js", "src/node_modules/m.js",
    "logs/a.txt", "logs/important.txt", "logs/deep/b.txt", "cache/keep", "cache/other", "ignored_dir/x", "one1", "one12", "ax", "dx",
    "sub/x.log", "sub/local", "sub/a/local", "sub/deep/a.tmp", "sub/deep/x.tmp", "sub/deep/deeper/y.tmp", "sub/secret.txt", "secret.txt",
    "name with space", "line\nbreak", "ünïcode.txt", ".hidden", ".gpurig-runs/run1/out.pt", "empty_dir_parent/f",
]


def _git(cwd: Path, *args: str) -> bytes:
    """git with no system or user configuration (no global excludes file), failing the test if git is missing or fails."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": str(cwd), "XDG_CONFIG_HOME": str(cwd),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True, timeout=120).stdout


def _git_lists(repo: Path) -> set[str]:
    out = _git(repo, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def _sent(tree) -> set[str]:
    """What git would list of a scan: its files and links, kept or skipped (git lists a symlink however it points)."""
    return {e.path for e in tree.entries if e.kind != "dir"} | {s.path for s in tree.skipped}


def _write(root: Path, files: list[str], ignores: dict[str, str]) -> None:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    for directory, text in ignores.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / ".gitignore").write_text(text)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    _git(root, "init", "-q")
    _write(root, FILES, {"": ROOT_GITIGNORE, "sub": SUB_GITIGNORE, "sub/deep": DEEP_GITIGNORE})
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("secret.txt\n")
    (root / "empty_dir_parent" / "empty").mkdir()
    os.symlink("a.py", root / "link_to_file")
    os.symlink("sub", root / "link_to_dir")
    os.symlink("../sub/x.log", root / "src" / "up_and_back")
    return root


def test_scan_sends_exactly_what_git_lists(repo):
    tree = scan(repo)
    assert _sent(tree) == {p for p in _git_lists(repo) if not p.startswith(".gpurig-runs/")}
    assert not tree.skipped and tree.rules == ".gitignore"
    assert {"keep.log", "sub/x.log", "sub/deep/x.tmp", "logs/important.txt", "trail ", "esc", "line\nbreak", "sub/secret.txt"} <= _sent(tree)
    assert not {"cache/keep", "sub/local", "secret.txt", "esc ", "trail", "#hash", "!bang", "one1"} & _sent(tree)


def test_what_scan_ignores_is_what_git_reports_ignored(repo):
    tree = scan(repo)
    out = _git(repo, "ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z")
    ignored_by_git = {os.fsdecode(p) for p in out.split(b"\0") if p}
    assert tree.ignored == len(ignored_by_git) + 2  # .git and .gpurig-runs, which git never reports


def test_entries_carry_size_mtime_mode_and_link_text_sorted_by_path(repo):
    (repo / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(repo / "run.sh", 0o755)
    os.chmod(repo / "sub", 0o750)
    os.utime(repo / "a.py", ns=(1_700_000_000_900_000_000, 1_700_000_000_900_000_000))
    entries = {e.path: e for e in scan(repo).entries}
    assert entries["run.sh"] == Entry("run.sh", "file", 10, int(os.stat(repo / "run.sh").st_mtime), 0o755)
    assert entries["a.py"].mtime == 1_700_000_000 and entries["a.py"].size == len("a.py")
    assert entries["sub"] == Entry("sub", "dir", mode=0o750)
    assert entries["empty_dir_parent/empty"].kind == "dir"
    assert entries["link_to_dir"] == Entry("link_to_dir", "link", target="sub")
    assert entries["src/up_and_back"].target == "../sub/x.log"
    assert not any(p.startswith("link_to_dir/") for p in entries), "a link to a directory is not walked into"
    paths = list(entries)
    assert paths == sorted(paths) and not any(p.startswith(("./", "/")) or p.endswith("/") for p in paths)


def test_an_ignored_directory_is_not_walked_into(repo, monkeypatch):
    listed = []
    real = os.open

    def opened(path, flags, *args, **kw):
        if flags & os.O_DIRECTORY:  # each folder the walk lists is opened so first
            listed.append(os.path.relpath(path, repo))
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(tree_module.os, "open", opened)
    scan(repo)
    assert "node_modules" not in listed and "build" not in listed and ".git" not in listed and ".gpurig-runs" not in listed
    assert "logs" in listed and "sub/deep" in listed


def test_the_paths_gpurig_never_sends_stay_out_whatever_the_files_say(repo):
    (repo / ".gitignore").write_text("!.git\n!.gpurig-runs/\n!/.gpurig-runs/**\n")
    paths = {e.path for e in scan(repo).entries}
    assert not any(p.split("/")[0] in (".git", ".gpurig-runs") for p in paths)
    (repo / "model.ckpt").write_text("x")
    paths = {e.path for e in scan(repo, always_ignored=("/.git", "*.ckpt")).entries}
    assert "model.ckpt" not in paths and ".gpurig-runs/run1/out.pt" in paths


def test_a_worktree_reads_the_common_info_exclude(tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    _git(main, "init", "-q")
    (main / "tracked").write_text("t")
    _git(main, "add", "tracked")
    _git(main, "commit", "-q", "-m", "one")
    _git(main, "worktree", "add", "-q", str(tmp_path / "wt"))
    (main / ".git" / "info").mkdir(exist_ok=True)
    (main / ".git" / "info" / "exclude").write_text("secret\n")
    for name in ("secret", "open"):
        (tmp_path / "wt" / name).write_text(name)
    tree = scan(tmp_path / "wt")
    assert (tmp_path / "wt" / ".git").is_file()
    assert _sent(tree) == _git_lists(tmp_path / "wt") == {"tracked", "open"}



def _scan_bounded(root: Path):
    """scan(root), where a hang fails the test instead of stopping it."""
    import threading

    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(scan(root)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the scan hung"
    return outcome[0]


@pytest.mark.parametrize("where", [".git", "gitdir", "commondir"])
@pytest.mark.parametrize("what", ["fifo", "zero"])
def test_a_fifo_or_dev_zero_as_git_files_is_no_exclude_file(tmp_path, where, what):
    # .git, and the files it leads to in a worktree, are read as every ignore file: never blocking, never past 4 MiB
    work, gitdir = tmp_path / "work", tmp_path / "gitdir"
    work.mkdir()
    gitdir.mkdir()
    (work / "f").write_text("x")
    (work / ".git").write_text(f"gitdir: {gitdir}\n")
    (gitdir / "commondir").write_text(".\n")
    path = {".git": work / ".git", "gitdir": gitdir / "commondir", "commondir": gitdir / "commondir"}[where]
    if where == "gitdir":
        (work / ".git").write_text(f"gitdir: {gitdir / 'sub'}\n")
        gitdir.joinpath("sub").mkdir()
        path = gitdir / "sub" / "commondir"
    path.unlink(missing_ok=True)
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    assert [e.path for e in _scan_bounded(work).entries] == ["f"]


def test_a_tree_two_thousand_folders_deep_is_walked_in_linear_time(tmp_path):
    import time

    (tmp_path / ".gitignore").write_text("*.tmp\n")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(2000):  # made through descriptors: by path, making it would be quadratic itself
            os.mkdir("a", dir_fd=fd)
            inner = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("x.tmp", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        os.close(os.open("x.py", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    start = time.process_time()  # this process's CPU, user and kernel: other jobs on a shared machine cannot move it
    try:
        tree = _scan_bounded(tmp_path)
        used = time.process_time() - start  # the scan alone, not the removal below
    finally:
        _remove_deep(tmp_path)
    assert len(tree.entries) == 2000 + 2 and tree.ignored == 1  # the folders, .gitignore and x.py
    assert used < 3, f"{used:.1f} s of CPU"  # was 21 s; now about 0.35 s


def _remove_deep(root: Path) -> None:
    """Remove a deep tree now: pytest's clean-up of old tmp_paths uses shutil.rmtree, which recurses, and fails on it later."""
    for child in root.iterdir():
        subprocess.run(["rm", "-rf", "--", str(child)], check=True)  # GNU rm walks without recursing


def test_a_folder_past_path_max_is_skipped_saying_why(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    name = "d" * 200
    try:
        for _ in range(25):  # 25 x 201 bytes: past Linux's PATH_MAX of 4,096
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    try:
        tree = _scan_bounded(tmp_path)
    finally:
        _remove_deep(tmp_path)
    assert len(tree.skipped) == 1 and "cannot be listed (File name too long)" in tree.skipped[0].why

_NAME_POOL = ["a", "b", "ab", "a.log", "b.tmp", "#c", "!d", "e ", "x", "deep", "[x]", "é"]
_PATTERN_POOL = ["a", "/a", "a/", "*.log", "!*.log", "!a", "b*", "**/x", "deep/**", "!deep/x", "/deep/", "*/b", "?", "[ab]", "[!a]*",
                 "\\#c", "\\!d", "e\\ ", "e ", "a/**/b", "**/", "!**/", "x/", "!x", "*", "!ab", "é", "[[:alpha:]]"]


def test_random_trees_send_what_git_lists(tmp_path):
    rng = random.Random(7)
    root = tmp_path / "work"
    root.mkdir()
    _git(root, "init", "-q")
    for _ in range(60):
        for child in root.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        files = set()
        for _ in range(25):
            parts = [rng.choice(_NAME_POOL) for _ in range(rng.randint(1, 4))]
            if not any("/".join(parts[:k]) in files or any(f.startswith("/".join(parts[:k]) + "/") for f in files if k == len(parts))
                       for k in range(1, len(parts) + 1)):
                files.add("/".join(parts))
        dirs = sorted({"/".join(f.split("/")[:k]) for f in files for k in range(0, f.count("/") + 1)})
        ignores = {d: "\n".join(rng.choice(_PATTERN_POOL) for _ in range(rng.randint(1, 5))) + "\n" for d in rng.sample(dirs, min(3, len(dirs)))}
        _write(root, sorted(files), ignores)
        assert _sent(scan(root)) == _git_lists(root), ignores


def test_gpurigignore_alone_decides(repo):
    (repo / ".gpurigignore").write_text("data/\n*.pyc\n")
    tree = scan(repo)
    sent = _sent(tree)
    assert tree.rules == ".gpurigignore"
    assert {"x.log", "build/out", "sub/local", "secret.txt", "node_modules/m.js", "cache/other"} <= sent, ".gitignore and info/exclude are not read"
    assert not {p for p in sent if p.startswith("data/") or p.endswith(".pyc")}
    assert ".gpurigignore" in sent and ".gitignore" in sent


def test_gpurigignore_may_be_a_symlink_but_must_be_a_readable_file(repo):
    os.symlink(".gitignore", repo / ".gpurigignore")
    tree = scan(repo)
    assert tree.rules == ".gpurigignore" and "x.log" not in _sent(tree) and "sub/local" in _sent(tree)
    os.unlink(repo / ".gpurigignore")
    (repo / ".gpurigignore").mkdir()
    with pytest.raises(TreeError, match=r"\.gpurigignore is not a readable file; fix: make \.gpurigignore a regular, readable file"):
        scan(repo)


def test_a_symlinked_gitignore_is_not_followed_as_git_does_not(repo):
    (repo / "sub" / "patterns").write_text("*\n")
    os.symlink("patterns", repo / "sub" / "deep" / ".gitignore.tmp")
    os.replace(repo / "sub" / "deep" / ".gitignore.tmp", repo / "sub" / "deep" / ".gitignore")
    assert _sent(scan(repo)) == {p for p in _git_lists(repo) if not p.startswith(".gpurig-runs/")}
    assert "sub/deep/.gitignore" in _sent(scan(repo))


def _reasons(tree) -> dict[str, str]:
    return {s.path: s.why for s in tree.skipped}


def test_symlinks_that_leave_the_tree_dangle_or_are_absolute_are_skipped_with_where_they_point(tmp_path):
    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("f")
    (root / "f").write_text("f")
    os.symlink("../elsewhere", root / "out")
    os.symlink("../../elsewhere/f", root / "sub" / "out_file")
    os.symlink(str(root / "f"), root / "absolute")
    os.symlink("nothing", root / "dangling")
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    os.symlink("../work/sub", root / "sub" / "out_and_back")
    os.symlink("sub", root / "dirlink")
    os.symlink("dirlink/out_file", root / "through_link")  # lexically inside, really outside
    os.symlink(".", root / "self")
    why = _reasons(scan(root))
    assert why["out"] == "is a symlink to ../elsewhere, outside the working directory, not synced"
    assert "outside the working directory" in why["sub/out_file"]
    assert why["absolute"].startswith(f"is an absolute symlink (to {root / 'f'}), not synced")
    assert why["dangling"] == "is a dangling symlink (to nothing: nothing there), not synced"
    assert why["loop1"] == "is a dangling symlink (to loop2: a symlink loop), not synced"
    real = os.path.realpath(tmp_path / "elsewhere" / "f")
    assert why["through_link"] == f"is a symlink to dirlink/out_file, which resolves to {real}, outside the working directory, not synced"
    assert "sub/out_and_back" in why, "a target that steps out of the root is refused even when it comes back"
    kept = {e.path: e.target for e in scan(root).entries if e.kind == "link"}
    assert kept == {"dirlink": "sub", "self": "."}


def test_fifos_sockets_and_devices_are_skipped(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "pipe")
    monkeypatch.chdir(tmp_path)  # a relative socket path: an AF_UNIX address is at most 108 bytes, and TMPDIR may be long
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind("sock")
        why = _reasons(scan(tmp_path))
    finally:
        server.close()
    assert why == {"pipe": "is a FIFO, not synced", "sock": "is a socket, not synced"}
    assert special(stat.S_IFCHR | 0o600) == "is a character device, not synced"
    assert special(stat.S_IFBLK | 0o600) == "is a block device, not synced"


def test_a_fifo_named_gitignore_does_not_hang_the_scan(tmp_path):
    os.mkfifo(tmp_path / ".gitignore")
    (tmp_path / "f").write_text("f")
    tree = scan(tmp_path)
    assert [e.path for e in tree.entries] == ["f"] and _reasons(tree) == {".gitignore": "is a FIFO, not synced"}


def test_names_that_are_not_utf8_are_skipped_unless_ignored_and_newlines_are_fine(tmp_path):
    root = os.fsencode(tmp_path)
    for name in (b"bad\xff", b"skip\xfe.tmp", b"ok\nname", b"dir\xfd"):
        os.close(os.open(root + b"/" + name, os.O_CREAT | os.O_WRONLY)) if not name.startswith(b"dir") else os.mkdir(root + b"/" + name)
    (tmp_path / ".gitignore").write_text("*.tmp\n")
    tree = scan(tmp_path)
    assert _reasons(tree) == {"bad\\xff": "has a name that is not valid UTF-8, so it cannot be sent; rename it or ignore it",
                              "dir\\xfd": "has a name that is not valid UTF-8, so it cannot be sent; rename it or ignore it"}
    assert {e.path for e in tree.entries} == {"ok\nname", ".gitignore"} and tree.ignored == 1


def test_unreadable_folders_and_files_are_skipped(tmp_path, monkeypatch):
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "inside").write_text("x")
    (tmp_path / "secret").write_text("x")
    (tmp_path / "open").write_text("x")
    os.chmod(tmp_path / "secret", 0)  # no owner read bit: the scan asks os.access, which root's answer would not test
    real_open, real_access = os.open, os.access
    monkeypatch.setattr(tree_module.os, "open", lambda p, flags, *a, **kw: _denied(p) if str(p).endswith("locked") else real_open(p, flags, *a, **kw))
    monkeypatch.setattr(tree_module.os, "access", lambda p, mode, **kw: False if str(p).endswith("secret") else real_access(p, mode, **kw))
    tree = scan(tmp_path)
    assert _reasons(tree) == {"locked": "is a folder that cannot be listed (permission denied), nothing in it is synced",
                              "secret": "cannot be read (permission denied), not synced"}
    assert [e.path for e in tree.entries] == ["open"]


def _named(path, dir_fd) -> str:
    """The path an os.open call means: the walk opens .gitignore relative to its folder's descriptor."""
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path) if dir_fd is not None else str(path)


def _denied(path):
    raise PermissionError(13, "Permission denied", str(path))


def test_an_unreadable_gitignore_keeps_its_folder_out_or_stops_the_scan_at_the_root(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".gitignore").write_text("big\n")
    (tmp_path / "sub" / "big").write_text("x")
    (tmp_path / "f").write_text("x")
    real_open = os.open
    refused = {str(tmp_path / "sub" / ".gitignore"), str(tmp_path / ".gitignore")}
    monkeypatch.setattr(tree_module.os, "open", lambda p, flags, *a, dir_fd=None: _denied(p) if _named(p, dir_fd) in refused
                        and os.path.exists(_named(p, dir_fd)) else real_open(p, flags, *a, dir_fd=dir_fd))
    tree = scan(tmp_path)
    assert _reasons(tree) == {"sub": "has a .gitignore that cannot be read (permission denied), so nothing in it is synced"}
    assert [e.path for e in tree.entries] == ["f"]
    (tmp_path / ".gitignore").write_text("x\n")
    with pytest.raises(TreeError, match=r"cannot read .*/\.gitignore: permission denied.*; fix: make it readable"):
        scan(tmp_path)


def test_a_tree_over_the_bound_is_refused_with_the_fix(tmp_path):
    for k in range(10):
        (tmp_path / f"f{k}").write_text("x")
    assert len(scan(tmp_path, max_entries=10).entries) == 10
    with pytest.raises(TreeError, match=r"has more than 9 entries to send; fix: add what the job does not need .* to \.gpurigignore"):
        scan(tmp_path, max_entries=9)
    (tmp_path / "many").mkdir()
    for k in range(20):
        (tmp_path / "many" / f"g{k}").write_text("x")
    (tmp_path / ".gitignore").write_text("many/\n")
    assert len(scan(tmp_path, max_entries=11).entries) == 11, "ignored paths do not count"


def test_a_missing_root_or_a_file_is_refused(tmp_path):
    with pytest.raises(TreeError, match=r"does not exist; fix: "):
        scan(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TreeError, match=r"is not a directory; fix: "):
        scan(tmp_path / "file")


def test_the_summary_line_counts_what_is_sent_skipped_and_ignored(repo):
    os.mkfifo(repo / "pipe")
    tree = scan(repo)
    files = sum(e.kind == "file" for e in tree.entries)
    assert tree.summary().startswith(f"{files} files (")
    assert tree.summary().endswith(f", 3 links, 1 skipped, {tree.ignored} ignored by .gitignore")
