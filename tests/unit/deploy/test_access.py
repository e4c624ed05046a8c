"""Access lines: the ssh command and ~/.ssh/config block a person copies, for every way sshd can be published."""

from __future__ import annotations

import shlex

from gpurig.connect.engineinfo import ContainerInfo
from gpurig.connect.target import SSHTarget
from gpurig.deploy.access import lines, ssh_config_block


class Conn:
    name = "a100-01"

    def __init__(self, target):
        self.ssh_target = target


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


def jupyter(bind: str = "127.0.0.1") -> ContainerInfo:
    return ContainerInfo("j" * 64, "gpurig-jupyter", "img", "sha256:x", "running", "healthy", 0, None, {},
                         ((bind, 8888, 8888, "tcp"),), None, "runc")


def test_the_jupyter_tunnel_logs_in_as_gpurig_does_with_the_inventorys_key_port_and_user():
    """Seen: the `ssh -L` line left out ansible_ssh_private_key_file, so it asked for a password or was refused."""
    target = SSHTarget("a100-01", "gpu1.example.com", 2200, "ops", ("/home/me/keys/gpu fleet.pem",))
    tunnel = lines(None, Conn(target), None, jupyter(), "gpurig")[0]
    assert tunnel == ("Jupyter (bound to the host's loopback): first  "
                      "ssh -N -L 8888:127.0.0.1:8888 -i '/home/me/keys/gpu fleet.pem' -p 2200 ops@gpu1.example.com")
    assert shlex.split(tunnel.split("first  ", 1)[1])[4:6] == ["-i", "/home/me/keys/gpu fleet.pem"]
    bare = lines(None, Conn(HOST), None, jupyter(), "gpurig")[0]
    assert bare.endswith("ssh -N -L 8888:127.0.0.1:8888 admin@gpu1.example.com")
