"""Every output a user names (--json, --csv, --plot, --record, init DIR) is written where the path leads, or refused: the whole path checked.

These tests run as root (the case that matters: root following another
user's link writes wherever that user chose). "Another user" is nobody, made
the owner of a link with lchown. Device nodes are made in tmp_path with
mknod, so no test can touch the machine's own /dev/null.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.errors import GpurigError
from gpurig.files import write_output, write_report
from gpurig.monitor.csvfile import CsvWriter
from gpurig.monitor.record import Recorder

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "fixtures" / "monitor" / "runs" / "input_bound"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="links of another user and device nodes need root to make")


def nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


def their_link(link: Path, target: Path) -> Path:
    """A symlink ``link`` -> ``target`` owned by another user."""
    link.symlink_to(target)
    os.lchown(link, nobody(), -1)
    return link


def gpurig(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)


# Each output, written through a folder on the way that is another user's symlink.
WRITERS = {
    "--json": lambda p: write_report(p / "report.json", {"a": 1}),
    "--plot": lambda p: write_output(p / "run.png", b"\x89PNG", "--plot"),
    "--csv": lambda p: CsvWriter(p / "samples.csv").close(),
    "--record": lambda p: Recorder(p / "run").close({}),
}


@pytest.mark.parametrize("flag", sorted(WRITERS))
def test_a_folder_on_the_way_that_is_another_users_symlink_is_refused(tmp_path, flag):
    victim = tmp_path / "etc"
    victim.mkdir()
    link = their_link(tmp_path / "reports", victim)
    with pytest.raises(GpurigError) as err:
        WRITERS[flag](link)
    assert f"{link} is a symlink owned by another user (uid {nobody()})" in str(err.value)
    assert str(err.value).startswith(flag)
    assert list(victim.iterdir()) == []  # nothing written where the link points


@pytest.mark.parametrize("flag", sorted(WRITERS))
def test_a_deeper_folder_on_the_way_is_checked_too(tmp_path, flag):
    victim = tmp_path / "etc"
    (victim / "sub").mkdir(parents=True)
    their_link(tmp_path / "reports", victim)
    with pytest.raises(GpurigError, match="symlink owned by another user"):
        WRITERS[flag](tmp_path / "reports" / "sub")
    assert list((victim / "sub").iterdir()) == []


@pytest.mark.parametrize("flag", sorted(WRITERS))
def test_links_of_this_user_are_followed(tmp_path, flag):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "mine").symlink_to(real)
    WRITERS[flag](tmp_path / "mine")
    assert len(list(real.iterdir())) == 1


def test_a_link_to_another_users_link_is_refused(tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text("keep\n")
    their_link(tmp_path / "theirs.json", victim)
    (tmp_path / "mine.json").symlink_to(tmp_path / "theirs.json")
    with pytest.raises(GpurigError, match=r"mine.json: .*theirs.json is a symlink owned by another user"):
        write_report(tmp_path / "mine.json", {"a": 1})
    assert victim.read_text() == "keep\n"


def test_dot_dot_after_a_link_goes_where_the_kernel_goes(tmp_path):
    """a/link/../r.json is written in the link target's parent, as open(2) would, not next to the link."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "deep").mkdir(parents=True)
    (tmp_path / "a" / "link").symlink_to(tmp_path / "b" / "deep")
    write_report(f"{tmp_path}/a/link/../r.json", {"a": 1})
    assert json.loads((tmp_path / "b" / "r.json").read_text()) == {"a": 1}
    assert not (tmp_path / "a" / "r.json").exists()


def char_device(path: Path) -> Path:
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    return path


@pytest.mark.parametrize("flag", ["--json", "--plot", "--csv"])
def test_a_character_device_is_written_to_never_replaced(tmp_path, flag):
    null = char_device(tmp_path / "null")
    try:
        if flag == "--json":
            write_report(null, {"a": 1})
        elif flag == "--plot":
            write_output(null, b"\x89PNG", "--plot")
        else:
            CsvWriter(null).close()
    except GpurigError as err:  # a nodev mount refuses to open it: refused is fine, replaced is not
        assert "cannot write" in str(err)
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temp file left beside it


@pytest.mark.parametrize("flag", ["--json", "--plot", "--csv"])
def test_a_block_device_is_refused(tmp_path, flag):
    disk = tmp_path / "disk"
    os.mknod(disk, 0o600 | stat.S_IFBLK, os.makedev(250, 250))  # no such disk: even a wrong open could harm nothing
    with pytest.raises(GpurigError, match="is a block device"):
        if flag == "--json":
            write_report(disk, {"a": 1})
        elif flag == "--plot":
            write_output(disk, b"\x89PNG", "--plot")
        else:
            CsvWriter(disk)
    assert stat.S_ISBLK(os.lstat(disk).st_mode)


def test_monitor_plot_to_a_character_device_leaves_the_device(tmp_path):
    null = char_device(tmp_path / "null")
    proc = gpurig("monitor", "--replay", str(RUN), "--plot", str(null), cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert proc.returncode == 0 or "cannot write" in proc.stderr, proc.stderr


def test_monitor_csv_through_another_users_link_is_one_line_and_writes_nothing(tmp_path):
    victim = tmp_path / "etc"
    victim.mkdir()
    their_link(tmp_path / "out", victim)
    proc = gpurig("monitor", "--replay", str(RUN), "--csv", str(tmp_path / "out" / "r.csv"), cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--csv" in proc.stderr and "symlink owned by another user" in proc.stderr
    assert list(victim.iterdir()) == []


def test_init_through_another_users_link_is_refused(tmp_path):
    victim = tmp_path / "etc"
    victim.mkdir()
    their_link(tmp_path / "projects", victim)
    proc = gpurig("init", str(tmp_path / "projects" / "new"), cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "symlink owned by another user" in proc.stderr
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("name", ["gpurig.yaml", ".hadolint.yaml", "images", "inventory"])
def test_init_refuses_a_target_holding_dangling_symlinks(tmp_path, name):
    target = tmp_path / "proj"
    target.mkdir()
    elsewhere = tmp_path / "elsewhere" / name
    (tmp_path / "elsewhere").mkdir()
    (target / name).symlink_to(elsewhere)  # dangling: exists() says no, open() would create elsewhere
    proc = gpurig("init", str(target), cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"holds symlinks named like gpurig's files ({name})" in proc.stderr
    assert not os.path.lexists(elsewhere)
    assert sorted(p.name for p in target.iterdir()) == [name]  # nothing else written


@pytest.mark.parametrize("task", [["fetch", "abc123"], ["run", "--wait", "-l", "gpu1"]])
def test_into_through_another_users_link_is_refused_before_anything_resolves_it(tmp_path, task):
    """`Path(into).resolve()` ran first: the check then saw the link's target, and artifacts went where it points."""
    victim = tmp_path / "etc"
    victim.mkdir()
    link = their_link(tmp_path / "artifacts", victim)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 127.0.0.1, ansible_port: 1}\n")
    tail = ["--", "true"] if task[0] == "run" else []
    proc = gpurig(*task, "--inventory", str(inventory), "--into", str(link), *tail, cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert f"--into {link} is a symlink owned by another user" in proc.stderr, proc.stderr
    assert list(victim.iterdir()) == []
