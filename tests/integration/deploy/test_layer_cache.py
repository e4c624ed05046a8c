"""checks/layer_cache.py, the host side of fleet delivery, for real: Debian's docker-registry upstream, caches chained on
loopback as hosts would chain them through SSH forwards, and this machine's dockerd pulling through them.

What a host a level down sees: the image's blobs fetched from upstream once by the cache above it however many pull
through it, streamed on while they arrive, kept only with their digest checked; nothing listening once a cache stops.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import io
import json
import shutil
import subprocess
import sys
import tarfile
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from gpurig.deploy.registry import LocalRegistry

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not shutil.which("docker-registry"), reason="docker-registry is not installed")]

CACHE = Path(__file__).resolve().parents[3] / "checks" / "layer_cache.py"
DOCKER = shutil.which("docker") or "/usr/bin/docker"


def docker(*args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([DOCKER, *args], capture_output=True, input=input, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])}: {proc.stderr.decode()[-500:]}")
    return proc


class Cache:
    """One layer cache process; ``stop`` ends it and returns its closing counts."""

    def __init__(self, upstream: str, store: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CACHE), "--upstream", upstream, "--store", str(store)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = json.loads(self.proc.stdout.readline())
        assert first["event"] == "listening"
        self.port = first["port"]
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> dict:
        self.proc.stdin.close()  # as when the SSH channel that started it goes away
        out = self.proc.stdout.read()  # to the end: the cache closes its stdout when it exits
        assert self.proc.wait(timeout=30) == 0
        return json.loads(out.strip().splitlines()[-1])


def answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def image():
    """A two-layer image of a few MB (random bytes, so no engine or registry holds its layers already), in this machine's engine."""
    name = f"gpurig-test-cache-{uuid.uuid4().hex[:8]}"
    layers = []
    for i in range(2):
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            payload = uuid.uuid4().bytes * (1 << 16)  # 1 MiB, unique to this test
            info = tarfile.TarInfo(f"layer{i}.bin")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        layers.append(data.getvalue())
    docker("import", "-", f"{name}:base", input=layers[0])
    build = f"FROM {name}:base\nCOPY layer1.tar /\n"
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for member, content in (("Dockerfile", build.encode()), ("layer1.tar", layers[1])):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    docker("build", "-q", "-t", f"{name}:1", "-", input=context.getvalue())
    made = [f"{name}:base", f"{name}:1"]
    yield name, made
    docker("image", "rm", "-f", *made, check=False)


def fetch_image(address: str, name: str, tag: str) -> dict[str, int]:
    """What a second host's engine asks a cache for, as an HTTP client: the manifest, then every blob; each blob's size,
    its bytes checked against its digest."""
    request = urllib.request.Request(f"http://{address}/v2/{name}/manifests/{tag}",
                                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        manifest = json.loads(answer.read())
    got = {}
    for blob in [manifest["config"], *manifest["layers"]]:
        with urllib.request.urlopen(f"http://{address}/v2/{name}/blobs/{blob['digest']}", timeout=60) as answer:
            data = answer.read()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == blob["digest"]
        got[blob["digest"]] = len(data)
    return got


def test_chained_caches_fetch_each_blob_once_and_an_engine_pulls_the_same_image_through_them(tmp_path, image):
    name, made = image
    with LocalRegistry(tmp_path / "registry") as registry:
        pushed = f"{registry.address}/{name}:1"
        docker("tag", f"{name}:1", pushed)
        docker("push", pushed)
        want = docker("image", "inspect", "--format", "{{.Id}}", f"{name}:1").stdout.decode().strip()
        docker("image", "rm", "-f", pushed, *made)  # this engine now lacks the layers, as a fresh host does

        top = Cache(f"http://{registry.address}", tmp_path / "top")  # the host the build machine's forward reaches
        below = [Cache(f"http://{top.address}", tmp_path / f"below{i}") for i in range(3)]  # hosts that pull from it
        try:
            ref = f"{below[0].address}/{name}:1"
            made.append(ref)
            other: dict[str, dict[str, int]] = {}
            second = threading.Thread(target=lambda: other.update(got=fetch_image(below[1].address, name, "1")))
            second.start()  # another host pulling at the same time through another cache below the same top
            docker("pull", ref)
            second.join()
            assert docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.decode().strip() == want
            late = fetch_image(below[2].address, name, "1")  # a host that comes later: the top has it all
        finally:
            counts = [c.stop() for c in below]
            top_counts = top.stop()
        kept = {f"sha256:{p.name}": p.stat().st_size for p in (tmp_path / "top" / "blobs").iterdir()}
        assert other["got"] == late == kept and len(kept) == 3  # two layers and the image config
        assert top_counts["blobs"] == 3 and top_counts["fetched"] == sum(kept.values())  # from upstream: each blob once
        assert top_counts["served"] >= 3 * sum(kept.values())  # to each cache below
        assert [c["fetched"] for c in counts] == [sum(kept.values())] * 3
        assert not any(answers(c.address) for c in (top, *below))  # stopped: nothing listens
        assert not any((tmp_path / d / "partial").exists() for d in ("top", "below0", "below1", "below2"))


def test_a_blob_upstream_lacks_is_404_and_nothing_can_be_pushed(tmp_path):
    with LocalRegistry(tmp_path / "registry") as upstream:
        cache = Cache(f"http://{upstream.address}", tmp_path / "store")
        try:
            missing = "sha256:" + "0" * 64
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://{cache.address}/v2/some/image/blobs/{missing}", timeout=30)
            assert err.value.code == 404  # as the registry said: the engine reports the image as not found
            request = urllib.request.Request(f"http://{cache.address}/v2/some/image/blobs/uploads/", method="POST", data=b"x")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 405  # read-only: nothing can be pushed into a host's cache
        finally:
            counts = cache.stop()
        assert counts["blobs"] == 0 and not list((tmp_path / "store" / "blobs").iterdir())


class LyingUpstream(http.server.BaseHTTPRequestHandler):
    """An upstream that sends other bytes than the digest asked for (a corrupted or hostile serving host)."""

    BODY = b"not the layer you asked for" * 1000

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    def log_message(self, *args) -> None:
        pass


def whole_body(url: str) -> bytes:
    """The body at ``url`` if it came whole; b"" when the answer was an error (502: the fetch failed before the answer
    began) or a short body (it failed while streaming): what a pulling engine sees as a failed download either way."""
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.read()
    except urllib.error.HTTPError as err:
        assert err.code == 502
    except http.client.IncompleteRead as short:
        assert len(short.partial) < len(LyingUpstream.BODY)
    return b""


def test_a_blob_whose_bytes_do_not_match_its_digest_is_never_kept_or_served_again(tmp_path):
    liar = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LyingUpstream)
    serving = threading.Thread(target=liar.serve_forever, daemon=True)
    serving.start()
    cache = Cache(f"http://127.0.0.1:{liar.server_address[1]}", tmp_path / "store")
    try:
        digest = "sha256:" + hashlib.sha256(b"the real layer").hexdigest()
        for _ in range(2):  # the second ask fetches again: nothing of the first was kept
            assert not whole_body(f"http://{cache.address}/v2/some/image/blobs/{digest}")
    finally:
        counts = cache.stop()
        liar.shutdown()
        liar.server_close()
    assert counts["blobs"] == 0 and not list((tmp_path / "store" / "blobs").iterdir())
    assert counts["fetched"] == 2 * len(LyingUpstream.BODY)
