"""A real Prometheus on a free loopback port, and the loopback sshd hosts of tests/integration/hosts, for the monitor.

The sshd fixtures are those of tests/integration/hosts/conftest.py, loaded
from that file (not copied). Every process started here is stopped at
teardown; readiness is polled through Prometheus's HTTP API, never slept for.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from hosts_fixtures import hosts_conftest as load_hosts_conftest

hosts_conftest = load_hosts_conftest()

# The sshd fixtures, shared by name.
client_key = hosts_conftest.client_key
login_user = hosts_conftest.login_user
farm = hosts_conftest.farm
free_port = hosts_conftest.free_port
SSHD = hosts_conftest.SSHD

PROMETHEUS = shutil.which("prometheus")


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)


class Prometheus:
    """One prometheus server scraping the given targets every second."""

    def __init__(self, base: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = base / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            "scrape_configs:\n  - job_name: gpurig\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = base / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={base / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def api(self, path: str, **params) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=5) as resp:
            return json.loads(resp.read())

    def poll(self, fetch, what: str, deadline_s: float = 30.0):
        """Call ``fetch`` until it returns something truthy; fail with the server's log after the deadline."""
        end = time.monotonic() + deadline_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                got = fetch()
            except OSError:
                got = None
            if got:
                return got
            if time.monotonic() > end:
                raise AssertionError(f"prometheus: {what} within {deadline_s:g}s; log: {self.log.read_text()[-1500:]}")
            time.sleep(0.1)  # polling interval while waiting for readiness, not a synchronisation sleep

    def wait_up(self) -> list[dict]:
        def up():
            targets = self.api("targets")["data"]["activeTargets"]
            return targets if targets and all(t["health"] == "up" for t in targets) else None

        return self.poll(up, "every target up")

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """start(targets) -> a running Prometheus scraping them; stopped at teardown."""
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (apt-get install prometheus; scripts/setup.sh does)")
    started: list[Prometheus] = []

    def start(targets: list[str]) -> Prometheus:
        base = tmp_path_factory.mktemp("prometheus")
        p = Prometheus(base, targets)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
