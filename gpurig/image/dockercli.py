"""The local docker CLI that builds images: find a BuildKit-capable client, check its daemon, stream a build; and the local-store
verbs the build pipeline uses around it (inspect, tag, pull, push, list, save, run once).

Those verbs are Engine's too (``gpurig.connect.engine``), which every host
and verify reach Docker through; they stay here only because image/ ranks
below connect/ and cannot call Engine, and because the CLI pulls with the
user's registry logins (Engine.pull sends none) and follows the current
docker context, as the build itself does (Engine uses DOCKER_HOST or the socket).
Every call is an argv list (nothing passes through a shell); every failure
the user can meet is a DockerError with its fix. Long-running children
(``docker build``) are streamed through ``DockerClient.stream``, which never
leaves the child running: on any exit path, an interrupt included, it is
stopped and waited for."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from gpurig.errors import DockerError, last_line
from gpurig.process import stop

_VERSION = re.compile(r"version (\d+)\.(\d+)\.(\d+)")
_PUSHED = re.compile(r"digest: (sha256:[0-9a-f]{64})")
STOP_GRACE_S = 10


@dataclass(frozen=True)
class DockerClient:
    """A docker CLI binary that can build with BuildKit: built in (18.09 to 22.x) or through buildx."""

    path: str
    version: str
    buildx: bool

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_BUILDKIT": "1"}

    def run(self, *args: str, timeout: float = 60, stdin: IO | None = None) -> subprocess.CompletedProcess:
        """``docker ARGS``, output captured; a DockerError when the client does not answer within ``timeout``."""
        try:
            return subprocess.run(
                [self.path, *args], capture_output=True, text=True, timeout=timeout, env=self.env(), stdin=stdin
            )
        except subprocess.TimeoutExpired:
            raise DockerError(
                f"`docker {' '.join(args[:2])}` gave no answer within {timeout:.0f} s", "check that the daemon is healthy"
            ) from None

    def check(self, *args: str, timeout: float = 60, fix: str = "check the daemon log") -> str:
        """``docker ARGS``'s stdout, or a DockerError with docker's own reason."""
        proc = self.run(*args, timeout=timeout)
        if proc.returncode != 0:
            raise DockerError(f"docker {' '.join(args[:2])} failed ({last_line(proc.stderr, default='no reason given')})", fix)
        return proc.stdout

    @contextmanager
    def stream(self, argv: list[str], binary: bool = False) -> Iterator[subprocess.Popen]:
        """Start ``docker ARGV`` with stdout+stderr merged into text lines (``binary``: stdout as bytes, stderr
        apart); the child never outlives the block.

        The child stays in gpurig's process group (a terminal's Ctrl-C or
        ``timeout`` reaches both); when the block ends early for any reason it
        is asked to stop (SIGTERM, which cancels a BuildKit build), and killed
        after STOP_GRACE_S.
        """
        proc: subprocess.Popen
        if binary:  # stdout is data (a tar): docker's complaints stay apart, on stderr
            proc = subprocess.Popen([self.path, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env())
        else:
            proc = subprocess.Popen(
                [self.path, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                env=self.env(),
            )
        try:
            yield proc
        finally:
            stop(proc, STOP_GRACE_S)

    # --- images -----------------------------------------------------------------

    def inspect_image(self, ref: str) -> dict | None:
        """``docker image inspect`` of one image, or None when the local store does not hold it."""
        proc = self.run("image", "inspect", ref)
        if proc.returncode != 0:
            return None
        found = json.loads(proc.stdout or "[]")
        return found[0] if found else None

    def inspect_images(self, ids: list[str]) -> list[dict]:
        if not ids:
            return []
        return json.loads(self.check("image", "inspect", *ids) or "[]")

    def image_ids(self, *filters: str) -> list[str]:
        """Full ids of the local images that pass every ``--filter`` (each once, in docker's order)."""
        argv = ["image", "ls", "--no-trunc", "--format", "{{.ID}}"]
        for item in filters:
            argv += ["--filter", item]
        out = self.check(*argv, fix="check that the daemon answers")
        return list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))

    def tag(self, source: str, target: str) -> None:
        self.check("tag", source, target)

    def pull(self, ref: str, timeout: float) -> str:
        """Pull ``ref``; '' on success, else the registry's reason in one line."""
        try:
            proc = self.run("pull", "--quiet", ref, timeout=timeout)
        except DockerError:
            return f"no answer from the registry within {timeout:.0f} s"
        if proc.returncode == 0:
            return ""
        return last_line(proc.stderr, proc.stdout, default=f"docker pull exited {proc.returncode}")

    def push(self, ref: str, timeout: float = 3600) -> str:
        """Push one ref; the digest the registry gave its manifest ('' when docker did not say)."""
        proc = self.run("push", ref, timeout=timeout)
        if proc.returncode != 0:
            raise DockerError(
                f"push of {ref} failed ({last_line(proc.stderr, default='exit ' + str(proc.returncode))})",
                "check the registry address in the spec, that it answers, and `docker login` to it",
            )
        found = _PUSHED.search(proc.stdout)
        return found.group(1) if found else ""

    def layer_sizes(self, *refs: str) -> dict[str, int]:
        """Each layer of these images (by diff id) and its size: the uncompressed tar a host stores.

        Read from `docker save` streamed (nothing is written to disk), as the
        engine reports no size per layer; images that share a layer list it once.
        """
        sizes: dict[str, int] = {}
        links: dict[str, str] = {}
        manifest: list[dict] = []
        configs: dict[str, dict] = {}
        with self.stream(["save", *refs], binary=True) as proc:
            try:
                tar = tarfile.open(fileobj=proc.stdout, mode="r|")
            except tarfile.ReadError:
                raise DockerError(f"docker save {' '.join(refs)} failed ({last_line(_said(proc))})",
                                  "check that the images exist") from None
            with tar:
                for member in tar:
                    if member.name.endswith("/layer.tar"):
                        if member.issym():  # the same layer, saved once already
                            links[member.name] = os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname))
                        else:
                            sizes[member.name] = member.size
                    elif member.name == "manifest.json" or (member.name.endswith(".json") and "/" not in member.name):
                        data = json.load(tar.extractfile(member) or io.BytesIO(b"null"))  # a regular member: never None
                        if member.name == "manifest.json":
                            manifest = data
                        else:
                            configs[member.name] = data
            if proc.wait() != 0:
                raise DockerError(f"docker save {' '.join(refs)} failed ({last_line(_said(proc))})",
                                  "check that the images exist")
        by_diff_id = {}
        for image in manifest:
            for path, diff_id in zip(image["Layers"], configs[image["Config"]]["rootfs"]["diff_ids"]):
                by_diff_id[diff_id] = sizes[links.get(path, path)]
        return by_diff_id

    # --- containers ---------------------------------------------------------------

    def run_once(self, image: str, command: list[str], labels: dict[str, str], entrypoint: str = "",
                 user: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
        """``docker run --rm`` with no network: one command in an image, labelled so that it can be found."""
        argv = ["run", "--rm", "--network", "none"]
        if user:
            argv += ["--user", user]
        if entrypoint:
            argv += ["--entrypoint", entrypoint]
        for key, value in labels.items():
            argv += ["--label", f"{key}={value}"]
        return self.run(*argv, image, *command, timeout=timeout)



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
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
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


def _said(proc: subprocess.Popen) -> str:
    """What a binary-mode docker child wrote on stderr (its reason when it failed)."""
    return proc.stderr.read().decode(errors="replace") if proc.stderr else ""
