"""Logins and reads against a real sshd: the signed key rides with the service request, RSA still signs SHA-2, AES-GCM first.

paramiko on its own asks for the ssh-userauth service and waits for the
accept before it sends the key, on every key it tries; gpurig's login sends
the signed request right behind the service request. Over a link with a
large RTT the login is timed in round trips: connect to the banner (2), the
key exchange (1), the service request with the key (1).
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

import pytest
from delayproxy import DelayProxy

from gpurig.connect.connection import AuthError
from gpurig.connect.connector import Connector
from gpurig.connect.target import SSHTarget

from .conftest import _authorize, keygen

RTT_S = 0.8  # long enough that a busy machine's CPU (the key exchange, the signature) stays well inside the half trip of margin


@pytest.fixture(scope="module")
def rsa_user(client_key, tmp_path_factory):
    """(login name, RSA key): an account that takes the test ed25519 key and an RSA key; removed afterwards."""
    key = tmp_path_factory.mktemp("rsa") / "id_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(key)], check=True)
    name = f"gpr{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-p", "*", name], check=True)
    try:
        _authorize(name, client_key)
        with Path(f"/home/{name}/.ssh/authorized_keys").open("a") as keys:
            keys.write(key.with_suffix(".pub").read_text())
        yield name, key
    finally:
        subprocess.run(["userdel", "-r", "-f", name], check=False, capture_output=True)


def _target(port: int, user: str, *keys: Path) -> SSHTarget:
    return SSHTarget(name="h", hostname="127.0.0.1", port=port, user=user, key_files=tuple(str(k) for k in keys))


def _login(settings, target: SSHTarget):
    connector = Connector(settings)
    try:
        transport = connector.transport(target)
        assert transport.is_authenticated()
        return transport
    finally:
        connector.close()


def test_a_key_login_takes_four_round_trips_where_paramiko_takes_five(farm, settings, client_key, login_user):
    # The proxy hands the client's first bytes (its banner) to sshd half a round trip later than a real link would,
    # so sshd's KEXINIT comes half a trip late too: 4.5 round trips here, 5.5 with paramiko's own login.
    host = farm.start(1, prefix="rtt")[0]
    with DelayProxy(host.port, rtt_s=RTT_S) as link:
        _login(settings, _target(link.port, login_user, client_key)).close()  # the host key recorded, sshd warm
        start = time.monotonic()
        transport = _login(settings, _target(link.port, login_user, client_key))
        trips = (time.monotonic() - start) / RTT_S
        transport.close()
        assert link.accepted == 2
    assert trips < 5.0, f"the login took {trips:.2f} round trips: the key waited for the service's accept"


def test_a_second_key_is_taken_without_asking_for_the_service_again(sshd, settings, client_key, login_user, tmp_path):
    wrong = keygen(tmp_path / "wrong")
    transport = _login(settings, _target(sshd.port, login_user, wrong, client_key))
    transport.close()


def test_an_rsa_key_signs_with_the_sha2_algorithm_the_server_names(sshd, settings, rsa_user):
    user, key = rsa_user
    transport = _login(settings, _target(sshd.port, user, key))
    # Debian's sshd refuses ssh-rsa (SHA-1) signatures: a login with it would have failed.
    assert transport._agreed_pubkey_algorithm in ("rsa-sha2-512", "rsa-sha2-256")
    transport.close()


@pytest.mark.parametrize("order", ["rsa-first", "rsa-second"])
def test_rsa_and_ed25519_keys_in_either_order(sshd, settings, rsa_user, client_key, tmp_path, order):
    user, rsa_key = rsa_user
    wrong_rsa = tmp_path / "wrong_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(wrong_rsa)], check=True)
    # A key refused first, so the one that logs in is offered second, without a service request of its own.
    keys = (keygen(tmp_path / "wrong"), rsa_key) if order == "rsa-second" else (wrong_rsa, client_key)
    transport = _login(settings, _target(sshd.port, user, *keys))
    transport.close()


def test_every_key_refused_is_still_one_clear_error(sshd, settings, login_user, tmp_path):
    wrong = [keygen(tmp_path / f"wrong{i}") for i in range(3)]
    with pytest.raises(AuthError) as err:
        _login(settings, _target(sshd.port, login_user, *wrong))
    assert "server refused" in str(err.value) and all(str(k) in str(err.value) for k in wrong)


def test_the_session_is_encrypted_with_aes_gcm_where_the_server_offers_it(farm, settings, client_key, login_user):
    # AES-GCM's tag is checked by OpenSSL; an -ctr cipher's HMAC is compared in Python, byte by byte, on every packet.
    transport = _login(settings, _target(farm.start(1, prefix="gcm")[0].port, login_user, client_key))
    assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com", "aes128-gcm@openssh.com")
    transport.close()
    older = farm.start(1, prefix="ctr", extra="Ciphers aes256-ctr,aes128-ctr\n")[0]  # a server without GCM: paramiko's order
    transport = _login(settings, _target(older.port, login_user, client_key))
    assert transport.remote_cipher == "aes128-ctr"
    transport.close()


def test_output_far_past_the_channel_window_arrives_whole_when_nobody_reads_it_as_it_comes(connector, sshd, make_host):
    # Nobody reads a probe's output as it comes, so its read loop is woken every 32 chunks, not by each: what it
    # reads must still keep paramiko's 2 MB window open for the rest (6 MB here), and lose nothing.
    with connector.open(make_host(sshd.port)) as conn:
        got = conn.run("head -c 6000000 /dev/zero | tr '\\0' x; echo; echo end >&2", timeout=60)
    assert len(got.stdout) == 6000001 and got.stdout.count("x") == 6000000 and got.stderr == "end\n"
