"""jupyter: healthy without sleeps, the token is required, retrievable, and never in inspect or logs."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from conftest import docker, host_port, wait_for


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.headers.get("Location", "")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Location", "")


@pytest.fixture(scope="module")
def jupyter(build, containers):
    cid = containers(build("jupyter").ref, ports=(8888,))
    health = lambda: json.loads(docker("inspect", cid).stdout)[0]["State"]["Health"]["Status"]  # noqa: E731
    wait_for("jupyter container healthy", lambda: health() == "healthy" or (health() == "unhealthy" and 1 / 0), 180)
    return cid, f"http://127.0.0.1:{host_port(cid, 8888)}"


def test_reaches_healthy(jupyter):
    cid, _ = jupyter
    assert json.loads(docker("inspect", cid).stdout)[0]["State"]["Health"]["Status"] == "healthy"


def test_request_without_token_is_refused(jupyter):
    _, url = jupyter
    status, _ = get(f"{url}/api/contents")
    assert status == 403
    status, location = get(f"{url}/lab")
    assert status in (302, 403) and (status == 403 or "login" in location)


def test_token_is_retrievable_and_works(jupyter):
    cid, url = jupyter
    token = docker("exec", cid, "gpurig-entrypoint", "token").stdout.strip()
    assert len(token) >= 32
    assert get(f"{url}/api/contents?token={token}")[0] == 200
    assert get(f"{url}/lab?token={token}")[0] == 200


def test_token_is_not_in_inspect_or_logs(jupyter):
    cid, _ = jupyter
    token = docker("exec", cid, "gpurig-entrypoint", "token").stdout.strip()
    inspected = json.loads(docker("inspect", cid).stdout)[0]
    assert not any(token in item for item in inspected["Config"]["Env"])
    assert token not in json.dumps(inspected)
    logs = docker("logs", cid)
    assert token not in logs.stdout + logs.stderr
