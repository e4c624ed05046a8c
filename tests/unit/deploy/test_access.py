"""Access lines: the ssh command and ~/.ssh/config block a person copies, for every way sshd can be published."""

from __future__ import annotations

from gpurig.connect.engineinfo import ContainerInfo
from gpurig.connect.target import SSHTarget
from gpurig.deploy.access import lines, ssh_config_block


class Conn:
    name = "a100-01"

    def __init__(self, target):
        self.target = target


def container(bind: str, port: int = 2222) -> ContainerInfo:
    return ContainerInfo("c" * 64, "gpurig-ssh", "img", "sha256:x", "running", None, 0, None, {}, ((bind, port, 22, "tcp"),), None, "runc")


HOST = SSHTarget("a100-01", "gpu1.example.com", 22, "admin", ())


def test_sshd_on_every_address_is_reached_directly():
    out = lines(None, Conn(HOST), None, container("0.0.0.0"), "gpurig")
    assert out[0] == "SSH: ssh -p 2222 gpurig@gpu1.example.com"
    assert "    HostName gpu1.example.com" in "\n".join(out) and "ProxyJump" not in "\n".join(out)


def test_sshd_on_the_hosts_loopback_goes_through_the_hosts_own_login():
    out = lines(None, Conn(HOST), None, container("127.0.0.1"), "gpurig")
    assert out[0] == "SSH: ssh -J admin@gpu1.example.com:22 -p 2222 gpurig@127.0.0.1"
    assert "        ProxyJump admin@gpu1.example.com:22" in out


def test_no_config_block_from_values_that_would_be_ssh_config_syntax():
    assert ssh_config_block("x", "gpu1\n    ProxyCommand sh -c evil", 2222, "gpurig") == []
    assert ssh_config_block("x", "gpu1", 2222, "gpurig foo") == []
    assert ssh_config_block("a b/c", "gpu1", 2222, "gpurig")[0] == "Host a-b-c"
