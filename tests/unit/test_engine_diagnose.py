"""Why a host's engine did not answer, told from what a plain docker command says there (recorded outputs)."""

from __future__ import annotations

import pytest

from gpurig.connect.connection import Result
from gpurig.connect.engine import diagnose, dial_command


class Conn:
    name = "gpu-01"

    def __init__(self, exited: int, out: str = "", err: str = "", become: bool = True, user: str = "admin"):
        self.become, self.user = become, user
        self._result = Result("gpu-01", "docker version", exited, out, err, 0.1)

    @property
    def needs_sudo(self):
        return self.become and self.user != "root"

    def sudo(self, command, **kw):
        return self._result

    run = admin = sudo


@pytest.mark.parametrize("conn, problem, fix", [
    (Conn(0, "24.0.7\n"), "only through sudo with a password", "NOPASSWD"),
    (Conn(127, err="sh: 1: docker: not found"), "Docker is not installed", "invoke provision"),
    (Conn(1, err="permission denied while trying to connect to the Docker daemon socket", become=False), "may not use the Docker socket", "docker group"),
    (Conn(1, err="Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"), "not running", "systemctl start docker"),
])
def test_each_cause_gets_its_own_line_and_fix(conn, problem, fix):
    err = diagnose(conn, OSError("Socket is closed"))
    assert problem in err.problem and fix in err.fix


def test_sudo_only_for_a_non_root_login_that_asks_for_become():
    assert dial_command(Conn(0)) == "sudo -n -- docker system dial-stdio"
    assert dial_command(Conn(0, user="root")) == "docker system dial-stdio"
    assert dial_command(Conn(0, become=False)) == "docker system dial-stdio"
