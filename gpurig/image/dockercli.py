"""The local docker CLI that builds images: find a BuildKit-capable client, check its daemon, stream ``docker build``.

That is all it does. Every other engine verb the build needs (inspect, tag,
pull, push, list, save, import, run) is ``gpurig.connect.engine.Engine``'s,
on the engine this CLI builds into (``gpurig.connect.engineopen.local_engine``: DOCKER_CONTEXT,
DOCKER_HOST or the current docker context, as the CLI chooses), with the
user's registry logins. The build stays on the CLI because BuildKit's
build and its plain progress output are the CLI's (buildx), not the engine API's.
Every call is an argv list (nothing passes through a shell); every failure
the user can meet is a DockerError with its fix. ``docker build`` is
streamed through ``DockerClient.stream``, which never leaves the child
running: on any exit path, an interrupt included, it is stopped and waited for."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpurig.connect.engine import EngineError
from gpurig.connect.engineopen import DEFAULT_SOCKET, local_endpoint
from gpurig.errors import DockerError, last_line
from gpurig.process import stop

_VERSION = re.compile(r"version (\d+)\.(\d+)\.(\d+)")
STOP_GRACE_S = 10


@dataclass(frozen=True)
class DockerClient:
    """A docker CLI binary that can build with BuildKit: built in (18.09 to 22.x) or through buildx."""

    path: str
    version: str
    buildx: bool

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_BUILDKIT": "1"}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``docker ARGS``, output captured; a DockerError when the client does not answer within ``timeout``."""
        try:
            return subprocess.run([self.path, *args], capture_output=True, text=True, timeout=timeout, env=self.env())
        except subprocess.TimeoutExpired:
            raise DockerError(
                f"`docker {' '.join(args[:2])}` gave no answer within {timeout:.0f} s", "check that the daemon is healthy"
            ) from None

    @contextmanager
    def stream(self, argv: list[str]) -> Iterator[subprocess.Popen]:
        """Start ``docker ARGV`` with stdout+stderr merged into text lines; the child never outlives the block.

        The child stays in gpurig's process group (a terminal's Ctrl-C or
        ``timeout`` reaches both); when the block ends early for any reason it
        is asked to stop (SIGTERM, which cancels a BuildKit build), and killed
        after STOP_GRACE_S.
        """
        proc = subprocess.Popen(
            [self.path, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=self.env(),
        )
        try:
            yield proc
        finally:
            stop(proc, STOP_GRACE_S)


# --- finding a client -------------------------------------------------------------


def supports_buildkit(version: str, buildx: bool) -> bool:
    """Clients from 23.0 build only through the buildx plugin; older ones (from 18.09) have BuildKit built in."""
    if buildx:
        return True
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    return len(parts) == 2 and (18, 9) <= parts < (23, 0)


def parse_client_version(text: str) -> str:
    """'Docker version 20.10.24+dfsg1, build 297e128' -> '20.10.24'."""
    found = _VERSION.search(text)
    return ".".join(found.groups()) if found else ""


def docker_candidates(path: str | None = None) -> list[str]:
    """Every `docker` on PATH, in PATH order, each real binary once."""
    seen, found = set(), []
    for folder in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        candidate = os.path.join(folder or ".", "docker")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            real = os.path.realpath(candidate)
            if real not in seen:
                seen.add(real)
                found.append(candidate)
    return found


def probe_client(binary: str) -> DockerClient:
    """Ask one docker binary its version and whether it has buildx (neither needs the daemon)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        buildx = subprocess.run([binary, "buildx", "version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return DockerClient(binary, "", False)
    return DockerClient(binary, parse_client_version(out.stdout), buildx.returncode == 0)


def choose_client(clients: list[DockerClient]) -> DockerClient:
    """The first client that can build with BuildKit, or a DockerError saying what to install."""
    if not clients:
        raise DockerError(
            "docker is not installed (no `docker` on PATH)",
            "install Docker (Debian: apt-get install docker.io), start dockerd, and put docker on PATH",
        )
    for client in clients:
        if supports_buildkit(client.version, client.buildx):
            return client
    tried = ", ".join(f"{c.path} ({c.version or 'unknown version'}, no buildx)" for c in clients)
    raise DockerError(
        f"no docker client on PATH can build with BuildKit: {tried}",
        "install the docker buildx plugin, or put a client with BuildKit built in first on PATH "
        "(Debian's docker.io: /usr/bin/docker), or name one with GPURIG_DOCKER=/path/to/docker",
    )


def find_client(path: str | None = None) -> DockerClient:
    """$GPURIG_DOCKER, else the first BuildKit-capable docker on PATH; its daemon must answer."""
    forced = os.environ.get("GPURIG_DOCKER")
    if forced:
        if not (os.path.isfile(forced) and os.access(forced, os.X_OK)):
            raise DockerError(f"GPURIG_DOCKER={forced} is not an executable", "point it at a docker binary or unset it")
        client = choose_client([probe_client(forced)])
    else:
        client = choose_client([probe_client(b) for b in docker_candidates(path)])
    check_daemon(client)
    return client


def check_daemon(client: DockerClient) -> str:
    """The engine's version, or a DockerError when the daemon does not answer."""
    try:
        host = local_endpoint()[0]
    except EngineError:  # a context that cannot be read: the CLI says so below
        host = os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
    try:
        proc = client.run("version", "--format", "{{.Server.Version}}", timeout=30)
        reason = last_line(proc.stderr, default="no reason given")
    except DockerError:
        proc, reason = None, "no answer in 30 s"
    if proc is None or proc.returncode != 0 or not proc.stdout.strip():
        raise DockerError(
            f"the Docker daemon at {host} does not answer ({reason})",
            "start it (systemctl start docker, or `dockerd &`) or point DOCKER_HOST at a running one",
        )
    return proc.stdout.strip()

