"""Stage images in the local registry, so that an interrupted pull keeps the layers it completed.

dockerd (20.10 as 27) drops every layer of a pull that did not finish, even
the ones already unpacked. So instead of one pull of an image of n layers,
the host pulls a few *stages*: images made of the first k layers (a prefix
of the real image's layers, with a config naming just those), each bigger
than the one before, then the real image. A completed stage keeps its
layers on the host under a temporary name; after an interruption the next
delivery finds them ("Already exists") and moves only what follows. The
stages are written straight into the local registry over its HTTP API: a
small config blob and a manifest each, no layer is copied.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from gpurig.errors import counted

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
ACCEPT = f"{MANIFEST_V2}, application/vnd.oci.image.manifest.v1+json"
STAGE_PREFIX = "gpurig-stage-"
MIN_STAGE_BYTES = 32 * 1024 * 1024
MAX_STAGES = 6


class StageError(Exception):
    """The local registry did not answer as expected (the caller moves the image in one pull instead)."""


@dataclass(frozen=True)
class Layer:
    short_id: str  # the 12 hex digits a pull's progress names the layer by
    size: int  # compressed bytes in the registry


@dataclass(frozen=True)
class Staged:
    stages: tuple[str, ...]  # tags of the stage images, smallest first (the real tag is not among them)
    layers: tuple[Layer, ...]

    @property
    def sizes(self) -> dict[str, int]:
        return {layer.short_id: layer.size for layer in self.layers}


class RegistryAPI:
    """The few calls of the registry HTTP API (v2) staging needs, on a registry without auth."""

    def __init__(self, address: str) -> None:
        self.base = f"http://{address}/v2"

    def manifest(self, path: str, tag: str) -> dict:
        return json.loads(self._call("GET", f"/{path}/manifests/{tag}", headers={"Accept": ACCEPT}))

    def blob(self, path: str, digest: str) -> bytes:
        return self._call("GET", f"/{path}/blobs/{digest}")

    def put_blob(self, path: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        try:
            self._call("HEAD", f"/{path}/blobs/{digest}")
            return digest
        except StageError:
            pass
        location = self._call("POST", f"/{path}/blobs/uploads/", want="location")
        sep = "&" if "?" in location else "?"
        url = location if location.startswith("http") else f"{self.base.rsplit('/v2', 1)[0]}{location}"
        self._call("PUT", f"{url}{sep}digest={digest}", data=data, headers={"Content-Type": "application/octet-stream"}, absolute=True)
        return digest

    def put_manifest(self, path: str, tag: str, manifest: dict) -> None:
        body = json.dumps(manifest, separators=(",", ":")).encode()
        self._call("PUT", f"/{path}/manifests/{tag}", data=body, headers={"Content-Type": manifest["mediaType"]})

    def _call(self, method: str, url: str, *, data: bytes | None = None, headers: dict | None = None,
              want: str = "body", absolute: bool = False):
        request = urllib.request.Request(url if absolute else self.base + url, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.headers.get("Location", "") if want == "location" else answer.read()
        except (urllib.error.URLError, OSError) as err:
            raise StageError(f"{method} {url}: {err}") from None


def stage_image(address: str, path: str, tag: str, min_bytes: int = MIN_STAGE_BYTES, max_stages: int = MAX_STAGES) -> Staged:
    """Write the stage images of ``path:tag`` (already pushed to the registry at ``address``); their tags, in pull order."""
    api = RegistryAPI(address)
    manifest = api.manifest(path, tag)
    if manifest.get("mediaType") != MANIFEST_V2 or "layers" not in manifest:
        raise StageError(f"{path}:{tag}: not a Docker v2 manifest")
    layers = tuple(Layer(entry["digest"].split(":", 1)[1][:12], int(entry.get("size") or 0)) for entry in manifest["layers"])
    config = json.loads(api.blob(path, manifest["config"]["digest"]))
    diff_ids = config["rootfs"]["diff_ids"]
    if len(diff_ids) != len(layers):
        raise StageError(f"{path}:{tag}: its config names {counted(len(diff_ids), 'layer')}, its manifest {len(layers)}")
    cuts = stage_cuts([layer.size for layer in layers], min_bytes, max_stages)
    stages = []
    for cut in cuts:
        part = {"architecture": config.get("architecture", "amd64"), "os": config.get("os", "linux"),
                "config": {}, "rootfs": {"type": "layers", "diff_ids": diff_ids[:cut]}}
        body = json.dumps(part, separators=(",", ":"), sort_keys=True).encode()
        digest = api.put_blob(path, body)
        stage_tag = f"{STAGE_PREFIX}{cut}-{digest.split(':', 1)[1][:12]}"
        api.put_manifest(path, stage_tag, {
            "schemaVersion": 2, "mediaType": MANIFEST_V2,
            "config": {"mediaType": CONFIG_V1, "size": len(body), "digest": digest},
            "layers": manifest["layers"][:cut],
        })
        stages.append(stage_tag)
    return Staged(tuple(stages), layers)


def stage_cuts(sizes: list[int], min_bytes: int = MIN_STAGE_BYTES, max_stages: int = MAX_STAGES) -> list[int]:
    """Where to cut the layer list into stages: after at least max(min_bytes, total/(max_stages+1)) bytes each, never at the end."""
    total = sum(sizes)
    step = max(min_bytes, total // (max_stages + 1))
    cuts, run = [], 0
    for index, size in enumerate(sizes[:-1], start=1):
        run += size
        if run >= step:
            cuts.append(index)
            run = 0
    return cuts[:max_stages]
