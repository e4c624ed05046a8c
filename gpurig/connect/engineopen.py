"""Opening a Docker engine: a host's over its Connection, this machine's as its docker CLI finds it; and why one did not answer.

``open_engine(conn)``: on a remote host every HTTP connection is a stream the
Connection opens running ``docker system dial-stdio`` (``gpurig.connect.enginewire``).
``local_engine()``: this machine's, where images are built and deploys send
them from; the engine its docker CLI builds into (``local_endpoint``), and the
only one given the user's registry logins.
"""

from __future__ import annotations

import os
import shlex

import docker.context
import docker.context.config
import docker.errors

from gpurig.connect.connection import Connection
from gpurig.connect.engine import ENGINE_FAILURES, Engine, EngineError
from gpurig.connect.enginewire import api_client
from gpurig.errors import HostError, last_line, permission_denied

DIAL = ["docker", "system", "dial-stdio"]
DEFAULT_SOCKET = "unix:///var/run/docker.sock"


def open_engine(conn: Connection, timeout: float = 120) -> Engine:
    """The Docker engine of ``conn``'s host; a clear EngineError when there is none or it cannot be used.

    On the machine gpurig runs on (no stream to open), the engine its docker CLI uses (``local_endpoint``).
    """
    conn.connect()  # resolves the login user, which decides on sudo
    opener = conn.stream_opener(dial_command(conn))
    host, tls = local_endpoint() if opener is None else ("", None)
    api = api_client(opener, host, timeout, tls)
    try:
        api.ping()
    except ENGINE_FAILURES as err:
        api.close()
        raise diagnose(conn, err) from None
    return Engine(conn.name, api, local=opener is None)


def local_engine(timeout: float = 3600) -> Engine:
    """This machine's engine, where images are built and deploys send them from: the one door build and deploy share.

    ``timeout`` bounds each read of a request that names none of its own (pull, push, import and run take theirs).
    """
    from gpurig.connect.local import LocalConnection

    return open_engine(LocalConnection("build machine"), timeout=timeout)


def local_endpoint(environ: dict[str, str] | None = None) -> tuple[str, object]:
    """(address, TLS settings or None) of the engine this machine's docker CLI talks to, chosen as the CLI chooses it:

    DOCKER_CONTEXT's context, else DOCKER_HOST, else the current context (``docker context use``, in the docker
    config that DOCKER_CONFIG names), else the default socket. The ``default`` context is DOCKER_HOST or the socket.
    """
    env = os.environ if environ is None else environ
    name = env.get("DOCKER_CONTEXT", "")
    if not name:
        if env.get("DOCKER_HOST"):
            return env["DOCKER_HOST"], None
        name = docker.context.config.get_current_context_name()
    if name == "default":
        return env.get("DOCKER_HOST") or DEFAULT_SOCKET, None
    try:
        context = docker.context.ContextAPI.get_context(name)
    except (docker.errors.DockerException, OSError, ValueError, KeyError) as err:
        raise EngineError(f"cannot read the docker context {name}: {last_line(str(err)) or type(err).__name__}",
                          "check `docker context inspect " + name + "`, or `docker context use default`", host="build machine") from None
    if context is None:
        raise EngineError(f"the docker context {name} does not exist",
                          "`docker context ls` lists them; `docker context use` one, or unset DOCKER_CONTEXT", host="build machine")
    return context.Host or DEFAULT_SOCKET, context.TLSConfig


def dial_command(conn: Connection) -> str:
    """``docker system dial-stdio``, through ``sudo -n`` when ``needs_sudo``."""
    if conn.needs_sudo:
        return shlex.join(["sudo", "-n", "--", *DIAL])
    return shlex.join(DIAL)


def diagnose(conn: Connection, err: BaseException) -> EngineError:
    """Why the engine did not answer, asked of the host with a plain command (one line, with the fix)."""
    try:
        result = conn.admin("docker version --format '{{.Server.Version}}'", warn=True, timeout=30)
    except HostError as host_err:
        return EngineError(str(host_err.problem), host_err.fix, host=host_err.host or conn.name)
    text = (result.stderr + result.stdout).strip()
    if result.exited == 0 and conn.needs_sudo:
        # docker answers through sudo with the password gpurig was given, but the API stream's sudo -n cannot ask for one
        return EngineError(
            "the Docker engine answers only through sudo with a password, which its API stream cannot give",
            f"allow NOPASSWD sudo for {conn.user or 'the login user'} (at least for `docker system dial-stdio`), or add it to the docker group", host=conn.name)
    if result.exited == 127 or "not found" in text:
        return EngineError("Docker is not installed", "run `invoke provision` on this host", host=conn.name)
    if permission_denied(text):
        return EngineError(
            f"{conn.user or 'the login user'} may not use the Docker socket",
            "set ansible_become: true (passwordless sudo), or add the user to the docker group", host=conn.name)
    if "a password is required" in text:
        return EngineError(
            "sudo needs a password to reach the Docker engine",
            "allow NOPASSWD sudo for the login user, or add it to the docker group", host=conn.name)
    if "Cannot connect" in text or "Is the docker daemon running" in text:
        return EngineError("the Docker daemon is not running", "start it (`systemctl start docker`) or run `invoke provision`", host=conn.name)
    return EngineError(
        f"the Docker engine did not answer over SSH: {last_line(text) or last_line(str(err)) or type(err).__name__}",
        "check `docker system dial-stdio` works on the host (Docker 18.09 or newer)", host=conn.name)
