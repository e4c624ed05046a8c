"""Whether a newer base image exists: the registry's digest for the tag, or for a bootstrapped base its mirror's date.

A pulled base is compared by digest: the registry is asked for the tag's
manifest digest (a HEAD request, Docker Hub's anonymous token where it asks
for one) and that is set against the digests the local image was pulled as.
A base bootstrapped here has no registry; the mirror's Release file carries
the date of its last change, and a base made before that date lacks it.
"""

from __future__ import annotations

import email.utils
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from gpurig.image.baseimage import BaseImage
from gpurig.image.spec import Bootstrap

MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
DOCKER_HUB = "registry-1.docker.io"
_BEARER = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class BaseState:
    ref: str
    state: str  # current | newer | absent | unknown
    detail: str  # what a person reads


def split_ref(ref: str) -> tuple[str, str, str]:
    """(registry, repository, tag) of a reference: 'debian:bookworm' is Docker Hub's library/debian."""
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return DOCKER_HUB, name if rest else f"library/{name}", tag


def _plain_http(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0]
    return host in ("localhost", "127.0.0.1", "::1")


def registry_digest(ref: str, opener: Callable = urllib.request.urlopen, context: ssl.SSLContext | None = None) -> str:
    """The digest the registry serves for ``ref``'s tag now (OSError or ValueError when it cannot tell)."""
    registry, repo, tag = split_ref(ref)
    scheme = "http" if _plain_http(registry) else "https"
    url = f"{scheme}://{registry}/v2/{repo}/manifests/{urllib.parse.quote(tag)}"
    headers = {"Accept": MANIFEST_TYPES}
    try:
        return _head_digest(opener, url, headers, context)
    except urllib.error.HTTPError as e:
        challenge = e.headers.get("WWW-Authenticate", "") if e.code == 401 else ""
        if not challenge.lower().startswith("bearer "):
            raise OSError(f"{registry} answered {e.code} for {repo}:{tag}") from None
    headers["Authorization"] = f"Bearer {_anonymous_token(opener, challenge, context)}"
    try:
        return _head_digest(opener, url, headers, context)
    except urllib.error.HTTPError as e:
        raise OSError(f"{registry} answered {e.code} for {repo}:{tag}") from None


def _head_digest(opener: Callable, url: str, headers: dict, context) -> str:
    with opener(urllib.request.Request(url, headers=headers, method="HEAD"), timeout=15, context=context) as reply:
        digest = reply.headers.get("Docker-Content-Digest", "")
    if not digest.startswith("sha256:"):
        raise ValueError(f"{url} gave no Docker-Content-Digest")
    return digest


def _anonymous_token(opener: Callable, challenge: str, context) -> str:
    fields = dict(_BEARER.findall(challenge))
    realm = fields.pop("realm", "")
    if not realm.startswith("https://"):
        raise ValueError(f"the registry's token service is not https ({realm or 'none named'})")
    with opener(f"{realm}?{urllib.parse.urlencode(fields)}", timeout=15, context=context) as reply:
        data = json.loads(reply.read())
    return str(data.get("token") or data.get("access_token") or "")


def mirror_date(bootstrap: Bootstrap, opener: Callable = urllib.request.urlopen, context: ssl.SSLContext | None = None) -> datetime:
    """The Date of the suite's Release file on the mirror: when the mirror's packages last changed."""
    url = f"{bootstrap.mirror.rstrip('/')}/dists/{bootstrap.suite}/Release"
    with opener(url, timeout=15, context=context) as reply:
        head = reply.read(8192).decode("utf-8", "replace")
    found = re.search(r"^Date: (.+)$", head, re.MULTILINE)
    if not found:
        raise ValueError(f"{url} has no Date field")
    return email.utils.parsedate_to_datetime(found.group(1).strip())


def base_state(ref: str, found: BaseImage | None, created: str, bootstrap: Bootstrap | None,
               digest_of: Callable[[str], str] = registry_digest, mirror_of: Callable[[Bootstrap], datetime] = mirror_date) -> BaseState:
    """How the local base under ``ref`` (``created``: its creation time, ISO 8601) stands against its source."""
    if found is None:
        return BaseState(ref, "absent", "not in the local store: the next build takes the current one")
    try:
        if found.stand_in:
            if bootstrap is None:
                return BaseState(ref, "unknown", "bootstrapped here, and the spec no longer says from which mirror")
            made, changed = _utc(created), mirror_of(bootstrap)
            age = f"bootstrapped {(datetime.now(timezone.utc) - made).days} days ago"
            if changed > made:
                return BaseState(ref, "newer", f"{age}; {bootstrap.mirror} changed {changed:%Y-%m-%d} (rebuild after `docker rmi {ref}`)")
            return BaseState(ref, "current", f"{age}; {bootstrap.mirror} unchanged since")
        if not found.digests:
            return BaseState(ref, "unknown", "a local image with no registry digest (loaded or built here): nothing to compare")
        remote = digest_of(ref)
    except (OSError, ValueError) as e:
        return BaseState(ref, "unknown", f"could not ask: {e}")
    if any(d.endswith("@" + remote) for d in found.digests):
        return BaseState(ref, "current", f"the registry still serves {remote[:19]}")
    return BaseState(ref, "newer", f"the registry serves {remote[:19]}, here {found.digests[0].rsplit('@', 1)[-1][:19]} (`docker pull {ref}`)")


def _utc(created: str) -> datetime:
    stamp = datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", created.replace("Z", "+00:00")))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
