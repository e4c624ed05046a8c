"""gpurig.deploy.peerlink for real: a pulling host's forward to a serving host's loopback through the serving host's sshd,
with a one-time key that opens that forward and nothing else, the serving host's key pinned, nothing left afterwards.

Both hosts are sshd processes of this machine (the pulling host's ssh reaches the serving host's sshd on 127.0.0.1), as
the rest of this folder's hosts are; the web_on_loopback behind the forward is an HTTP server on the machine's loopback.
"""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest

from gpurig.deploy.peerlink import PeerLinkError, add_key, one_time_key, open_peer_link, remove_key, restricted_line

pytestmark = pytest.mark.integration


@pytest.fixture
def pair(farm, connector, make_host):
    """(serving host's connection, its sshd, pulling host's connection): two sshd hosts of the farm."""
    server_sshd, puller_sshd = farm.start(2, prefix="peer")
    with connector.open(make_host(server_sshd.port, "a100-01")) as server, connector.open(make_host(puller_sshd.port, "a100-02")) as puller:
        yield server, server_sshd, puller


def key_lines(login_user: str) -> list[str]:
    return Path(f"/home/{login_user}/.ssh/authorized_keys").read_text().splitlines()


def left_behind(login_user: str) -> list[str]:
    """The tunnel's processes and folders still on the machine."""
    procs = subprocess.run(["pgrep", "-u", login_user, "-f", "gpurig-peer-"], capture_output=True, text=True).stdout.split()
    folders = [str(p) for p in Path("/tmp").glob("gpurig-peer-*") if p.owner() == login_user]
    return procs + folders


def test_the_pulling_host_reaches_the_serving_hosts_loopback_and_nothing_is_left(pair, web_on_loopback, login_user):
    server, server_sshd, puller = pair
    before = key_lines(login_user)
    link = open_peer_link(server, puller, "127.0.0.1", web_on_loopback, ssh_port=server_sshd.port)
    try:
        assert len(key_lines(login_user)) == len(before) + 1
        assert key_lines(login_user)[-1].startswith(f'restrict,port-forwarding,permitopen="127.0.0.1:{web_on_loopback}",command="/bin/false" ssh-ed25519 ')
        # the pulling host is this machine too: its loopback port is ours to ask
        with urllib.request.urlopen(f"http://127.0.0.1:{link.port}/", timeout=10) as answer:
            assert answer.read() == b"asked for /"
    finally:
        link.close()
    assert key_lines(login_user) == before
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{link.port}/", timeout=5)
    assert not left_behind(login_user)


def test_the_one_time_key_opens_that_forward_and_nothing_else(pair, web_on_loopback, login_user, tmp_path):
    server, server_sshd, _ = pair
    private, public = one_time_key("gpurig-peer-test")
    key = tmp_path / "key"
    key.write_bytes(private)
    key.chmod(0o600)
    path = add_key(server, login_user, restricted_line(public, web_on_loopback))
    ssh = ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(key), "-o", "StrictHostKeyChecking=no",
           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-p", str(server_sshd.port), f"{login_user}@127.0.0.1"]
    try:
        shell = subprocess.run([*ssh, "echo", "shell"], capture_output=True, text=True, timeout=30)
        assert "shell" not in shell.stdout and shell.returncode != 0  # command="/bin/false": no command, no shell
        asked = "GET / HTTP/1.0\r\n\r\n"
        allowed = subprocess.run([*ssh, "-W", f"127.0.0.1:{web_on_loopback}"], capture_output=True, text=True, timeout=30, input=asked)
        assert "asked for /" in allowed.stdout  # the one forward it was made for
        other = subprocess.run([*ssh, "-W", f"127.0.0.1:{server_sshd.port}"], capture_output=True, text=True, timeout=30, input=asked)
        assert other.returncode != 0 and "forwarding failed" in other.stderr and not other.stdout  # permitopen: no other port
    finally:
        remove_key(server, path, "gpurig-peer-test")
    assert not any("gpurig-peer-test" in line for line in key_lines(login_user))


def test_a_serving_host_whose_key_is_not_the_pinned_one_is_refused_and_its_key_line_removed(pair, web_on_loopback, login_user, farm):
    server, _, puller = pair
    before = key_lines(login_user)
    impostor = farm.start(1, prefix="impostor")[0]  # another sshd where the pulling host is sent: its host key is another
    with pytest.raises(PeerLinkError) as refused:
        open_peer_link(server, puller, "127.0.0.1", web_on_loopback, ssh_port=impostor.port)
    assert "a100-02" in str(refused.value) and "a100-01" in str(refused.value)
    assert "host key" in str(refused.value).lower() or "verification" in str(refused.value).lower()
    assert key_lines(login_user) == before
    assert not left_behind(login_user)


def test_after_ctrl_c_the_serving_hosts_key_line_goes_with_its_guard_though_no_command_can_run(pair, web_on_loopback, login_user):
    import time

    server, server_sshd, puller = pair
    before = key_lines(login_user)
    link = open_peer_link(server, puller, "127.0.0.1", web_on_loopback, ssh_port=server_sshd.port)
    try:
        assert len(key_lines(login_user)) == len(before) + 1
        server.interrupt()  # as the fleet does on Ctrl-C: no new command runs there, its channels are closed
        puller.interrupt()
        end = time.monotonic() + 20
        while key_lines(login_user) != before and time.monotonic() < end:
            time.sleep(0.1)  # polling interval while the guard's removal runs on the host, not a synchronisation sleep
        assert key_lines(login_user) == before
    finally:
        link.close()
    end = time.monotonic() + 20
    while left_behind(login_user) and time.monotonic() < end:
        time.sleep(0.1)  # the tunnel script stops ssh and removes its folder once its stdin ends
    assert not left_behind(login_user)


def test_links_opened_and_closed_at_once_to_one_serving_host_each_keep_their_own_key_line(pair, web_on_loopback, login_user):
    """As a parent's children link to it at once: no add truncates or rewrites away another's line, no removal another's."""
    from concurrent.futures import ThreadPoolExecutor

    server, server_sshd, puller = pair
    before = key_lines(login_user)
    with ThreadPoolExecutor(3) as pool:
        links = list(pool.map(lambda _: open_peer_link(server, puller, "127.0.0.1", web_on_loopback, ssh_port=server_sshd.port), range(3)))
    try:
        assert len(key_lines(login_user)) == len(before) + 3
        for link in links:
            with urllib.request.urlopen(f"http://127.0.0.1:{link.port}/", timeout=10) as answer:
                assert answer.read() == b"asked for /"
    finally:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda link: link.close(), links))
    assert key_lines(login_user) == before
    assert not left_behind(login_user)
