"""converge() and the Upload every step writes files with, run for real on this machine (local connection, temp dirs).

The steps here are small test steps that touch files under a temp dir; the
daemon step's plans are tested from recorded facts in test_operations.py and
against a real host in tests/integration/hosts_containers.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.ssh import SSHSettings
from gpurig.errors import HostError
from gpurig.facts import parse_facts
from gpurig.inventory import Host
from gpurig.inventory.profile import HostProfile
from gpurig.steps import Change, Plan, Shell, Step, Upload, converge
from gpurig.steps.commands import install_file_command, run_change

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "debian12-root.txt"


class Touch(Step):
    """Wants a file to exist; creating it is its one change."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path

    def plan(self, facts, wanted):
        if self.path.exists():
            return Plan.ok(f"{self.path.name} exists")
        return Plan.change(f"create {self.path.name}", Change(f"touch {self.path.name}", (Shell(f"touch {self.path}"),), diff="+x\n"))


class Broken(Step):
    name = "broken"

    def plan(self, facts, wanted):
        return Plan.change("run a failing command", Change("false", (Shell("echo 'the reason' >&2; exit 3"),)))


@pytest.fixture
def conn(tmp_path):
    connector = Connector(SSHSettings(project_known_hosts=tmp_path / "known_hosts", user_known_hosts=None, ssh_config=None))
    with connector.open(Host("local", (), {}, connection="local")) as c:
        yield c


@pytest.fixture
def gathered():
    calls = []

    def gather(conn):
        calls.append(conn)
        return parse_facts(FACTS.read_text())

    gather.calls = calls
    return gather


def test_converge_applies_then_is_ok_and_gathers_again_only_after_a_change(conn, tmp_path, gathered):
    steps = [Touch("a", tmp_path / "a"), Touch("b", tmp_path / "b")]
    heard = []
    first = converge(conn, steps, HostProfile("local"), on_result=heard.append, gather=gathered)
    assert [(r.step, r.status) for r in first] == [("a", "changed"), ("b", "changed")]
    assert heard == first and (tmp_path / "a").exists() and (tmp_path / "b").exists()
    assert len(gathered.calls) == 3  # once, then after each change
    second = converge(conn, steps, HostProfile("local"), gather=gathered)
    assert [(r.status, r.reason) for r in second] == [("ok", "a exists"), ("ok", "b exists")]
    assert len(gathered.calls) == 4  # one round trip when nothing changes


def test_check_mode_plans_and_changes_nothing(conn, tmp_path, gathered):
    results = converge(conn, [Touch("a", tmp_path / "a")], HostProfile("local"), check=True, diff=True, gather=gathered)
    assert results[0].status == "changed" and "would change (check mode)" in results[0].reason
    assert results[0].changes[0].diff == "+x\n"
    assert not (tmp_path / "a").exists() and len(gathered.calls) == 1


def test_a_failed_step_stops_the_later_ones_with_the_reason(conn, tmp_path, gathered):
    steps = [Touch("a", tmp_path / "a"), Broken(), Touch("c", tmp_path / "c")]
    results = converge(conn, steps, HostProfile("local"), gather=gathered)
    assert [r.status for r in results] == ["changed", "failed", "skipped"]
    assert "exited 3" in results[1].reason and "the reason" in results[1].reason
    assert results[2].reason == "not run: step broken failed"
    assert not (tmp_path / "c").exists()


def test_diffs_stay_out_of_results_unless_asked(conn, tmp_path, gathered):
    results = converge(conn, [Touch("a", tmp_path / "a")], HostProfile("local"), gather=gathered)
    assert results[0].changes[0].diff == "" and results[0].to_dict()["changes"] == [{"summary": "touch a"}]


def write(conn, path: Path, content: str, **kw) -> None:
    run_change(conn, f"write {path.name}", (Upload(str(path), content=content, **kw),))


HOSTILE = 'line "one"\n$(touch /tmp/gpurig-pwned) `id` \\n \'quoted\'\n\x01 ünïcode\n'


def test_write_file_creates_directory_and_file_with_the_exact_bytes(conn, tmp_path):
    target = tmp_path / "etc" / "docker" / "daemon.json"
    write(conn, target, HOSTILE, mode=0o640)
    assert target.read_text() == HOSTILE
    assert oct(target.stat().st_mode & 0o777) == "0o640"
    assert not Path("/tmp/gpurig-pwned").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["daemon.json"]  # no temp file left
    assert not list(Path(tempfile.gettempdir()).glob("gpurig-upload.*"))  # nor the staging folder


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_write_file_keeps_mode_and_owner_and_backs_up_the_old_file(conn, tmp_path):
    target = tmp_path / "daemon.json"
    target.write_text('{"old": true}\n')
    target.chmod(0o600)
    nobody = pwd.getpwnam("nobody")
    os.chown(target, nobody.pw_uid, nobody.pw_gid)
    write(conn, target, json.dumps({"new": True}))
    st = target.stat()
    assert json.loads(target.read_text()) == {"new": True}
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, nobody.pw_uid)
    backups = list(tmp_path.glob("daemon.json.gpurig-bak.*"))
    assert len(backups) == 1 and backups[0].read_text() == '{"old": true}\n'


def test_write_file_that_fails_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "work" / "daemon.json"
    target.parent.mkdir()
    target.write_text("old\n")
    # Every tool but mv: the temp file is written, then the rename cannot happen.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "dirname", "stat", "id", "mktemp", "cat", "chmod", "chown", "cp", "date", "sync", "rm"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    staged = tmp_path / "staged"
    staged.write_text("new\n")
    line = f"PATH={bin_dir}; " + install_file_command(str(target), str(staged))
    proc = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True)
    assert proc.returncode != 0 and "mv" in proc.stderr
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in target.parent.iterdir() if ".gpurig-tmp" in p.name) == []


def test_uploaded_content_never_appears_in_a_command_line(tmp_path):
    """File content reaches the host over put (SFTP on SSH), so `ps` on the host never shows it."""

    class Recorder:
        name, become = "h", False

        def __init__(self):
            self.lines, self.put_files = [], []

        def run(self, command, **kw):
            from gpurig.connect.connection import Result, to_shell

            self.lines.append(to_shell(command))
            return Result("h", "", 0, "/tmp/gpurig-upload.abc\n" if "mktemp" in to_shell(command) else "", "")

        admin = run

        def put(self, local, remote, mode=None):
            self.put_files.append((Path(local).read_text(), remote, mode))

    host = Recorder()
    run_change(host, "write the secret", (Upload("/etc/app/token", content="s3cret-token\n", mode=0o600),))
    assert host.put_files == [("s3cret-token\n", "/tmp/gpurig-upload.abc/token", 0o600)]
    assert not any("s3cret" in line for line in host.lines)
    assert len(host.lines) == 2  # the staging folder, then the install, which also removes the folder
    assert "/etc/app/token" in host.lines[1] and "0600" in host.lines[1] and host.lines[1].endswith(" /tmp/gpurig-upload.abc")


def test_a_folder_of_another_user_is_refused(conn, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a folder of another user needs root to make")
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chown(folder, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(HostError, match="belongs to uid"):
        write(conn, folder / "x.deb", "deb")


def test_facts_cut_short_fail_the_host_instead_of_planning_from_half(conn, tmp_path):
    cut = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "h100-cut-short.txt"
    results = converge(conn, [Touch("a", tmp_path / "a"), Touch("b", tmp_path / "b")], HostProfile("local"),
                       gather=lambda c: parse_facts(cut.read_text()))
    assert [r.status for r in results] == ["failed", "skipped"]
    assert "facts incomplete" in results[0].reason and "docker_info" in results[0].reason
    assert not (tmp_path / "a").exists()


def test_a_host_lost_after_a_change_fails_the_next_step(conn, tmp_path, gathered):
    from gpurig.connect.connection import ConnectionLost

    def gather(c):
        if gathered.calls:
            raise ConnectionLost("local: connection lost", "check the host")
        return gathered(c)

    results = converge(conn, [Touch("a", tmp_path / "a"), Touch("b", tmp_path / "b")], HostProfile("local"), gather=gather)
    assert [r.status for r in results] == ["changed", "failed"]
    assert "facts could not be gathered again after step a: local: connection lost" in results[1].reason


def test_an_upload_whose_staging_folder_was_not_printed_is_refused_not_written_at_the_root():
    """mktemp -d that exits 0 and prints nothing (seen once on a nested systemd host): the file must not go to /NAME."""
    from fakes import ScriptedConnection

    conn = ScriptedConnection("gpu-01", [(0, "", "")])
    with pytest.raises(HostError) as caught:
        run_change(conn, "write daemon.json", (Upload("/etc/docker/daemon.json", content="{}\n"),))
    assert "mktemp -d printed no folder" in caught.value.problem and len(conn.lines) == 1


# dpkg 1.21's answer while apt holds its lock (recorded in a Debian 12 container): the error, then a note wrapped over two lines.
DPKG_LOCKED = """dpkg: error: dpkg frontend lock was locked by another process with pid 16
Note: removing the lock file is always wrong, can damage the locked area
and the entire system. See <https://wiki.debian.org/Teams/Dpkg/FAQ#db-lock>.
"""


def failed_saying(conn, tmp_path, stderr: str, code: int) -> str:
    """The problem run_change reports for a command that printed ``stderr`` and exited ``code``."""
    said = tmp_path / "said"
    said.write_text(stderr)
    with pytest.raises(HostError) as err:
        run_change(conn, "install docker.io", (Shell(f"cat {said} >&2; exit {code}"),))
    return err.value.problem


def test_a_failed_command_is_reported_by_its_whole_error_line_not_the_end_of_a_wrapped_note(conn, tmp_path):
    assert failed_saying(conn, tmp_path, DPKG_LOCKED, 2) == (
        "could not install docker.io: exited 2: dpkg: error: dpkg frontend lock was locked by another process with pid 16")


# dpkg's words when a package it resumes fails to configure: a full run here, after Ctrl-C mid-install, reported only up to the colon.
DPKG_UNCONFIGURED = """dpkg: error processing package docker.io (--configure):
 installed docker.io package post-installation script subprocess returned error exit status 1
Errors were encountered while processing:
 docker.io
"""


def test_dpkgs_reason_for_the_package_it_could_not_process_is_the_reason(conn, tmp_path):
    assert failed_saying(conn, tmp_path, DPKG_UNCONFIGURED, 1) == (
        "could not install docker.io: exited 1: dpkg: error processing package docker.io (--configure): "
        "installed docker.io package post-installation script subprocess returned error exit status 1")
    through_apt = DPKG_UNCONFIGURED + "E: Sub-process /usr/bin/dpkg returned an error code (1)\n"
    assert failed_saying(conn, tmp_path, through_apt, 100).endswith(": exited 100: dpkg: error processing package docker.io "
                                                                    "(--configure): installed docker.io package post-installation "
                                                                    "script subprocess returned error exit status 1")


def test_dpkgs_list_of_the_packages_it_could_not_process_stays_in_the_reason_when_it_gave_no_reason(conn, tmp_path):
    assert failed_saying(conn, tmp_path, "Errors were encountered while processing:\n runc\n", 1) == (
        "could not install docker.io: exited 1: Errors were encountered while processing: runc")
    # an older dpkg error above another tool's error is not that error's reason
    unrelated = DPKG_UNCONFIGURED + "E: Unable to locate package docker-ce\n"
    assert failed_saying(conn, tmp_path, unrelated, 100).endswith(": exited 100: E: Unable to locate package docker-ce")


def test_a_commands_notice_reaches_the_user_while_it_runs(conn, caplog):
    with caplog.at_level("WARNING", logger="gpurig"):
        run_change(conn, "install docker.io", (Shell("echo 'gpurig-notice: waiting up to 120 s for the package lock, held by apt-get (pid 7)' >&2; "
                                                     "echo 'other words' >&2"),))
    assert [r.getMessage() for r in caplog.records] == ["local: waiting up to 120 s for the package lock, held by apt-get (pid 7)"]
