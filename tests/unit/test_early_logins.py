"""EarlyLogins: a login started ahead is taken once, its error raised where the fleet asks, the untaken closed."""

from __future__ import annotations

import socket
import threading

import pytest

from gpurig.connect.connection import AuthError, UnreachableError
from gpurig.connect.early import EARLY_MAX, EarlyLogins, early_hosts
from gpurig.connect.target import SSHTarget
from gpurig.inventory import Host


class FakeTransport:
    def __init__(self, active: bool = True) -> None:
        self.active = active
        self.closed = threading.Event()

    def is_active(self) -> bool:
        return self.active and not self.closed.is_set()

    def close(self) -> None:
        self.closed.set()


def target(name: str = "a100-01") -> SSHTarget:
    return SSHTarget(name=name, hostname="10.0.0.1", port=22, user="ml", key_files=())


def test_the_login_is_taken_once_then_there_is_none():
    logins = EarlyLogins(threading.Event())
    made = FakeTransport()
    logins.start(target(), lambda: made)
    assert logins.take(target()) is made  # an equal target (resolved again by the connection) finds it
    assert logins.take(target()) is None


def test_a_login_never_started_is_none():
    logins = EarlyLogins(threading.Event())
    logins.start(target("a"), FakeTransport)
    assert logins.take(target("b")) is None


def test_the_login_error_is_raised_where_the_fleet_asks():
    logins = EarlyLogins(threading.Event())

    def refused():
        raise AuthError("authentication failed for ml@10.0.0.1:22: server refused id_ed25519", "add the key", host="a100-01")

    logins.start(target(), refused)
    with pytest.raises(AuthError, match="server refused"):
        logins.take(target())


def test_a_transport_that_died_meanwhile_counts_as_none():
    logins = EarlyLogins(threading.Event())
    dead = FakeTransport(active=False)
    logins.start(target(), lambda: dead)
    assert logins.take(target()) is None and dead.closed.is_set()


def test_close_ends_logins_never_taken_even_those_still_under_way():
    logins = EarlyLogins(threading.Event())
    done, slow, release = FakeTransport(), FakeTransport(), threading.Event()
    logins.start(target("done"), lambda: done)

    def under_way():
        release.wait(10)
        return slow

    logins.start(target("slow"), under_way)
    assert done.closed.wait(0) is False
    logins.close()
    release.set()
    assert done.closed.wait(5) and slow.closed.wait(5)
    logins.start(target("late"), FakeTransport)  # after close nothing new starts
    assert logins.take(target("late")) is None


def test_ctrl_c_ends_the_wait_for_a_login():
    stop, release = threading.Event(), threading.Event()
    logins = EarlyLogins(stop)
    hung = FakeTransport()
    logins.start(target(), lambda: (release.wait(10), hung)[1])
    stop.set()
    with pytest.raises(UnreachableError, match="interrupted while connecting"):
        logins.take(target())
    release.set()
    assert hung.closed.wait(5)  # what the login made after the interrupt is closed


def test_the_connector_starts_no_more_logins_than_the_runs_forks(tmp_path):
    from gpurig.connect.connector import Connector
    from gpurig.connect.ssh import SSHSettings

    def started(forks: int, count: int) -> list[str]:
        connector = Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=None))
        logins: list[str] = []
        connector._login = lambda target: logins.append(target.name) or FakeTransport()  # type: ignore[method-assign]
        hosts = [Host("here", ("ungrouped",), {}, connection="local")]
        hosts += [Host(f"gpu{i:02d}", ("ungrouped",), {}, address=f"10.0.0.{i + 1}", user="ml") for i in range(count)]
        connector.start_early(hosts, forks)
        for host in hosts[1:]:
            connector._early.take(connector.open(host).target)  # waits for each login that was started
        connector.close()
        return sorted(logins)

    assert started(1, 3) == ["gpu00"]  # -f 1: one login at a time, the first host the fleet takes
    assert started(64, 20) == [f"gpu{i:02d}" for i in range(EARLY_MAX)]  # a big fleet: a head start for its first hosts only


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def _host(name: str, port: int, **vars) -> Host:
    return Host(name=name, groups=("ungrouped",), vars=vars, address="127.0.0.1", port=port, user="ml")


def test_dial_connects_each_first_hop_and_hands_the_socket_over_once():
    with _listener() as server:
        port = server.getsockname()[1]
        early = EarlyLogins()
        early.dial([_host("a", port)], forks=5, timeout=5, ssh_config=None)
        sock = early.dialed("127.0.0.1", port)
        assert sock is not None and sock.getpeername() == ("127.0.0.1", port)
        accepted, _ = server.accept()
        accepted.close()
        sock.close()
        assert early.dialed("127.0.0.1", port) is None  # taken once: a retry connects anew


def test_dial_goes_to_the_jump_host_of_a_host_behind_one():
    with _listener() as bastion:
        jump_port = bastion.getsockname()[1]
        early = EarlyLogins()
        behind = _host("behind", 22, ansible_ssh_common_args=f"-o ProxyJump=ml@127.0.0.1:{jump_port}")
        early.dial([behind], forks=5, timeout=5, ssh_config=None)
        assert early.dialed("127.0.0.1", 22) is None  # the host itself is reached through the bastion's channel
        sock = early.dialed("127.0.0.1", jump_port)
        assert sock is not None and sock.getpeername() == ("127.0.0.1", jump_port)
        sock.close()


def test_a_refused_dial_raises_where_the_login_takes_it():
    with _listener() as server:
        port = server.getsockname()[1]
    early = EarlyLogins()  # nothing listens on ``port`` any more
    early.dial([_host("gone", port)], forks=5, timeout=5, ssh_config=None)
    with pytest.raises(ConnectionRefusedError):
        early.dialed("127.0.0.1", port)


def test_dial_skips_hosts_whose_vars_make_no_target_and_is_bounded_by_the_forks():
    with _listener() as server:
        port = server.getsockname()[1]
        early = EarlyLogins()
        hosts = [_host("bad", port, ansible_host="x;touch /tmp/pwn"), _host("ok", port)]
        early.dial(hosts, forks=5, timeout=5, ssh_config=None)  # the bad host is the fleet's to report
        sock = early.dialed("127.0.0.1", port)
        assert sock is not None
        sock.close()
        assert early_hosts([_host(f"h{i}", port) for i in range(20)], forks=3) == [_host(f"h{i}", port) for i in range(3)]
        assert len(early_hosts([_host(f"h{i}", port) for i in range(20)], forks=50)) == EARLY_MAX


def test_close_closes_a_socket_dialed_and_never_taken():
    with _listener() as server:
        port = server.getsockname()[1]
        early = EarlyLogins()
        early.dial([_host("a", port)], forks=1, timeout=5, ssh_config=None)
        accepted, _ = server.accept()
        early.close()
        accepted.settimeout(5)
        assert accepted.recv(1) == b""  # the client end was closed: EOF
        accepted.close()
