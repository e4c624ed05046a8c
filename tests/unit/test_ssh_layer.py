"""The SSH layer's pieces that need no server: what reaches the log (set by report.configure_logging), and the remote pid line taken off stderr."""

from __future__ import annotations

import logging

import pytest

from gpurig.connect.remotegroup import RemotePid, await_pid
from gpurig.report import configure_logging


@pytest.fixture
def verbosity():
    yield configure_logging
    configure_logging(0)


def test_paramiko_lines_reach_stderr_only_at_vv(verbosity, capsys):
    # What the user sees on stderr, not caplog: pytest >= 9.1 hooks caplog onto non-propagating loggers too,
    # so caplog would show paramiko's lines that gpurig's own handlers drop.
    noisy = logging.getLogger("paramiko.transport")
    noisy.error("Exception (client): Error reading SSH protocol banner")
    verbosity(1)
    noisy.error("still hidden at -v")
    logging.getLogger("gpurig.connect.hostkeys").info("recorded host key")
    verbosity(2)
    noisy.debug("shown at -vv")
    assert capsys.readouterr().err.splitlines() == ["gpurig: info: recorded host key", "paramiko.transport: debug: shown at -vv"]


def test_paramiko_never_falls_back_to_printing_on_stderr(capfd):
    configure_logging(0)
    logging.getLogger("paramiko.transport").error("Exception (client): Error reading SSH protocol banner")
    assert capfd.readouterr().err == ""


def test_the_remote_pid_line_is_taken_off_stderr_wherever_it_arrives():
    pid = RemotePid()
    chunks = [b"motd from .profile\n@@gpu", b"rig-pid 4242\nreal ", b"stderr\n"]
    assert b"".join(pid.strip(c) for c in chunks) == b"motd from .profile\nreal stderr\n"
    assert pid.pid == 4242
    silent = RemotePid()  # a shell that never printed it: everything comes through at the end
    assert silent.strip(b"no marker ") + silent.strip(b"", final=True) == b"no marker "
    assert silent.pid is None


def test_the_sudo_password_leaves_the_environment_before_any_child_starts(monkeypatch, tmp_path):
    import gpurig.connect.collect
    from gpurig.connect.connector import Connector
    from gpurig.connect.ssh import SSHSettings
    from gpurig.inventory import Host

    monkeypatch.setattr(gpurig.connect.collect, "_ENV_PASSWORD", {"value": None})
    monkeypatch.setenv("GPURIG_SUDO_PASSWORD", "s3cret-pw")
    connector = Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=None))
    local = connector.open(Host("here", ("ungrouped",), {}, connection="local"))
    assert "s3cret-pw" not in local.run("env").stdout  # `gpurig exec -- env` cannot show it
    assert connector.sudo_password() == "s3cret-pw"  # still there for sudo's prompt


class _LateMarkChannel:
    """A channel whose shell pid line comes on stderr after the command's first stdout (as a loaded sshd may send it)."""

    def __init__(self, arrives_after: int, exits: bool = False) -> None:
        self.closed = False
        self._polls = arrives_after
        self._exits = exits

    def recv_stderr_ready(self) -> bool:
        self._polls -= 1
        return not self._exits and self._polls < 0

    def recv_stderr(self, n: int) -> bytes:
        return b"@@gpurig-pid 4242\n"  # what the shell's marked() line prints

    def exit_status_ready(self) -> bool:
        return self._exits


def test_an_interrupt_waits_briefly_for_the_pid_line_that_comes_after_the_first_output():
    pid = RemotePid()
    await_pid(_LateMarkChannel(arrives_after=3), pid, 2.0)
    assert pid.pid == 4242  # so the command is stopped by its group, not left running
    ended = RemotePid()
    await_pid(_LateMarkChannel(arrives_after=0, exits=True), ended, 2.0)
    assert ended.pid is None  # a command that ended without the line: no wait for what cannot come
