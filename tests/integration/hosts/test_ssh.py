"""SSH connections against real sshd processes: auth, host keys, timeouts, jumps, sudo, files, quoting."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import pytest

from gpurig.connect.connection import (
    AuthError,
    CommandError,
    CommandTimeout,
    HostKeyError,
    SudoPasswordError,
    UnreachableError,
)
from gpurig.connect.connector import Connector
from gpurig.errors import HostError
from gpurig.inventory import Host, load_inventory

from .conftest import keygen, ssh_fingerprint


def test_key_auth_runs_commands_and_reuses_one_connection(connector, sshd, make_host, login_user):
    with connector.open(make_host(sshd.port)) as conn:
        first = conn.run("echo out; echo err >&2; exit 3", warn=True)
        second = conn.run(["id", "-un"])
        transport = conn._transport
        conn.run("true")
        assert conn._transport is transport  # one connection for all of a host's work
    assert (first.exited, first.stdout, first.stderr) == (3, "out\n", "err\n")
    assert second.stdout.strip() == login_user


def test_nonzero_exit_raises_unless_warn(connector, sshd, make_host):
    with connector.open(make_host(sshd.port)) as conn:
        with pytest.raises(CommandError, match="exited 7"):
            conn.run("exit 7")


def test_streaming_output_arrives_before_the_command_ends(connector, sshd, make_host):
    seen: list[tuple[float, str]] = []
    with connector.open(make_host(sshd.port)) as conn:
        start = time.monotonic()
        # The remote waits on a fifo we never write: only the timeout ends it, after "early" was streamed.
        with pytest.raises(CommandTimeout):
            conn.run("echo early; f=$(mktemp -u); mkfifo $f; cat $f", timeout=2, on_output=lambda s, t: seen.append((time.monotonic() - start, t)))
    assert seen and seen[0][1] == "early\n" and seen[0][0] < 1.5


def test_output_that_follows_the_exit_status_is_kept(connector, sshd, make_host):
    """sshd may send a command's exit status before the last of its output: what comes after it is still the command's."""
    with connector.open(make_host(sshd.port)) as conn:
        # the shell exits at once; a child it left holding stdout writes after that, then closes it (EOF)
        late = conn.run("echo early; (sleep 0.5; echo late; echo late-err >&2) &")
        start = time.monotonic()
        # a child that holds stdout open far longer: the run still ends, a short grace after the exit status
        held = conn.run("echo started; sleep 8 &")
        held_s = time.monotonic() - start
    assert (late.stdout, late.stderr) == ("early\nlate\n", "late-err\n")
    assert held.stdout == "started\n" and held_s < 6


def test_wrong_key_is_a_clear_auth_error(connector, sshd, tmp_path, make_host, login_user):
    other = keygen(tmp_path / "other_key")
    with pytest.raises(AuthError) as err:
        connector.open(make_host(sshd.port, key=other)).connect()
    assert f"authentication failed for {login_user}@127.0.0.1" in str(err.value)
    assert "authorized_keys" in err.value.fix


def test_closed_port_is_unreachable(connector, make_host, refused_port):
    with pytest.raises(UnreachableError, match="connection refused"):
        connector.open(make_host(refused_port)).connect()


def test_connect_retries_back_off_then_give_up(settings, make_host, refused_port):
    s = dataclasses.replace(settings, connect_attempts=3, retry_backoff_s=0.1)
    start = time.monotonic()
    with pytest.raises(UnreachableError, match="after 3 attempts"):
        Connector(s).open(make_host(refused_port)).connect()
    assert time.monotonic() - start >= 0.3  # 0.1 + 0.2 of backoff between the three attempts


def test_silent_host_times_out_as_configured(settings, silent_port, make_host):
    conn = Connector(dataclasses.replace(settings, connect_timeout=1)).open(make_host(silent_port))
    start = time.monotonic()
    with pytest.raises(UnreachableError, match="no SSH handshake within 1s"):
        conn.connect()
    assert time.monotonic() - start < 4


def test_changed_host_key_is_refused_with_both_fingerprints(settings, sshd, tmp_path, make_host):
    impostor = keygen(tmp_path / "impostor")
    pub = impostor.with_suffix(".pub").read_text().split()
    settings.project_known_hosts.write_text(f"{sshd.known_hosts_name} {pub[0]} {pub[1]}\n")
    with pytest.raises(HostKeyError) as err:
        Connector(settings).open(make_host(sshd.port)).connect()
    text = str(err.value)
    assert "HOST KEY CHANGED" in text
    assert sshd.fingerprint in text  # what the server offered
    assert ssh_fingerprint(impostor.with_suffix(".pub")) in text  # what we had on record
    assert f"ssh-keygen -R '{sshd.known_hosts_name}'" in err.value.fix


def test_changed_key_fails_even_with_checking_off(settings, sshd, tmp_path, make_host):
    pub = keygen(tmp_path / "impostor").with_suffix(".pub").read_text().split()
    settings.project_known_hosts.write_text(f"{sshd.known_hosts_name} {pub[0]} {pub[1]}\n")
    with pytest.raises(HostKeyError, match="CHANGED"):
        Connector(dataclasses.replace(settings, host_key_policy="off")).open(make_host(sshd.port)).connect()


def test_accept_new_records_the_key_and_strict_then_accepts_it(settings, sshd, make_host):
    Connector(settings).open(make_host(sshd.port)).run("true")
    line = settings.project_known_hosts.read_text()
    assert line.startswith(f"{sshd.known_hosts_name} ssh-ed25519 ")
    assert line.split()[2] == sshd.host_key.with_suffix(".pub").read_text().split()[1]
    strict = dataclasses.replace(settings, host_key_policy="strict")
    assert Connector(strict).open(make_host(sshd.port)).run("echo ok").stdout == "ok\n"


def test_strict_refuses_unknown_host(settings, sshd, make_host):
    strict = dataclasses.replace(settings, host_key_policy="strict")
    with pytest.raises(HostKeyError, match="policy is strict") as err:
        Connector(strict).open(make_host(sshd.port)).connect()
    assert sshd.fingerprint in str(err.value)
    assert not settings.project_known_hosts.exists()


def test_off_accepts_without_recording(settings, sshd, make_host):
    off = dataclasses.replace(settings, host_key_policy="off")
    assert Connector(off).open(make_host(sshd.port)).run("echo ok").ok
    assert not settings.project_known_hosts.exists()


def test_proxy_jump_goes_through_the_bastion(farm, settings, make_host, login_user):
    bastion, target = farm.start(2, prefix="jump")
    closed = farm.start(1, prefix="nofwd", extra="AllowTcpForwarding no\n")[0]
    via = f"{login_user}@127.0.0.1:{bastion.port}"
    jumped = dataclasses.replace(make_host(target.port), vars={"ansible_ssh_common_args": f"-J {via}"})
    c = Connector(settings)
    assert c.open(jumped).run("echo through").stdout == "through\n"
    # Through a bastion that refuses forwarding the same target is unreachable: the route really is the jump.
    blocked = dataclasses.replace(jumped, vars={"ansible_ssh_common_args": f"-o ProxyJump={login_user}@127.0.0.1:{closed.port}"})
    with pytest.raises(UnreachableError, match="jump host could not reach it"):
        c.open(blocked).connect()
    # Both the bastion's and the target's keys were checked and recorded.
    known = settings.project_known_hosts.read_text()
    assert bastion.known_hosts_name in known and target.known_hosts_name in known
    c.close()


def test_proxy_jump_from_ssh_config(farm, settings, client_key, tmp_path, login_user):
    bastion, target = farm.start(2, prefix="cfg")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host bastion\n  HostName 127.0.0.1\n  Port {bastion.port}\n  User {login_user}\n  IdentityFile {client_key}\n\n"
        f"Host gpu-box\n  HostName 127.0.0.1\n  Port {target.port}\n  User {login_user}\n  IdentityFile {client_key}\n  ProxyJump bastion\n"
    )
    c = Connector(dataclasses.replace(settings, ssh_config=config))
    alias = Host(name="gpu-box", groups=("ungrouped",), vars={}, address="gpu-box")
    assert c.open(alias).run("echo via-config").stdout == "via-config\n"
    c.close()


def test_sudo_with_password(farm, settings, sudo_user, sshd, make_host):
    name, password = sudo_user
    c = Connector(settings, sudo_password=password)
    with c.open(make_host(sshd.port, user=name)) as conn:
        result = conn.sudo(["id", "-un"])
        assert result.stdout.strip() == "root"
        assert password not in result.stdout + result.stderr + result.command
        # The command cannot read the password from its stdin.
        assert conn.sudo("cat; echo end").stdout == "end\n"


def test_wrong_sudo_password_is_reported_as_such(settings, sudo_user, sshd, make_host):
    name, _ = sudo_user
    c = Connector(settings, sudo_password="not-the-password")
    with pytest.raises(SudoPasswordError, match="rejected the password"):
        c.open(make_host(sshd.port, user=name)).sudo("true")


def test_sudo_without_a_password_says_what_to_set(settings, sudo_user, sshd, monkeypatch, make_host):
    monkeypatch.delenv("GPURIG_SUDO_PASSWORD", raising=False)
    monkeypatch.setattr("gpurig.connect.collect._ENV_PASSWORD", {"value": None})  # nor one taken from the environment earlier
    name, _ = sudo_user
    with pytest.raises(SudoPasswordError) as err:
        Connector(settings).open(make_host(sshd.port, user=name)).sudo("true")
    assert "GPURIG_SUDO_PASSWORD" in err.value.fix


def test_put_and_get_round_trip(connector, sshd, tmp_path, make_host, login_user):
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 1000)
    remote = f"/home/{login_user}/uploaded file 'q'.bin"
    with connector.open(make_host(sshd.port)) as conn:
        conn.put(src, remote, mode=0o600)
        assert conn.run(["stat", "-c", "%a %s", remote]).stdout.split() == ["600", "256000"]
        conn.get(remote, tmp_path / "back.bin")
        with pytest.raises(HostError, match="cannot put .* Permission denied"):
            conn.put(src, "/etc/gpurig-not-allowed")
        assert conn.run("ls -a /etc | grep -c gpurig-tmp", warn=True).stdout.strip() == "0"  # nothing half-written left
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_injection_in_host_vars_reaches_the_remote_as_literal_text(write_inventory, connector, sshd, tmp_path):
    marker = tmp_path / "pwned"
    nasty = f"$(touch {marker}); touch {marker}; `touch {marker}` 'single' \"double\" \\ | && > {marker}"
    inv = load_inventory(write_inventory({"evil": {"ansible_host": "127.0.0.1", "ansible_port": sshd.port, "gpurig_label": nasty}}))
    h = inv.hosts["evil"]
    with connector.open(h) as conn:
        assert conn.run(["printf", "%s", h.var("gpurig_label")]).stdout == nasty
        assert conn.sudo(["printf", "%s", h.var("gpurig_label")]).stdout == nasty
    local = Connector(connector.settings).open(dataclasses.replace(h, connection="local"))
    assert local.run(["printf", "%s", nasty]).stdout == nasty
    assert local.sudo(["printf", "%s", nasty]).stdout == nasty
    assert not marker.exists()


@pytest.fixture
def ssh_agent(tmp_path, client_key):
    """A real ssh-agent holding the test key, stopped afterwards."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not create its socket"
            time.sleep(0.01)  # polling for readiness
        subprocess.run(["ssh-add", "-q", str(client_key)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)}, check=True, capture_output=True)
        yield sock
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_key_from_ssh_agent(settings, sshd, ssh_agent, login_user, monkeypatch):
    monkeypatch.setenv("SSH_AUTH_SOCK", str(ssh_agent))
    agent_only = Host(name="h", groups=(), vars={}, address="127.0.0.1", port=sshd.port, user=login_user)
    c = Connector(dataclasses.replace(settings, allow_agent=True))
    assert c.open(agent_only).run("echo agent").stdout == "agent\n"
    with pytest.raises(AuthError, match="no key to offer"):
        Connector(settings).open(agent_only).connect()  # agent off, no key file: nothing to offer


def test_sudo_password_from_the_environment(settings, sudo_user, sshd, make_host, monkeypatch):
    name, password = sudo_user
    monkeypatch.setenv("GPURIG_SUDO_PASSWORD", password)
    assert Connector(settings).open(make_host(sshd.port, user=name)).sudo("id -u").stdout == "0\n"


def test_commands_that_end_while_paramiko_rekeys_do_not_kill_the_connection(connector, sshd, make_host):
    """paramiko rekeys each 512 MB it sends (a deploy's image crosses it): a command ending then must not stall the transport 30 s and kill it."""
    with connector.open(make_host(sshd.port)) as conn:
        packetizer = conn._live_transport().packetizer
        packetizer.REKEY_BYTES = packetizer.REKEY_PACKETS = 1 << 12  # a rekey every few KB sent: every command's close meets one
        start = time.monotonic()
        for i in range(40):
            got = conn.run(f"head -c 300000 /dev/zero | tr '\\0' x; echo {i}", timeout=20)
            assert got.stdout.endswith(f"x{i}\n")
        assert conn._live_transport() is not None and time.monotonic() - start < 60
