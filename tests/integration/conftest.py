"""Fixtures every integration test may use. Containers acting as fresh hosts: a Debian 12 image with sshd and sudo, one new container per test.

The image is built once per test session from the locally bootstrapped
Debian base (gpurig.image.baseimage: local, else pulled, else debootstrapped) with
Debian's own openssh-server and sudo; every container runs sshd as its main
process (no systemd: the steps tested here need none), publishes it on a
free port of 127.0.0.1 and authorizes the session's test key for user
``gpurig`` (key-only login, passwordless sudo), mounted read-only at run
time so no key lies in an image layer. Host keys are made at container
start, so each container is a different host. Everything made here carries
the label io.gpurig.test=<session> and is removed at teardown. Provision
and deploy tests use ``container_host`` and ``host_inventory``; tests that
use them skip, with the reason, where no Docker engine or no root is.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

TEST_LABEL = "io.gpurig.test"
SESSION = uuid.uuid4().hex[:12]
# The run this session is part of: under pytest-xdist every worker is a session of its own and they share the run's
# id (the README's test command); alone, the run is this session. What a whole run shares (the systemd hosts'
# images) carries RUN_LABEL and is removed by the run's controller at the end (tests/conftest.py).
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:12] or SESSION
RUN_LABEL = "io.gpurig.test.run"
BASE_REF = "debian:bookworm-slim"  # the container hosts' base: local if present, else pulled, else bootstrapped
MIRROR = "http://deb.debian.org/debian"
LOGIN = "gpurig"

DOCKERFILE = f"""\
FROM {BASE_REF}
# Debian's sshd and sudo, as a fresh server has them; host keys are made at start, not baked in.
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openssh-server sudo \\
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \\
 && mkdir -p /run/sshd \\
 && useradd -m -s /bin/sh -p '*' {LOGIN} \\
 && echo '{LOGIN} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{LOGIN} && chmod 0440 /etc/sudoers.d/{LOGIN} \\
 && printf '%s\\n' 'AuthorizedKeysFile /etc/ssh/authorized_keys/%u' 'PasswordAuthentication no' \\
      'KbdInteractiveAuthentication no' 'UsePAM no' > /etc/ssh/sshd_config.d/gpurig-test.conf
EXPOSE 22
CMD ["/bin/sh", "-c", "ssh-keygen -A -q && exec /usr/sbin/sshd -D -e"]
"""


@dataclass(frozen=True)
class Docker:
    path: str
    engine: object = None  # gpurig.connect.engine.Engine, this machine's (local_engine), for gpurig.image.baseimage

    def __call__(self, *args: str, check: bool = True, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.path, *args], capture_output=True, text=True, timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:2])} failed: {proc.stderr.strip()[-800:]}")
        return proc


@dataclass(frozen=True)
class ContainerHost:
    """One running container reachable over SSH as ``user`` on 127.0.0.1:``port``."""

    name: str
    cid: str
    port: int
    user: str
    key: Path
    docker: Docker

    def sh(self, script: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """Run a shell script inside the container as root, not through gpurig: the tests' independent eyes."""
        return self.docker("exec", "-i", self.cid, "sh", "-c", script, check=check, input=input)

    def read(self, path: str) -> str | None:
        proc = self.sh(f"cat {path}", check=False)
        return proc.stdout if proc.returncode == 0 else None

    def write(self, path: str, content: str, mode: str = "0644") -> None:
        self.sh(f"mkdir -p $(dirname {path}) && cat > {path} && chmod {mode} {path}", input=content)


@pytest.fixture(scope="session", autouse=True)
def xdg_cache_home(tmp_path_factory) -> Path:
    """One XDG_CACHE_HOME for every gpurig this worker starts (each test's HOME is its own folder), as a user's ~/.cache
    outlives each run: gpurig's local registry (gpurig.deploy.registry) keeps the layers pushed and its port there, so the
    engine here skips a layer it pushed before instead of compressing it again (a 1.1 GB CPU image took about 40 s of a core
    each time). A test that needs an empty registry gives its gpurig XDG_CACHE_HOME of its own."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        yield cache
    finally:
        if before is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = before
        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session")
def container_kit():
    """This module's session, label, login and helpers for conftests further down (a conftest is not importable)."""
    import types

    return types.SimpleNamespace(session=SESSION, run=RUN, run_label=RUN_LABEL, label=TEST_LABEL, login=LOGIN, mirror=MIRROR,
                                 host=ContainerHost, banner=_banner)


@pytest.fixture(scope="session")
def docker_engine():
    from gpurig.connect.engineopen import local_engine
    from gpurig.errors import GpurigError
    from gpurig.image.dockercli import find_client

    if os.geteuid() != 0:
        pytest.skip("container hosts need root (docker, debootstrap)")
    try:
        client = find_client()
        engine = local_engine()
    except GpurigError as err:
        pytest.skip(f"no usable Docker engine: {err}")
    with engine:
        yield Docker(client.path, engine)


@pytest.fixture(scope="session")
def host_image(docker_engine) -> str:
    """The fresh-host image, built once per session (about a minute with a cold base, seconds after)."""
    from gpurig.image.baseimage import ensure_base
    from gpurig.image.spec import Bootstrap

    base = ensure_base(docker_engine.engine, BASE_REF, Bootstrap("bookworm", MIRROR), {TEST_LABEL: SESSION}, say=lambda _: None)
    tag = f"gpurig-test-host:{SESSION}"
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    try:
        docker_engine("build", "-q", "-t", tag, "--label", f"{TEST_LABEL}={SESSION}", "-", input=DOCKERFILE, env=env, timeout=600)
        yield tag
    finally:
        # Only what this session made: its image, and the base if it bootstrapped it (another session's stays).
        docker_engine("image", "rm", "-f", tag, check=False)
        if base.source == "bootstrapped":
            docker_engine("image", "rm", "-f", base.image_id, check=False)


@pytest.fixture(scope="session")
def systemd_images(docker_engine, container_kit):
    """systemd_kit.SystemdImages: the systemd host images (debian12, debian13), each built once when first asked for."""
    from systemd_kit import SystemdImages

    images = SystemdImages(docker_engine, container_kit)
    try:
        yield images
    finally:
        images.remove()


@pytest.fixture(scope="session")
def host_key(tmp_path_factory) -> Path:
    key = tmp_path_factory.mktemp("container-hosts") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpurig-test", "-f", str(key)], check=True)
    key.with_suffix(".pub").chmod(0o644)
    return key


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture
def container_host(docker_engine, host_image, host_key, tmp_path) -> ContainerHost:
    """A fresh host: a new container from the session's image, sshd answering on 127.0.0.1; removed afterwards."""
    name = f"gpurig-host-{SESSION[:6]}-{uuid.uuid4().hex[:6]}"
    keys = tmp_path / "authorized_keys"
    keys.mkdir(mode=0o755)
    (keys / LOGIN).write_text(host_key.with_suffix(".pub").read_text())
    (keys / LOGIN).chmod(0o644)
    cid = docker_engine(
        "run", "-d", "--name", name, "--hostname", name, "--label", f"{TEST_LABEL}={SESSION}",
        "-p", "127.0.0.1::22", "-v", f"{keys}:/etc/ssh/authorized_keys:ro", host_image,
    ).stdout.strip()
    try:
        port = int(docker_engine("port", cid, "22").stdout.split()[0].rsplit(":", 1)[1])
        end = time.monotonic() + 60
        while not _banner(port):
            state = docker_engine("inspect", "-f", "{{.State.Status}}", cid).stdout.strip()
            if state != "running" or time.monotonic() > end:
                logs = docker_engine("logs", cid, check=False)
                raise AssertionError(f"sshd in {name} did not answer ({state}): {(logs.stdout + logs.stderr)[-500:]}")
            time.sleep(0.1)  # polling interval while waiting for the banner, not a synchronisation sleep
        yield ContainerHost(name, cid, port, LOGIN, host_key, docker_engine)
    finally:
        docker_engine("rm", "-f", "-v", cid, check=False)


@pytest.fixture
def host_inventory(tmp_path, container_host):
    """write(vars) -> an inventory file with the container host (become: true) and these extra vars."""

    def write(extra: dict | None = None, name: str | None = None) -> Path:
        host = {
            "ansible_host": "127.0.0.1",
            "ansible_port": container_host.port,
            "ansible_user": container_host.user,
            "ansible_ssh_private_key_file": str(container_host.key),
            "ansible_become": True,
            **(extra or {}),
        }
        path = tmp_path / "inventory" / "hosts.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump({"all": {"hosts": {name or container_host.name: host}}}, sort_keys=False))
        return path

    return write

