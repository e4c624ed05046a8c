"""`gpurig dashboard --check` against a fresh container host over real SSH and sudo: provision's check mode at start, its drift in
the host's fleet row, nothing changed on the host.

The host is the session's fresh Debian 12 (sshd, sudo, no Docker, no python3, no GPU): provision would install Docker and
python3, and skips every GPU step. The test reads the page's snapshot with the token from the 0600 URL
file; every wait is on the snapshot saying so, never a sleep. The dashboard is stopped with Ctrl-C, as a user stops it.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from tests.integration.dashboard.pagekit import run_dashboard, wait_for

pytestmark = pytest.mark.integration
ETC_SUM = "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"


def _snapshot(url: str) -> dict:
    base, _, token = url.partition("?token=")
    request = urllib.request.Request(base + "api/snapshot", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_the_fleet_row_shows_what_provision_would_change_and_the_host_is_left_as_it_was(container_host, host_inventory, tmp_path):
    (tmp_path / "gpurig.yaml").write_text("{}\n")
    host_inventory()
    before = container_host.sh(ETC_SUM).stdout
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("SSH_AUTH_SOCK", None)
    with run_dashboard(tmp_path, "--check", interval="1", env=env) as (_, url):  # stopped with Ctrl-C, its exit and log checked
        doc = wait_for("the drift read", lambda: (d := _snapshot(url))["fleet"]["drift"]["read_at"] and d, 180)
        row = doc["fleet"]["hosts"][0]
        drift = row["drift"]
        assert doc["fleet"]["drift"]["checked"] is True and drift["read_at"] == doc["fleet"]["drift"]["read_at"]
        assert drift["state"] == "drift", drift
        assert {"docker", "python3"} <= set(drift["would_change"])
        assert drift["text"] == f"{len(drift['would_change'])} steps would change: {', '.join(drift['would_change'])}"
        assert "gpus" not in drift["would_change"] and "slurm" not in row  # no GPU step, not a Slurm node
    assert container_host.sh(ETC_SUM).stdout == before  # check mode: nothing written on the host
    assert container_host.sh("command -v docker python3 || true").stdout == ""
