"""The build machine's registry process: Debian's docker-registry with gpurig's config, on loopback, started and stopped cleanly."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

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


@pytest.mark.skipif(not shutil.which("docker-registry"), reason="docker-registry is not installed")
def test_a_registry_whose_gpurig_was_killed_is_stopped_by_the_next_start(tmp_path):
    import subprocess
    import sys

    # a gpurig that starts the registry and dies by SIGKILL, never stopping it
    code = ("import os, sys; from pathlib import Path; from gpurig.deploy.registry import LocalRegistry; "
            "r = LocalRegistry(Path(sys.argv[1])); r.start(); print(r.address, r._proc.pid, flush=True); os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    address, pid = proc.stdout.split()
    assert answers(address)  # left running by its dead gpurig
    assert oct(tmp_path.stat().st_mode & 0o777) == "0o700"  # the cache is this user's alone
    configs = list(tmp_path.glob("config-*.yml"))
    assert configs and all(c.stat().st_mode & 0o777 == 0o600 for c in configs)
    with LocalRegistry(tmp_path) as fresh:
        assert fresh.address and _stopping(int(pid))


def _stopping(pid: int) -> bool:
    """The orphan got SIGTERM: it exits within a deadline (polled, not slept on)."""
    import time

    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return True
        if "State:\tZ" in state:
            return True
        time.sleep(0.05)  # polling the process table with a deadline
    return False
