"""EarlyLogins: a login started ahead is taken once, its error raised where the fleet asks, the untaken closed."""

from __future__ import annotations

import threading

import pytest

from gpurig.connect.connection import AuthError, UnreachableError
from gpurig.connect.early import EarlyLogins
from gpurig.connect.target import SSHTarget


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
    from gpurig.connect.early import EARLY_MAX
    from gpurig.connect.ssh import Connector, SSHSettings
    from gpurig.inventory import Host

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
