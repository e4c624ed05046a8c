"""Fresh hosts that boot systemd (Debian 12 and 13) for the provision tests; the pieces live in tests/integration/systemd_kit.py.

The provision tests install Docker on these hosts for real, so each runs
systemd (``systemctl enable --now docker``) and an inner dockerd. The host
images come from the session's ``systemd_images`` (tests/integration/conftest.py),
both started at once on first use; every test gets a fresh container,
removed afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from systemd_kit import SUITES, SystemdHosts, authorized_keys, inventory_for  # noqa: F401 - inventory_for: for the tests


@pytest.fixture
def systemd_hosts(docker_engine, container_kit, systemd_images, host_key, tmp_path):
    """A SystemdHosts maker; every container it made is removed afterwards."""
    systemd_images.prebuild(*SUITES)  # both OS images at once, the first time
    keys = authorized_keys(tmp_path / "authorized_keys", container_kit.login, host_key)
    hosts = SystemdHosts(docker_engine, container_kit, systemd_images, keys, host_key)
    try:
        yield hosts
    finally:
        hosts.remove()


@pytest.fixture
def provision_cli(tmp_path):
    """provision(inventory, *flags, wait=True) -> CompletedProcess (or the Popen when wait=False): the CLI as users run it."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200", "PYTHONPATH": str(repo)}
    env.pop("SSH_AUTH_SOCK", None)

    def provision(inventory: Path, *flags: str, wait: bool = True):
        argv = [sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)",
                "provision", "--inventory", str(inventory), *flags]
        if not wait:
            return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    return provision
