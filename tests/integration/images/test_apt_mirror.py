"""build.apt_mirror: apt inside the build fetches from the mirror named in the spec (a recording proxy here)."""

from __future__ import annotations

import ipaddress
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import SESSION, TEST_LABEL, docker, write_spec

UPSTREAM = "http://deb.debian.org"


class Mirror(BaseHTTPRequestHandler):
    """Serves /debian/... by fetching it from Debian's archive, and records each path asked for."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        request = urllib.request.Request(UPSTREAM + self.path, headers={"User-Agent": "gpurig-test-mirror"})
        try:
            with urllib.request.urlopen(request, timeout=60) as upstream:
                body = upstream.read()
                self.send_response(upstream.status)
                for header in ("Content-Type", "Last-Modified"):
                    if upstream.headers.get(header):
                        self.send_header(header, upstream.headers[header])
        except urllib.error.HTTPError as err:
            body = b""
            self.send_response(err.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(docker_client):
    config = json.loads(docker("network", "inspect", "bridge").stdout)[0]["IPAM"]["Config"][0]
    # docker0's address: reachable from build steps on the bridge and from the host's own namespace
    gateway = config.get("Gateway") or (str(ipaddress.ip_network(config["Subnet"])[1]) if config.get("Subnet") else "")
    if not gateway:
        pytest.skip("the bridge network has no gateway address for a build to reach the host")
    Mirror.seen = []
    server = ThreadingHTTPServer((gateway, 0), Mirror)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{gateway}:{server.server_address[1]}/debian"
    server.shutdown()
    server.server_close()


def test_apt_fetches_through_the_configured_mirror(cli, wheels, base, mirror):
    spec = write_spec(cli.project / "mirror.yaml", wheels)
    spec.write_text(spec.read_text().replace("build:\n", f"build:\n  apt_mirror: {mirror}\n"))
    proc = cli("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert any(path.startswith("/debian/dists/bookworm/") for path in Mirror.seen), Mirror.seen[:5]
    assert any(path.endswith(".deb") for path in Mirror.seen) or any("InRelease" in p for p in Mirror.seen)
