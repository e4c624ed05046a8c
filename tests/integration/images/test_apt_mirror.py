"""build.apt_mirror: apt inside the build fetches from the mirror named in the spec (a recording proxy here).

The mirror's URL carries shell syntax in its path, valid in a URL: it must
reach apt as data. (It was once spliced into a sed program, where a `#e`
suffix ran a command at build time.)
"""

from __future__ import annotations

import ipaddress
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import SESSION, SPEC_NAME, TEST_LABEL, docker, run_in, write_spec

UPSTREAM = "http://deb.debian.org"
# Would create /pwned in the image if the mirror reached a shell or a sed program as code.
HOSTILE_PATH = "/x$(touch$IFS/pwned)&;/debian"


class Mirror(BaseHTTPRequestHandler):
    """Serves /debian/... by fetching it from Debian's archive, and records each path asked for."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        path = self.path[self.path.find("/debian/"):] if "/debian/" in self.path else self.path
        request = urllib.request.Request(UPSTREAM + path, headers={"User-Agent": "gpurig-test-mirror"})
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
    hostile = mirror.replace("/debian", HOSTILE_PATH)
    spec.write_text(spec.read_text().replace("build:\n", f"build:\n  apt_mirror: '{hostile}'\n"))
    proc = cli("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert any("/debian/dists/bookworm/" in path for path in Mirror.seen), Mirror.seen[:5]
    assert any(path.endswith(".deb") for path in Mirror.seen) or any("InRelease" in p for p in Mirror.seen)
    assert all(path.startswith("/x") for path in Mirror.seen), Mirror.seen[:5]
    image = f"{SPEC_NAME}:2.13.0-cpu-slim"
    probe = run_in(image, "-e", "/pwned", entrypoint="/usr/bin/test")
    assert probe.returncode == 1, probe.stderr  # 1: no such file (docker's own failures are 125-127)
