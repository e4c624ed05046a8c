"""Why a host's engine did not answer, told from what a plain docker command says there (recorded outputs)."""

from __future__ import annotations

import pytest
from fakes import ScriptedConnection

from gpurig.connect.engine import EngineError
from gpurig.connect.engineopen import diagnose, dial_command


def Conn(exited: int, out: str = "", err: str = "", become: bool = True, user: str = "admin") -> ScriptedConnection:
    """A host whose every command (docker version, through sudo or not) answers as recorded."""
    return ScriptedConnection("gpu-01", [(exited, out, err)], user=user, become=become)


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


# ---- the one error conversion: what a caller gets whatever docker-py, requests or the socket raised ----


class Refusing:
    """docker-py's client as far as the Engine uses it, failing as a refusing engine or a broken connection would."""

    def __init__(self, err: BaseException) -> None:
        self.err = err

    def start(self, ref):
        raise self.err

    def logs(self, ref, **kw):
        def chunks():
            yield b"first line\n"
            raise self.err
        return chunks()

    def inspect_container(self, ref):
        raise self.err


def refused(message: str):
    import docker.errors
    import requests

    response = requests.Response()
    response.status_code = 404 if "No such" in message else 409
    return docker.errors.APIError("409 Client Error", response=response, explanation=message)


def test_a_refusal_names_the_host_the_request_and_the_engines_words():
    from gpurig.connect.engine import Engine, EngineError, EngineLost

    engine = Engine("gpu-01", Refusing(refused("Conflict. The container name is already in use\n")))
    with pytest.raises(EngineError) as err:
        engine.start("alice")
    assert not isinstance(err.value, EngineLost)
    assert err.value.problem == "the Docker engine refused to start alice: Conflict. The container name is already in use"
    assert err.value.host == "gpu-01" and str(err.value).startswith("gpu-01: the Docker engine refused")
    assert err.value.reason == "Conflict. The container name is already in use" and "docker info" in err.value.fix


def test_a_connection_that_breaks_mid_stream_is_lost_not_refused():
    import requests

    from gpurig.connect.engine import Engine, EngineLost

    engine = Engine("gpu-01", Refusing(requests.exceptions.ConnectionError("Connection aborted")))
    stream = engine.follow_logs("alice", follow=True)
    assert next(stream) == b"first line\n"
    with pytest.raises(EngineLost) as err:
        next(stream)
    assert "lost the Docker engine while trying to read the logs of alice: Connection aborted" in err.value.problem
    assert "dockerd runs" in err.value.fix


def test_no_such_container_is_none_not_an_error():
    from gpurig.connect.engine import Engine

    assert Engine("gpu-01", Refusing(refused("No such container: alice"))).container("alice") is None


def test_the_engine_is_opened_through_the_connections_stream_not_by_asking_its_kind():
    from gpurig.connect.engineopen import open_engine

    conn = Conn(0)
    with pytest.raises(EngineError) as err:
        open_engine(conn, timeout=5)
    assert conn.streams == ["sudo -n -- docker system dial-stdio"]
    assert "only through sudo with a password" in err.value.problem  # diagnosed by a plain command, as before
