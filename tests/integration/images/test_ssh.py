"""ssh: key login works (torch imports), passwords and root are refused, every container has its own host keys."""

from __future__ import annotations

import paramiko
import pytest
from conftest import CPU_TORCH, host_port, port_open, wait_for


@pytest.fixture(scope="module")
def client_key() -> paramiko.Ed25519Key | paramiko.RSAKey:
    return paramiko.RSAKey.generate(2048)


@pytest.fixture(scope="module")
def ssh_container(build, containers, client_key):
    image = build("ssh").ref
    public = f"{client_key.get_name()} {client_key.get_base64()} test@gpurig"

    def start() -> int:
        cid = containers(image, env={"SSH_AUTHORIZED_KEYS": public}, ports=(22,))
        port = host_port(cid, 22)
        wait_for("sshd answering", lambda: port_open(port) and banner(port), 60)
        return port

    return start


def banner(port: int) -> bool:
    transport = paramiko.Transport(("127.0.0.1", port))
    try:
        transport.start_client(timeout=5)
        return True
    finally:
        transport.close()


def connect(port: int, user: str, **auth) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # a throwaway container on loopback
    client.connect("127.0.0.1", port=port, username=user, timeout=10, allow_agent=False, look_for_keys=False, **auth)
    return client


def host_key(port: int) -> str:
    transport = paramiko.Transport(("127.0.0.1", port))
    try:
        transport.start_client(timeout=5)
        return transport.get_remote_server_key().get_fingerprint().hex()
    finally:
        transport.close()


def test_key_login_runs_torch_as_the_user(ssh_container, client_key):
    port = ssh_container()
    client = connect(port, "gpurig", pkey=client_key)
    try:
        _, stdout, stderr = client.exec_command('id -un; python -c "import torch; print(torch.__version__)"', timeout=60)
        assert stdout.read().decode().split() == ["gpurig", f"{CPU_TORCH}+cpu"], stderr.read().decode()
    finally:
        client.close()


@pytest.mark.parametrize("user", ["gpurig", "root"])
def test_password_login_is_refused(ssh_container, user):
    port = ssh_container()
    with pytest.raises((paramiko.AuthenticationException, paramiko.BadAuthenticationType)):
        connect(port, user, password="gpurig")


def test_root_key_login_is_refused(ssh_container, client_key):
    port = ssh_container()
    with pytest.raises(paramiko.AuthenticationException):
        connect(port, "root", pkey=client_key)


def test_each_container_has_its_own_host_key(ssh_container):
    first, second = ssh_container(), ssh_container()
    assert host_key(first) != host_key(second)
