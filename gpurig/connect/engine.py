"""A host's Docker engine through its HTTP API, reached over gpurig's own SSH transport.

``open_engine(conn)`` gives an ``Engine``: docker-py's low-level client
(``engine.api``) whose every HTTP connection is a channel of the host's SSH
transport running ``docker system dial-stdio`` (the engine's unix socket on
stdin/stdout, as the docker CLI's own ``ssh://`` mode does). The transport is
the one gpurig opened and checked the host key of, so nothing here trusts an
unknown key (docker-py's own ``ssh://`` mode would). On the machine gpurig
runs on, the engine's unix socket is used directly.

Results are typed (``EngineInfo``, ``ImageInfo``, ``ContainerInfo``); no
``docker`` CLI text is parsed.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone

import docker
import docker.errors
import requests
import urllib3.connection
from docker.transport.basehttpadapter import BaseHTTPAdapter
from docker.transport.sshconn import SSHConnectionPool

from gpurig.connect.connection import Connection
from gpurig.errors import HostError, last_line, permission_denied

API_VERSION = "1.41"  # Docker 20.10, the oldest engine gpurig provisions; newer engines answer it too
DIAL = ["docker", "system", "dial-stdio"]


class EngineError(HostError):
    """A host's Docker engine that cannot be reached or refused a request."""


@dataclass(frozen=True)
class EngineInfo:
    server_version: str
    api_version: str
    runtimes: tuple[str, ...]
    default_runtime: str
    root_dir: str
    cpus: int
    memory: int


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: dict
    size: int


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image: str  # the image reference it was created from
    image_id: str
    status: str  # created | running | exited | ...
    health: str | None  # healthy | unhealthy | starting | None (no healthcheck)
    exit_code: int
    started_at: datetime | None
    labels: dict
    ports: tuple[tuple[str, int, int, str], ...]  # (host ip, host port, container port, proto)
    device_ids: tuple[str, ...] | None  # None: no GPUs asked; ("all",) for every GPU
    runtime: str
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def running(self) -> bool:
        return self.status == "running"


# --- the SSH transport as docker-py's HTTP connection ----------------------------------------


class _StreamConnection(urllib3.connection.HTTPConnection):
    """One HTTP connection = one SSH channel running ``docker system dial-stdio``."""

    def __init__(self, open_stream, timeout) -> None:
        super().__init__("localhost", timeout=timeout)
        self._open_stream = open_stream

    def connect(self) -> None:
        self.sock = self._open_stream(self.timeout)


class _StreamPool(SSHConnectionPool):
    def __init__(self, open_stream, timeout, maxsize) -> None:
        super().__init__(ssh_client=None, timeout=timeout, maxsize=maxsize, host="gpurig")
        self._open_stream = open_stream

    def _new_conn(self):
        return _StreamConnection(self._open_stream, self.timeout)

    def _get_conn(self, timeout):
        # docker-py's pool skips urllib3's dropped-connection check: a pooled channel whose dial-stdio
        # ended (dockerd restarted) would fail the next request once. Closed, it is opened again.
        conn = super()._get_conn(timeout)
        chan = getattr(conn, "sock", None)
        if chan is not None and (chan.closed or chan.eof_received):
            conn.close()
        return conn


class _StreamAdapter(BaseHTTPAdapter):
    def __init__(self, open_stream, timeout: float, max_pool_size: int = 8) -> None:
        self._pool = _StreamPool(open_stream, timeout, max_pool_size)
        super().__init__()

    def get_connection(self, url, proxies=None):
        return self._pool

    def close(self) -> None:
        super().close()
        self._pool.close()


class _SSHAPIClient(docker.APIClient):
    """docker-py's APIClient with every request sent through ``open_stream`` (a callable giving a channel)."""

    def __init__(self, open_stream, timeout: float) -> None:
        # An explicit version skips docker-py's detection request, which would go out before the adapter is mounted.
        super().__init__(base_url="tcp://gpurig.invalid:2375", version=API_VERSION, timeout=timeout)
        self._custom_adapter = _StreamAdapter(open_stream, timeout)
        self.mount("http+docker://ssh", self._custom_adapter)
        self._unmount("http://", "https://")
        # "ssh" in the URL makes docker-py read attach/log streams from the channel (its SSH code path).
        self.base_url = "http+docker://ssh"


# --- the engine --------------------------------------------------------------------------------


class Engine:
    """One host's engine. ``api`` is docker-py's low-level client; the methods return typed results."""

    def __init__(self, name: str, api: docker.APIClient) -> None:
        self.name = name
        self.api = api

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.api.close()

    def info(self) -> EngineInfo:
        info = self._call("read the engine's info", self.api.info)
        version = self._call("read the engine's version", self.api.version)
        return EngineInfo(
            server_version=str(version.get("Version", "")),
            api_version=str(version.get("ApiVersion", "")),
            runtimes=tuple(sorted((info.get("Runtimes") or {}).keys())),
            default_runtime=str(info.get("DefaultRuntime") or "runc"),
            root_dir=str(info.get("DockerRootDir") or "/var/lib/docker"),
            cpus=int(info.get("NCPU") or 0),
            memory=int(info.get("MemTotal") or 0),
        )

    def image(self, ref: str) -> ImageInfo | None:
        """The image ``ref`` (a name:tag or an id) names on this host, or None."""
        data = self._inspect(self.api.inspect_image, f"inspect image {ref}", ref)
        if data is None:
            return None
        return ImageInfo(
            id=data["Id"],
            tags=tuple(data.get("RepoTags") or ()),
            labels=dict((data.get("Config") or {}).get("Labels") or {}),
            size=int(data.get("Size") or 0),
        )

    def container(self, name: str) -> ContainerInfo | None:
        data = self._inspect(self.api.inspect_container, f"inspect container {name}", name)
        return None if data is None else container_info(data)

    def _inspect(self, fn, what: str, key: str) -> dict | None:
        """``fn(key)``'s answer, or None when the engine says there is no such thing."""
        try:
            return fn(key)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as err:
            if err.status_code == 404:
                return None
            raise self._error(what, err) from None
        except (requests.RequestException, OSError) as err:
            raise self._error(what, err) from None

    def containers(self, label: str | None = None) -> list[ContainerInfo]:
        """Every container (running or not), optionally only those carrying ``label`` (``key`` or ``key=value``)."""
        filters = {"label": [label]} if label else None
        listed = self._call("list containers", self.api.containers, all=True, filters=filters)
        found = []
        for entry in listed:
            info = self.container(entry["Id"])
            if info is not None:  # removed between the list and the inspect
                found.append(info)
        return sorted(found, key=lambda c: c.name)

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (docker.errors.APIError, docker.errors.DockerException, requests.RequestException, OSError) as err:
            raise self._error(what, err) from None

    def _error(self, what: str, err: BaseException) -> EngineError:
        return engine_error(self.name, what, err)


def engine_error(host: str, what: str, err: BaseException) -> EngineError:
    """One line for a failed engine request: the engine's own explanation when it gave one."""
    if isinstance(err, docker.errors.APIError):
        reason = err.explanation or str(err)
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        return EngineError(f"{host}: the Docker engine refused to {what}: {last_line(str(reason))}", "see the engine's message; `docker info` on the host")
    return EngineError(f"{host}: lost the Docker engine while trying to {what}: {last_line(str(err)) or type(err).__name__}", "check that dockerd runs on the host (`invoke facts`) and retry")


def container_info(data: dict) -> ContainerInfo:
    state = data.get("State") or {}
    host_config = data.get("HostConfig") or {}
    config = data.get("Config") or {}
    ports = []
    for key, bindings in sorted(((data.get("NetworkSettings") or {}).get("Ports") or {}).items()):
        port, _, proto = key.partition("/")
        for b in bindings or ():
            if b.get("HostPort"):
                ports.append((b.get("HostIp") or "", int(b["HostPort"]), int(port), proto or "tcp"))
    if not ports:  # not running: the asked bindings
        for key, bindings in sorted((host_config.get("PortBindings") or {}).items()):
            port, _, proto = key.partition("/")
            for b in bindings or ():
                if b.get("HostPort"):
                    ports.append((b.get("HostIp") or "", int(b["HostPort"]), int(port), proto or "tcp"))
    devices: tuple[str, ...] | None = None
    for req in host_config.get("DeviceRequests") or ():
        if ["gpu"] in (req.get("Capabilities") or []) or req.get("Driver") == "nvidia":
            ids = tuple(req.get("DeviceIDs") or ())
            devices = ids if ids else ("all",) if req.get("Count") == -1 else tuple(str(i) for i in range(int(req.get("Count") or 0)))
    health = (state.get("Health") or {}).get("Status")
    return ContainerInfo(
        id=data["Id"],
        name=str(data.get("Name") or "").lstrip("/"),
        image=str(config.get("Image") or ""),
        image_id=str(data.get("Image") or ""),
        status=str(state.get("Status") or ""),
        health=health,
        exit_code=int(state.get("ExitCode") or 0),
        started_at=_time(state.get("StartedAt")) if state.get("Running") else None,
        labels=dict(config.get("Labels") or {}),
        ports=tuple(ports),
        device_ids=devices,
        runtime=str(host_config.get("Runtime") or "runc"),
        raw=data,
    )


def _time(text: str | None) -> datetime | None:
    if not text or text.startswith("0001-"):
        return None
    main, _, frac = text.rstrip("Z").partition(".")
    try:
        return datetime.fromisoformat(main).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


# --- opening ---------------------------------------------------------------------------------


def open_engine(conn: Connection, timeout: float = 120) -> Engine:
    """The Docker engine of ``conn``'s host; a clear EngineError when there is none or it cannot be used."""
    from gpurig.connect.ssh import SSHConnection

    if isinstance(conn, SSHConnection):
        conn.connect()  # resolves the login user, which decides on sudo
        line = dial_command(conn)

        def open_stream(stream_timeout):
            return conn.open_stream(line, stream_timeout)

        api = _SSHAPIClient(open_stream, timeout)
    else:
        api = docker.APIClient(base_url=os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock", version=API_VERSION, timeout=timeout)
    engine = Engine(conn.name, api)
    try:
        api.ping()
    except (docker.errors.DockerException, requests.RequestException, OSError) as err:
        api.close()
        raise diagnose(conn, err) from None
    return engine


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
        return EngineError(str(host_err.problem), host_err.fix)
    text = (result.stderr + result.stdout).strip()
    if result.exited == 0 and conn.needs_sudo:
        # docker answers through sudo with the password gpurig was given, but the API stream's sudo -n cannot ask for one
        return EngineError(
            f"{conn.name}: the Docker engine answers only through sudo with a password, which its API stream cannot give",
            f"allow NOPASSWD sudo for {conn.user or 'the login user'} (at least for `docker system dial-stdio`), or add it to the docker group",
        )
    if result.exited == 127 or "not found" in text:
        return EngineError(f"{conn.name}: Docker is not installed", "run `invoke provision` on this host")
    if permission_denied(text):
        return EngineError(
            f"{conn.name}: {conn.user or 'the login user'} may not use the Docker socket",
            "set ansible_become: true (passwordless sudo), or add the user to the docker group",
        )
    if "a password is required" in text:
        return EngineError(
            f"{conn.name}: sudo needs a password to reach the Docker engine",
            "allow NOPASSWD sudo for the login user, or add it to the docker group",
        )
    if "Cannot connect" in text or "Is the docker daemon running" in text:
        return EngineError(f"{conn.name}: the Docker daemon is not running", "start it (`systemctl start docker`) or run `invoke provision`")
    return EngineError(
        f"{conn.name}: the Docker engine did not answer over SSH: {last_line(text) or last_line(str(err)) or type(err).__name__}",
        "check `docker system dial-stdio` works on the host (Docker 18.09 or newer)",
    )
