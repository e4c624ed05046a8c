"""This machine's engine: the one the docker CLI builds into, and the verbs the build uses on it (pull and push with the
user's registry logins, the pushed digest, import, layer sizes from a save), against a recorded engine on a unix socket."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socketserver
import tarfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import docker
import pytest

from gpurig.connect.engine import Engine, EngineError

# --- which engine: the CLI's choice -----------------------------------------------------------------
from gpurig.connect.engineopen import DEFAULT_SOCKET, local_endpoint

# --- which engine: the CLI's choice -----------------------------------------------------------------


@pytest.fixture
def docker_config(tmp_path, monkeypatch) -> Path:
    """An empty docker config folder (DOCKER_CONFIG), with a context named remote in it."""
    folder = tmp_path / "docker-config"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    meta = folder / "contexts" / "meta" / hashlib.sha256(b"remote").hexdigest()  # as `docker context create` writes it
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": "remote", "Metadata": {},
                                                "Endpoints": {"docker": {"Host": "tcp://10.0.0.7:2375", "SkipTLSVerify": False}}}))
    return folder


def test_the_local_engine_is_the_one_the_docker_cli_would_use(docker_config):
    assert local_endpoint({}) == (DEFAULT_SOCKET, None)
    assert local_endpoint({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"})[0] == "unix:///run/user/1000/docker.sock"
    (docker_config / "config.json").write_text(json.dumps({"currentContext": "remote"}))  # `docker context use remote`
    assert local_endpoint({})[0] == "tcp://10.0.0.7:2375"
    assert local_endpoint({"DOCKER_HOST": "unix:///h.sock"})[0] == "unix:///h.sock"  # DOCKER_HOST overrides the current context
    assert local_endpoint({"DOCKER_CONTEXT": "default"})[0] == DEFAULT_SOCKET
    assert local_endpoint({"DOCKER_CONTEXT": "default", "DOCKER_HOST": "unix:///h.sock"})[0] == "unix:///h.sock"
    # DOCKER_CONTEXT wins over DOCKER_HOST, as in the CLI
    assert local_endpoint({"DOCKER_CONTEXT": "remote", "DOCKER_HOST": "unix:///h.sock"})[0] == "tcp://10.0.0.7:2375"


def test_a_docker_context_that_does_not_exist_is_one_line_with_its_fix(docker_config):
    with pytest.raises(EngineError, match="the docker context gone does not exist") as err:
        local_endpoint({"DOCKER_CONTEXT": "gone"})
    assert "docker context ls" in err.value.fix


# --- the verbs, against a recorded engine --------------------------------------------------------------


class Recorded(BaseHTTPRequestHandler):
    """Answers each request from ``answers`` by (method, path suffix); keeps what came in ``seen``."""

    protocol_version = "HTTP/1.1"
    answers: dict[tuple[str, str], tuple[int, bytes]] = {}
    seen: list[dict] = []

    def _answer(self, method: str) -> None:
        url = urlsplit(self.path)
        body = b""
        if self.headers.get("Transfer-Encoding") == "chunked":
            while size := int(self.rfile.readline().strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        elif self.headers.get("Content-Length"):
            body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append({"method": method, "path": url.path, "query": parse_qs(url.query), "headers": dict(self.headers), "body": body})
        status, data = next((v for (m, suffix), v in self.answers.items() if m == method and url.path.endswith(suffix)), (404, b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")  # as dockerd streams: an event a chunk
        self.end_headers()
        for part in data.splitlines(keepends=True) if data.startswith(b"{") else [data]:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """(a docker-py client on a recorded engine's socket, its answers, what it saw); ~/.docker holds a login for reg.example:5000."""
    config = tmp_path / "logins"
    config.mkdir()
    auth = base64.b64encode(b"ana:secret").decode()
    (config / "config.json").write_text(json.dumps({"auths": {"reg.example:5000": {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    sock = str(tmp_path / "engine.sock")

    class Handler(Recorded):
        answers: dict = {}
        seen: list = []

    server = socketserver.ThreadingUnixStreamServer(sock, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = docker.APIClient(base_url=f"unix://{sock}", version="1.41", timeout=10)
    try:
        yield api, Handler.answers, Handler.seen
    finally:
        api.close()
        server.shutdown()
        server.server_close()


def lines(*events: dict) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\r\n" for e in events)


def test_a_push_gives_the_registrys_digest_and_sends_the_users_login_to_this_machines_engine_only(recorded):
    api, answers, seen = recorded
    digest = "sha256:" + "d" * 64
    answers[("POST", "/push")] = (200, lines({"status": "Pushing"}, {"status": "latest: digest: ..."},
                                             {"progressDetail": {}, "aux": {"Tag": "1", "Digest": digest, "Size": 529}}))
    assert Engine("build machine", api, local=True).push("reg.example:5000/team/pytorch:1", timeout=60) == digest
    login = json.loads(base64.urlsafe_b64decode(seen[-1]["headers"]["X-Registry-Auth"]))
    assert login["username"] == "ana" and login["password"] == "secret"
    assert seen[-1]["path"].endswith("/images/reg.example:5000/team/pytorch/push") and seen[-1]["query"]["tag"] == ["1"]
    Engine("gpu-01", api).push("reg.example:5000/team/pytorch:1")  # another host's engine: no credential of this user's
    assert "X-Registry-Auth" not in seen[-1]["headers"]


def test_a_pull_by_digest_asks_for_the_digest_with_the_users_login(recorded):
    api, answers, seen = recorded
    answers[("POST", "/images/create")] = (200, lines({"status": "Pulling from team/base"}, {"status": "Downloaded newer image"}))
    events: list[dict] = []
    ref = "reg.example:5000/team/base@sha256:" + "b" * 64
    Engine("build machine", api, local=True).pull(ref, events.append, timeout=60)
    assert seen[-1]["query"] == {"fromImage": ["reg.example:5000/team/base"], "tag": ["sha256:" + "b" * 64]}
    assert "X-Registry-Auth" in seen[-1]["headers"] and len(events) == 2


def test_a_refused_push_is_an_engine_error_with_the_registrys_words(recorded):
    api, answers, _ = recorded
    answers[("POST", "/push")] = (200, lines({"status": "Pushing"}, {"error": "denied: requested access to the resource is denied"}))
    with pytest.raises(EngineError) as err:
        Engine("build machine", api, local=True).push("reg.example:5000/team/pytorch:1")
    assert err.value.reason == "denied: requested access to the resource is denied"


def test_an_import_streams_the_tar_with_its_changes_and_gives_the_new_images_id(recorded):
    api, answers, seen = recorded
    answers[("POST", "/images/create")] = (200, lines({"status": "sha256:" + "c" * 64}))
    chunks = [b"x" * 1000, b"y" * 10]
    image_id = Engine("build machine", api, local=True).import_image(iter(chunks), "debian:bookworm-slim", ["LABEL a=b", 'CMD ["bash"]'], 60)
    assert image_id == "sha256:" + "c" * 64
    assert seen[-1]["body"] == b"".join(chunks)
    assert seen[-1]["query"]["fromSrc"] == ["-"] and seen[-1]["query"]["repo"] == ["debian"]
    assert seen[-1]["query"]["tag"] == ["bookworm-slim"] and seen[-1]["query"]["changes"] == ["LABEL a=b", 'CMD ["bash"]']


def _saved(layers: dict[str, int], manifest: list[dict], links: dict[str, str]) -> bytes:
    """A `docker save` tar (legacy layout): each layer.tar of its size, shared ones as links, then manifest.json."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, size in layers.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"\0" * size))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_layer_sizes_are_read_from_a_save_as_it_streams_and_a_shared_layer_counts_once(recorded):
    api, answers, seen = recorded
    slim, jupyter = "a" * 64, "b" * 64
    answers[("GET", "/images/get")] = (200, _saved({"l1/layer.tar": 1536, "l2/layer.tar": 2560, "l3/layer.tar": 512},
                                                   [{"Config": f"{slim}.json", "Layers": ["l1/layer.tar", "l2/layer.tar"]},
                                                    {"Config": f"{jupyter}.json", "Layers": ["l4/layer.tar", "l3/layer.tar"]}],
                                                   {"l4/layer.tar": "../l1/layer.tar"}))
    answers[("GET", f"/images/sha256:{slim}/json")] = (200, json.dumps({"Id": f"sha256:{slim}", "RootFS": {"Layers": ["d1", "d2"]}}).encode())
    answers[("GET", f"/images/sha256:{jupyter}/json")] = (200, json.dumps({"Id": f"sha256:{jupyter}", "RootFS": {"Layers": ["d1", "d3"]}}).encode())
    sizes = Engine("build machine", api, local=True).layer_sizes("pytorch:slim", "pytorch:jupyter")
    assert sizes == {"d1": 1536, "d2": 2560, "d3": 512}
    assert seen[0]["query"]["names"] == ["pytorch:slim", "pytorch:jupyter"]  # one save: a shared layer is in it once
