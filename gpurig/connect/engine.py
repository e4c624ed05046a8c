"""A host's Docker engine through its HTTP API: the door to Docker for every host, local or remote, and for verify.

The image build alone runs the docker CLI (``gpurig.image.dockercli``, a
layer below, for BuildKit and the local store around a build).

``open_engine(conn)`` gives an ``Engine``. On a remote host every HTTP
connection is a stream the Connection opens running ``docker system
dial-stdio`` (``gpurig.connect.enginewire``); on the machine gpurig runs on,
the engine's unix socket (or DOCKER_HOST) is used directly.

Every method returns typed results (``gpurig.connect.engineinfo``) or
nothing, and every failure of a request, whatever docker-py, requests or the
socket raised, becomes one ``EngineError`` with the problem and the fix
(``EngineLost`` when the connection to the engine broke off). No ``docker``
CLI text is parsed, and no caller sees docker-py.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import closing, suppress

import docker
import docker.auth
import docker.errors
import requests
import urllib3.exceptions

from gpurig.connect.connection import Connection
from gpurig.connect.engineinfo import ContainerInfo, EngineInfo, Exited, ImageInfo, container_info, engine_info, image_info
from gpurig.connect.enginewire import api_client, demux, read_to_end
from gpurig.errors import HostError, last_line, permission_denied

DIAL = ["docker", "system", "dial-stdio"]
# Everything a request can fail with: the engine's refusal (docker.errors) or a broken connection.
_FAILURES = (docker.errors.DockerException, requests.RequestException, urllib3.exceptions.HTTPError, OSError)
_LOST = (requests.RequestException, urllib3.exceptions.HTTPError, OSError)


class EngineError(HostError):
    """A host's Docker engine that cannot be reached or refused a request.

    ``reason`` is the engine's own words (or the broken connection's), without the host and the request.
    """

    def __init__(self, problem: str, fix: str = "", reason: str = "", host: str = "") -> None:
        super().__init__(problem, fix, host)
        self.reason = reason or problem


class EngineLost(EngineError):
    """The connection to the engine broke off during a request (asking again may work)."""


class Engine:
    """One host's engine; ``name`` is the host's inventory name (it starts every error message)."""

    def __init__(self, name: str, api: docker.APIClient) -> None:
        self.name = name
        self._api = api

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._api.close()

    # --- reading ---------------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        info = self._call("read the engine's info", self._api.info)
        version = self._call("read the engine's version", self._api.version)
        return engine_info(info, version)

    def image(self, ref: str) -> ImageInfo | None:
        """The image ``ref`` (a name:tag or an id) names on this host, or None."""
        data = self._inspect(self._api.inspect_image, f"inspect image {ref}", ref)
        return None if data is None else image_info(data)

    def container(self, name: str) -> ContainerInfo | None:
        data = self._inspect(self._api.inspect_container, f"inspect container {name}", name)
        return None if data is None else container_info(data)

    def containers(self, label: str | None = None) -> list[ContainerInfo]:
        """Every container (running or not), optionally only those carrying ``label`` (``key`` or ``key=value``)."""
        filters = {"label": [label]} if label else None
        listed = self._call("list containers", self._api.containers, all=True, filters=filters)
        found = []
        for entry in listed:
            info = self.container(entry["Id"])
            if info is not None:  # removed between the list and the inspect
                found.append(info)
        return sorted(found, key=lambda c: c.name)

    def image_tags(self) -> list[str]:
        """Every name:tag of every image on this host."""
        return [tag for entry in self._call("list images", self._api.images) for tag in entry.get("RepoTags") or ()]

    def distribution_digest(self, ref: str) -> str:
        """The manifest digest a registry gives for ``ref``, asked through this engine (no layer moves)."""
        what = f"ask the registry for {ref}"
        data = self._call(what, self._api.inspect_distribution, ref)
        try:
            return str(data["Descriptor"]["digest"])
        except (KeyError, TypeError):
            raise EngineError(f"the registry's answer for {ref} names no digest", "check the registry", "no digest in its answer", host=self.name) from None

    # --- containers ------------------------------------------------------------------------------

    def create(self, body: dict, name: str) -> str:
        """A container from an engine API create request; its id."""
        return str(self._call(f"create {name}", self._api.create_container_from_config, body, name=name)["Id"])

    def start(self, ref: str) -> None:
        self._call(f"start {ref}", self._api.start, ref)

    def stop(self, ref: str, timeout: int = 10) -> None:
        """Stop it, killing it after ``timeout`` seconds."""
        self._call(f"stop {ref}", self._api.stop, ref, timeout=timeout)

    def remove(self, ref: str) -> None:
        """Remove it, stopping it first if it runs (its anonymous volumes stay)."""
        self._call(f"remove {ref}", self._api.remove_container, ref, force=True)

    def put_archive(self, ref: str, path: str, data: bytes) -> None:
        """Unpack a tar into the container at ``path`` (before it starts, too)."""
        self._call(f"copy files into {ref}", self._api.put_archive, ref, path, data)

    def wait(self, ref: str, timeout: float) -> int | None:
        """Its exit code if it exits within ``timeout`` seconds; None while it still runs then."""
        try:
            return self._api.wait(ref, timeout=timeout).get("StatusCode")
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            return None  # still running after the timeout
        except _FAILURES as err:
            raise self._error(f"wait for {ref}", err) from None

    def logs(self, ref: str, tail: int | str = "all") -> str:
        """Its last ``tail`` lines of stdout and stderr."""
        data = self._call(f"read the logs of {ref}", self._api.logs, ref, stdout=True, stderr=True, tail=tail)
        return data.decode(errors="replace") if isinstance(data, bytes) else str(data)

    def follow_logs(self, ref: str, tail: int | str = "all", follow: bool = False) -> Iterator[bytes]:
        """Its stdout and stderr as they come, from ``tail`` lines back; with ``follow`` until it stops or the caller does."""
        what = f"read the logs of {ref}"
        return self._stream(what, self._call(what, self._api.logs, ref, stream=True, follow=follow, tail=tail, stdout=True, stderr=True))

    def exec_run(self, ref: str, argv: list[str]) -> tuple[int | None, bytes]:
        """(exit code, stdout) of ``argv`` run in the running container."""
        what = f"run {argv[0]} in {ref}"
        run = self._call(what, self._api.exec_create, ref, argv, stdout=True, stderr=False)
        out = self._call(what, self._api.exec_start, run["Id"])
        code = self._call(what, self._api.exec_inspect, run["Id"]).get("ExitCode")
        return code, out if isinstance(out, bytes) else str(out).encode()

    def exec(self, ref: str, argv: list[str], timeout: float) -> Exited | None:
        """``argv`` run in the running container to its end; None when it still runs after ``timeout`` seconds.

        An overrunning process is left to run: the engine cannot stop one exec
        (``docker exec``, its client gone, leaves it running too).
        """
        deadline = time.monotonic() + timeout
        what = f"run {argv[0]} in {ref}"
        run = self._call(what, self._api.exec_create, ref, argv, stdout=True, stderr=True)
        sock = self._call(what, self._api.exec_start, run["Id"], socket=True)
        try:
            data = self._call(what, read_to_end, sock, deadline)
        finally:
            _close(sock)
        if data is None:
            return None
        code = self._call(what, self._api.exec_inspect, run["Id"]).get("ExitCode")
        out, err = demux(data)
        return Exited(int(code or 0), out.decode(errors="replace"), err.decode(errors="replace"))

    def run(self, body: dict, name: str, timeout: float) -> Exited | None:
        """A throwaway container made from a create request, run to its end; None when it still runs after ``timeout`` seconds.

        The container is removed on every way out (an overrun, a refusal to
        start, Ctrl-C), as ``docker run --rm`` would once it ends.
        """
        deadline = time.monotonic() + timeout
        self.create(body, name)
        try:
            self.start(name)
            remaining = deadline - time.monotonic()
            code = self.wait(name, remaining) if remaining > 0 else None
            if code is None:
                return None
            what = f"read the output of {name}"
            out = self._call(what, self._api.logs, name, stdout=True, stderr=False)
            err = self._call(what, self._api.logs, name, stdout=False, stderr=True)
            return Exited(int(code), out.decode(errors="replace"), err.decode(errors="replace"))
        finally:
            # a failure to remove must not hide why the run ended; the container carries the caller's label to be found by
            with suppress(EngineError):
                self.remove(name)

    # --- images ----------------------------------------------------------------------------------

    def tag(self, image_id: str, ref: str) -> None:
        """Give the image the name ``ref`` (name:tag), taking it from any image that had it."""
        name, _, tag = ref.rpartition(":")
        self._call(f"tag {ref}", self._api.tag, image_id, name, tag, force=True)

    def untag(self, ref: str) -> None:
        """Remove the name ``ref`` (the layers stay while another name uses them); nothing when there is no such name."""
        try:
            self._api.remove_image(ref, noprune=False)
        except docker.errors.NotFound:
            pass
        except _FAILURES as err:
            raise self._error(f"untag {ref}", err) from None

    def push(self, ref: str, on_event: Callable[[dict], None] = lambda event: None) -> None:
        """Push ``ref`` (name:tag) to its registry; an error the registry streams back is an EngineError too.

        Each JSON event goes to ``on_event``, which may raise to stop: the
        response is closed then, and the engine, its client gone, stops the push.
        """
        name, _, tag = ref.rpartition(":")
        what, api = f"push {ref}", self._api
        # docker-py's push() hides the response, as its pull() does; its credentials header is kept (docker login's)
        header = docker.auth.get_config_header(api, docker.auth.resolve_repository_name(name)[0])
        response = self._call(what, api._post_json, api._url("/images/{0}/push", name), None, params={"tag": tag},
                              headers={"X-Registry-Auth": header} if header else {}, stream=True, timeout=None)
        with closing(self._events(what, response)) as events:
            for event in events:
                if "error" in event:
                    reason = last_line(str(event["error"]))
                    raise EngineError(f"the Docker engine refused to {what}: {reason}", "see the engine's message", reason, host=self.name)
                on_event(event)

    def pull(self, ref: str, on_event: Callable[[dict], None]) -> None:
        """The engine pulls ``ref`` (name:tag); each JSON event it streams goes to ``on_event`` (which may raise to stop).

        On any end before the pull completed (``on_event`` raising, Ctrl-C, a lost
        connection) the response is closed: the engine sees its client leave and stops the pull.
        """
        name, _, tag = ref.rpartition(":")
        what, api = f"pull {ref}", self._api
        # docker-py's pull() hides the response; it is needed to close it (and stop the engine's pull) on an interruption.
        response = self._call(what, api._post, api._url("/images/create"), params={"fromImage": name, "tag": tag}, stream=True, timeout=None)
        with closing(self._events(what, response)) as events:
            for event in events:
                on_event(event)

    def save(self, ref: str) -> Generator[bytes, None, None]:
        """``docker save ref``: the image as a tar stream, in chunks of 1 MiB.

        Closing the iterator early closes the response, and the engine stops writing the tar.
        """
        what, api = f"save {ref}", self._api
        response = self._call(what, api._get, api._url("/images/{0}/get", ref), stream=True, timeout=None)
        try:
            api._raise_for_status(response)
            yield from response.iter_content(1 << 20, False)
        except _FAILURES as err:
            raise self._error(what, err) from None
        finally:
            response.close()

    def load(self, chunks: Iterable[bytes]) -> Iterator[dict]:
        """``docker load`` of a tar stream; the engine's JSON events (an ``error`` event is the engine's refusal)."""
        what = "load an image"
        answer = self._call(what, self._api.load_image, chunks)
        return (event for event in self._stream(what, answer or ()) if isinstance(event, dict))

    def _events(self, what: str, response) -> Generator[dict, None, None]:
        """The JSON events of a streamed answer; closing the generator closes the response, and the engine, its client gone, stops."""
        api = self._api
        try:
            api._raise_for_status(response)
            for event in api._stream_helper(response, decode=True):
                if isinstance(event, dict):
                    yield event
        except _FAILURES as err:
            raise self._error(what, err) from None
        finally:
            response.close()

    # --- the one error conversion ----------------------------------------------------------------

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
        except _FAILURES as err:
            raise self._error(what, err) from None

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _FAILURES as err:
            raise self._error(what, err) from None

    def _stream(self, what: str, items: Iterable) -> Iterator:
        try:
            yield from items
        except _FAILURES as err:
            raise self._error(what, err) from None

    def _error(self, what: str, err: BaseException) -> EngineError:
        """One line for a failed request: the engine's own explanation when it gave one."""
        if isinstance(err, docker.errors.APIError):
            reason = err.explanation or str(err)
            if isinstance(reason, bytes):
                reason = reason.decode(errors="replace")
            reason = last_line(str(reason))
            return EngineError(f"the Docker engine refused to {what}: {reason}",
                               "see the engine's message; `docker info` on the host", reason, host=self.name)
        reason = last_line(str(err)) or type(err).__name__
        kind = EngineLost if isinstance(err, _LOST) else EngineError
        return kind(f"lost the Docker engine while trying to {what}: {reason}",
                    "check that dockerd runs on the host (`invoke facts`) and retry", reason, host=self.name)


def _close(sock) -> None:
    """Close an exec's hijacked stream and the HTTP response under it (docker-py keeps it on the socket where it can)."""
    response = getattr(sock, "_response", None)
    if response is not None:
        response.close()
    sock.close()


# --- opening ---------------------------------------------------------------------------------


def open_engine(conn: Connection, timeout: float = 120) -> Engine:
    """The Docker engine of ``conn``'s host; a clear EngineError when there is none or it cannot be used."""
    conn.connect()  # resolves the login user, which decides on sudo
    local_socket = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    api = api_client(conn.stream_opener(dial_command(conn)), local_socket, timeout)
    try:
        api.ping()
    except _FAILURES as err:
        api.close()
        raise diagnose(conn, err) from None
    return Engine(conn.name, api)


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
