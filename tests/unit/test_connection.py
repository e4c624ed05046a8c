"""The Connection interface through the local connection: output, exit codes, quoting, timeouts, files, sudo."""

from __future__ import annotations

import shutil
import threading
import time
from types import SimpleNamespace

import pytest

from gpurig.connect import forward as forward_module
from gpurig.connect.connection import CommandError, CommandTimeout, to_shell
from gpurig.connect.connector import Connector
from gpurig.connect.forward import ReverseForward
from gpurig.connect.ssh import SSHSettings
from gpurig.errors import HostError, last_line
from gpurig.inventory import Host


def local_host() -> Host:
    return Host(name="localhost", groups=("ungrouped",), vars={}, address="localhost", connection="local")


@pytest.fixture
def local(tmp_path):
    return Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=None)).open(local_host())


def test_local_run_gives_output_and_exit_code(local):
    r = local.run("echo out; echo err >&2; exit 5", warn=True)
    assert (r.exited, r.stdout, r.stderr, r.host) == (5, "out\n", "err\n", "localhost")
    with pytest.raises(CommandError, match="exited 5"):
        local.run("exit 5")


def test_local_run_quotes_list_arguments(local, tmp_path):
    marker = tmp_path / "x"
    word = f"$(touch {marker}); `touch {marker}` ' \" \\"
    assert local.run(["printf", "%s", word]).stdout == word
    assert not marker.exists()
    assert to_shell(["echo", "a b", "c;d"]) == "echo 'a b' 'c;d'"


def test_local_command_timeout_kills_the_process_group(local):
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match="within 0.5s"):
        local.run("sleep 30 & sleep 30", timeout=0.5)
    assert time.monotonic() - start < 15  # half the sleeps: a run that waited for them fails, however loaded the machine


def test_local_stdin_is_closed(local):
    assert local.run("cat; echo done", timeout=5).stdout == "done\n"


def test_local_streams_chunks_as_they_come(local):
    chunks = []
    local.run("printf 'é'; printf 'x' >&2", on_output=lambda stream, text: chunks.append((stream, text)))
    assert ("stdout", "é") in chunks and ("stderr", "x") in chunks


def test_local_put_and_get_are_atomic_copies(local, tmp_path):
    src = tmp_path / "a"
    src.write_text("hello")
    local.put(src, str(tmp_path / "b"), mode=0o640)
    assert (tmp_path / "b").read_text() == "hello" and oct((tmp_path / "b").stat().st_mode & 0o777) == "0o640"
    local.get(str(tmp_path / "b"), tmp_path / "c")
    assert (tmp_path / "c").read_text() == "hello"
    assert not list(tmp_path.glob("*.gpurig-tmp"))
    with pytest.raises(HostError, match="cannot copy"):
        local.put(src, str(tmp_path / "missing-dir" / "x"))


@pytest.mark.skipif(shutil.which("sudo") is None, reason="sudo not installed")
def test_local_sudo_runs_as_root(local):
    assert local.sudo(["id", "-u"]).stdout.strip() == "0"


def test_last_line_prefers_stderr_and_skips_blank_lines():
    assert last_line("warning\nreal reason\n\n  \n", "out") == "real reason"
    assert last_line("", "  \n", "from stdout\n") == "from stdout"
    assert last_line(None, "", default="no output") == "no output"


def test_command_error_quotes_the_last_stderr_line(local):
    with pytest.raises(CommandError, match="exited 2: .*: the reason; fix"):
        local.run("echo noise >&2; echo 'the reason' >&2; echo >&2; exit 2")


def test_the_machine_gpurig_runs_on_gives_no_channel_nor_forward_and_says_why():
    from gpurig.connect.connection import ChannelError
    from gpurig.connect.local import LocalConnection

    conn = LocalConnection("here")
    with pytest.raises(ChannelError, match="this one is local"):
        conn.open_channel("127.0.0.1", 6820)
    with pytest.raises(ChannelError, match="this one is local"):
        conn.http("127.0.0.1", 6820).connect()
    with pytest.raises(ChannelError, match="port forward needs an SSH connection"):
        conn.reverse_forward(("127.0.0.1", 5000))
    with pytest.raises(ChannelError, match="port forward needs an SSH connection"):
        conn.local_forward("127.0.0.1", 9090)
    assert conn.runs_here and conn.ssh_target is None and not conn.closed


class _NoThreads:
    """threading as forward.py sees it when the process can start no more threads."""

    Event, Lock = threading.Event, threading.Lock

    class Thread(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")


def test_a_forward_that_cannot_start_a_thread_refuses_that_connection_and_never_raises_on_the_transport_thread(monkeypatch):
    # paramiko calls _accept on its transport thread: an exception there would end the whole SSH connection
    monkeypatch.setattr(forward_module, "threading", _NoThreads)
    forward = ReverseForward(transport=None, target=("127.0.0.1", 9))
    closed: list[str] = []
    forward._accept(SimpleNamespace(close=lambda: closed.append("chan")), ("127.0.0.1", 1), ("127.0.0.1", 2))
    assert closed == ["chan"] and forward._threads == []


def test_a_connection_passes_its_interrupt_on_to_one_its_work_opened_even_when_it_came_first():
    from tests.fakes import ScriptedConnection

    work, opened, late = ScriptedConnection("gpu-01"), ScriptedConnection("gpu-01"), ScriptedConnection("gpu-01")
    work.pass_interrupts_to(opened)
    work.interrupt()
    assert opened.interrupted
    work.pass_interrupts_to(late)  # opened after the Ctrl-C: stopped at once
    assert late.interrupted
