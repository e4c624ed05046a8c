"""The build machine's registry process: Debian's docker-registry with gpurig's config, on loopback, started and stopped cleanly."""

from __future__ import annotations

import shutil
import urllib.request

import pytest

from gpurig.deploy.registry import LocalRegistry, RegistryError, shared_registry

pytestmark = pytest.mark.integration


def answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as reply:
            return reply.status == 200  # no auth asked: the packaged config's htpasswd is not used
    except OSError:
        return False


@pytest.mark.skipif(not shutil.which("docker-registry"), reason="docker-registry is not installed")
def test_the_registry_answers_on_loopback_keeps_its_port_and_leaves_nothing_running(tmp_path):
    with LocalRegistry(tmp_path) as first:
        address = first.address
        assert address.startswith("127.0.0.1:") and answers(address)
    assert not answers(address)
    with shared_registry(tmp_path) as again, shared_registry(tmp_path) as same:
        assert again is same and again.address == address  # one per process; the port of last time
    assert not answers(address)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "port"]  # no config or log left behind


def test_no_registry_binary_is_one_error_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RegistryError) as err:
        LocalRegistry(tmp_path).start()
    assert "docker-registry" in err.value.problem and "apt" not in err.value.fix and "package" in err.value.fix
