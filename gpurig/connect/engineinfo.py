"""What a Docker engine reports, typed: its info, an image, a container, a command that ended, the layers of a save;
and the rules read from them.

Pure: built from the engine API's JSON (``container_info``) or the tar of a
save (``saved_layers``), tested from recorded answers. The rules every caller shares live here, once: whether an
engine has NVIDIA's runtime (``has_nvidia_runtime``) and which GPUs a
container's DeviceRequests give it (``gpu_device_ids``).
"""

from __future__ import annotations

import io
import json
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone

NVIDIA_RUNTIME = "nvidia"


def has_nvidia_runtime(runtimes: Iterable[str]) -> bool:
    """The one rule for "Docker knows NVIDIA's runtime": its name among the runtimes (engine info or daemon.json)."""
    return NVIDIA_RUNTIME in runtimes


@dataclass(frozen=True)
class EngineInfo:
    server_version: str
    api_version: str
    runtimes: tuple[str, ...]
    default_runtime: str
    root_dir: str
    cpus: int
    memory: int

    @property
    def nvidia_runtime(self) -> bool:
        return has_nvidia_runtime(self.runtimes)


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: dict
    size: int
    digests: tuple[str, ...] = ()  # repository@sha256:... of the registries it was pushed to or pulled from
    user: str = ""  # the image's USER ("1000", "gpurig:gpurig", "" for root)
    created: str = ""  # when it was built, as the engine says it (RFC 3339)
    layers: tuple[str, ...] = ()  # its layers' diff ids (sha256 of each uncompressed layer tar), lowest first


@dataclass(frozen=True)
class Exited:
    """A command run in a container (an exec, or a throwaway container's own) that ended: its code and output."""

    code: int
    stdout: str
    stderr: str


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

    @property
    def env(self) -> dict[str, str]:
        """The container's environment (its image's and its own), as it was created."""
        return dict(e.split("=", 1) for e in (self.raw.get("Config") or {}).get("Env") or [] if "=" in e)


def image_info(data: dict) -> ImageInfo:
    return ImageInfo(
        id=data["Id"],
        tags=tuple(data.get("RepoTags") or ()),
        labels=dict((data.get("Config") or {}).get("Labels") or {}),
        size=int(data.get("Size") or 0),
        digests=tuple(data.get("RepoDigests") or ()),
        user=str((data.get("Config") or {}).get("User") or ""),
        created=str(data.get("Created") or ""),
        layers=tuple((data.get("RootFS") or {}).get("Layers") or ()),
    )


def engine_info(info: dict, version: dict) -> EngineInfo:
    return EngineInfo(
        server_version=str(version.get("Version", "")),
        api_version=str(version.get("ApiVersion", "")),
        runtimes=tuple(sorted((info.get("Runtimes") or {}).keys())),
        default_runtime=str(info.get("DefaultRuntime") or "runc"),
        root_dir=str(info.get("DockerRootDir") or "/var/lib/docker"),
        cpus=int(info.get("NCPU") or 0),
        memory=int(info.get("MemTotal") or 0),
    )


def gpu_device_ids(host_config: dict) -> tuple[str, ...] | None:
    """The GPUs a container's DeviceRequests (``--gpus``) give it: None when it asks for none, ("all",) for every GPU.

    A count without ids is the first ``count`` GPUs, as dockerd hands them to the toolkit ("0", "1", ...).
    """
    devices: tuple[str, ...] | None = None
    for req in host_config.get("DeviceRequests") or ():
        if ["gpu"] in (req.get("Capabilities") or []) or req.get("Driver") == "nvidia":
            ids = tuple(str(i) for i in req.get("DeviceIDs") or ())
            devices = ids if ids else ("all",) if req.get("Count") == -1 else tuple(str(i) for i in range(int(req.get("Count") or 0)))
    return devices


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
        device_ids=gpu_device_ids(host_config),
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


def name_and_tag(ref: str) -> tuple[str, str]:
    """('registry:5000/repo', 'tag') of a name:tag, ('repo', 'sha256:...') of a name@digest; a bare name is its latest."""
    # docker-py's parse_repository_tag, written here: importing docker.utils loads all of docker-py and requests
    # (~170 modules, 70 ms), and every command that reads facts imports this module
    name, at, digest = ref.partition("@")
    if at:
        return name, digest
    name, colon, tag = ref.rpartition(":")
    if not colon or "/" in tag:  # no tag, or the colon was a registry's port
        return ref, "latest"
    return name, tag or "latest"


def saved_layers(chunks: Iterator[bytes]) -> tuple[dict[str, int], list[dict]]:
    """(each layer's size by the path the manifest names it with, the manifest) of a ``docker save`` tar as it streams.

    Both of ``docker save``'s layouts: the legacy one (``<id>/layer.tar``, a
    layer saved once already a link to it) and the OCI one (``blobs/sha256/<digest>``).
    """
    import tarfile  # here: every facts run imports this module, and only delivery reads a saved image

    sizes: dict[str, int] = {}
    links: dict[str, str] = {}
    manifest: list[dict] = []
    with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as tar:
        for member in tar:
            if member.issym():
                links[member.name] = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
            elif member.isfile():
                sizes[member.name] = member.size
                if member.name == "manifest.json":
                    manifest = json.load(tar.extractfile(member) or io.BytesIO(b"[]"))  # a regular member: never None
    return {**sizes, **{name: sizes[target] for name, target in links.items() if target in sizes}}, manifest


class _ChunkReader(io.RawIOBase):
    """The file a tar reader wants over an iterator of byte chunks (a ``save`` as it streams)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            self._left = next(self._chunks, b"")
            if not self._left:
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size
