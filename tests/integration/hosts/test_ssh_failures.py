"""What users see when hosts misbehave: refused or silent ports, forced commands, commands that overrun."""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import time
from pathlib import Path

import pytest

from gpurig.connect.connection import CommandInterrupted, CommandTimeout, UnreachableError
from gpurig.connect.connector import Connector
from gpurig.connect.fleet import run_fleet
from gpurig.facts import gather
from gpurig.inventory import load_inventory

from .conftest import fake_listener


@pytest.fixture
def hangup_port():
    """A port that accepts TCP connections and closes each at once (a proxy with nothing behind it)."""
    with fake_listener(None, hang_up=True) as port:
        yield port


def test_each_unreachable_host_gets_its_own_precise_reason(settings, make_host, refused_port, silent_port, hangup_port):
    s = dataclasses.replace(settings, connect_attempts=2, retry_backoff_s=0.05, connect_timeout=1)
    reasons = {}
    for label, port in (("refused", refused_port), ("silent", silent_port), ("hangup", hangup_port)):
        with pytest.raises(UnreachableError) as err:
            Connector(s).open(make_host(port, name=label)).connect()
        reasons[label] = str(err.value)
    assert "connection refused" in reasons["refused"] and "handshake" not in reasons["refused"]
    assert "no SSH handshake within 1s" in reasons["silent"]
    assert "closed the connection before saying it speaks SSH" in reasons["hangup"] and "within" not in reasons["hangup"]
    assert all("after 2 attempts" in r and "\n" not in r for r in reasons.values())


def test_a_forced_command_is_a_failed_host_not_empty_facts(farm, write_inventory, connector):
    forced = farm.start(1, prefix="forced", extra="ForceCommand echo hello\n")[0]
    inv = load_inventory(write_inventory({forced.name: {"ansible_host": "127.0.0.1", "ansible_port": forced.port}}))
    result = run_fleet(inv.hosts.values(), gather, connector=connector).results[0]
    assert result.status == "failed"
    assert "the host ran something else than the probe (ForceCommand? broken login shell?)" in result.reason
    assert "'hello'" in result.reason


def _pid_of_background_sleep(conn_call, seconds: int) -> tuple[int, bool]:
    """Start `sleep` in the background of a command that then waits on it; overrun a 1 s timeout."""
    seen: dict[str, object] = {}

    def on_output(stream: str, text: str) -> None:
        if stream == "stdout" and "pid" not in seen:
            seen["pid"] = int(text.split()[0])
            seen["alive"] = _running(seen["pid"])

    with pytest.raises(CommandTimeout, match="within 1s"):
        conn_call(f"sleep {seconds} & echo $!; wait", timeout=1, on_output=on_output)
    return seen["pid"], seen["alive"]


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polling for the process to end
    return True


@pytest.mark.parametrize("how", ["run", "sudo"])
def test_a_command_timeout_also_stops_the_remote_processes(connector, sshd, make_host, how):
    seconds = 300 + secrets.randbelow(1000)
    with connector.open(make_host(sshd.port)) as conn:
        pid, alive = _pid_of_background_sleep(getattr(conn, how), seconds)
        try:
            assert alive  # the sleep really ran on the host
            assert _gone_within(pid, 5), f"sleep {seconds} (pid {pid}) still runs on the host after the timeout"
        finally:
            if _running(pid):  # the host is this machine: never leave the test's sleep behind
                os.kill(pid, signal.SIGKILL)
        result = getattr(conn, how)("echo still-usable; exit 7", warn=True)
        assert (result.stdout, result.exited) == ("still-usable\n", 7)


@pytest.mark.parametrize("how", ["run", "sudo"])
def test_an_interrupt_stops_the_remote_command_with_what_it_started_and_says_so(connector, sshd, make_host, how):
    seconds = 300 + secrets.randbelow(1000)
    seen: dict[str, int] = {}
    with connector.open(make_host(sshd.port)) as conn:
        def on_output(stream: str, text: str) -> None:
            if stream == "stdout" and "pid" not in seen:
                seen["pid"] = int(text.split()[0])
                conn.interrupt()  # what the fleet does on Ctrl-C, from another thread there

        start = time.monotonic()
        try:
            with pytest.raises(CommandInterrupted) as err:
                getattr(conn, how)(f"sleep {seconds} & echo $!; wait", on_output=on_output)
            assert time.monotonic() - start < 15
            assert err.value.problem == "interrupted; the command was stopped, with every process it started"
            assert not _running(seen["pid"])  # gone before the error was raised, not merely signalled
        finally:
            if "pid" in seen and _running(seen["pid"]):  # the host is this machine: never leave the test's sleep behind
                os.kill(seen["pid"], signal.SIGKILL)
        with pytest.raises(CommandInterrupted, match="interrupted before the command started"):
            conn.run("true")  # nothing new starts on an interrupted connection
