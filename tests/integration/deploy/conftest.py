"""The deploy tests' host: one Debian 12 systemd host per session, given Docker by `gpurig provision`, and the CPU images to deploy.

``deploy_host`` boots a fresh systemd host (tests/integration/systemd_kit.py;
its inner engine keeps images on an anonymous volume, removed with the host)
and runs `gpurig provision --only docker,daemon,python3` on it over SSH, so Provision
is the real thing under test. No GPU can exist here, so the test then puts
stand-ins in through its own `docker exec` (never through gpurig), written
to replay real output (tests/integration/deploy/gpuhost.py): `nvidia-smi`
answering for two A100s, the container toolkit's hook and runtime, and the
``nvidia`` runtime in daemon.json as gpurig's toolkit step writes it. With
the hook on PATH when dockerd starts, dockerd registers its ``nvidia``
device driver, so `docker run --gpus device=1` starts a container whose
config holds the DeviceRequests (checked once at session start).

Each test that asks for ``deploy_inventory`` or ``clean_deploy_host`` leaves
the host as it found it: every container it made inside is removed, unused
volumes go, the driver version returns to its default. Images stay (tests
that need an image absent remove it themselves). ``cpu_images`` builds the
CPU slim/ssh/jupyter images through `gpurig build` once per session, with
tests/integration/images/conftest.py's spec and wheelhouse (loaded from that
file, not copied).
"""

from __future__ import annotations

import json
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from systemd_kit import SystemdHosts, authorized_keys, inventory_for

from .cpuimages import CpuImages, images_kit, make_project
from .gpuhost import DEFAULT_DRIVER, DRIVER_FILE, FAKE_GPUS, PROBE_IMAGE, check_gpu_requests, gpu_host_image, gpurig, ready_host, restart_docker


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)


@dataclass
class DeployHost:
    """The session's deploy target: sshd on 127.0.0.1:``port`` as ``user`` with ``key``; Docker 20.10 inside, fake GPUs."""

    host: Any  # the ContainerHost from tests/integration/conftest.py
    gpus: tuple = FAKE_GPUS
    probe_image: str = PROBE_IMAGE  # a few-MB image (sleep, sh, cat) already in the host's engine
    baseline: frozenset = frozenset()
    _lock: threading.Lock = field(default_factory=threading.Lock)

    name = property(lambda self: self.host.name)
    cid = property(lambda self: self.host.cid)
    port = property(lambda self: self.host.port)
    user = property(lambda self: self.host.user)
    key = property(lambda self: self.host.key)

    def sh(self, script: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """A shell script inside the host as root, not through gpurig: the tests' independent eyes."""
        return self.host.sh(script, check=check, input=input)

    def read(self, path: str) -> str | None:
        return self.host.read(path)

    def write(self, path: str, content: str, mode: str = "0644") -> None:
        self.host.write(path, content, mode)

    def docker(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """`docker ARGS` inside the host (its own engine)."""
        return self.host.docker("exec", "-i", self.host.cid, "docker", *args, check=check, input=input)

    def inspect(self, what: str) -> dict | None:
        """`docker inspect` of a container or image inside the host, or None when there is none."""
        proc = self.docker("inspect", what, check=False)
        return json.loads(proc.stdout)[0] if proc.returncode == 0 else None

    def image_id(self, ref: str) -> str | None:
        found = self.inspect(f"{ref}")
        return found["Id"] if found and "RootFS" in found else None

    def containers(self) -> list[str]:
        return self.docker("ps", "-aq", "--no-trunc").stdout.split()

    def set_driver(self, version: str | None) -> None:
        """The driver version the fake nvidia-smi reports; None: no driver (nvidia-smi fails as with no module loaded)."""
        self.write(DRIVER_FILE, f"{version}\n" if version else "")

    @contextmanager
    def without_nvidia_runtime(self):
        """daemon.json without the nvidia runtime, dockerd restarted; put back (and restarted) afterwards."""
        before = self.read("/etc/docker/daemon.json") or "{}"
        doc = json.loads(before)
        doc.get("runtimes", {}).pop("nvidia", None)
        if not doc.get("runtimes"):
            doc.pop("runtimes", None)
        self.write("/etc/docker/daemon.json", json.dumps(doc, indent=2) + "\n")
        restart_docker(self.host)
        try:
            yield self
        finally:
            self.write("/etc/docker/daemon.json", before)
            restart_docker(self.host)

    def clean(self) -> None:
        """Every container made since the session started, unused volumes, the default driver version."""
        with self._lock:
            made = [c for c in self.containers() if c not in self.baseline]
            if made:
                self.docker("rm", "-f", "-v", *made, check=False)
            self.docker("volume", "prune", "-f", check=False)
            self.set_driver(DEFAULT_DRIVER)


@pytest.fixture(scope="session")
def gpu_hosts(docker_engine, container_kit, systemd_images, host_key, tmp_path_factory) -> dict[str, str]:
    """The images to boot provisioned hosts with stand-in GPUs from (SystemdHosts' ``images``): gpuhost.gpu_host_image, made
    once for the run by `gpurig provision` (the provision tests provision hosts of their own from scratch)."""
    work = tmp_path_factory.mktemp("gpu-host-image")
    keys = authorized_keys(work / "authorized_keys", container_kit.login, host_key)
    return {"debian12": gpu_host_image(docker_engine, container_kit, systemd_images, keys, host_key, work)}


@pytest.fixture(scope="session")
def deploy_host(docker_engine, container_kit, gpu_hosts, host_key, tmp_path_factory) -> DeployHost:
    """The session's provisioned Debian 12 host with fake GPUs; removed (with its engine's volume) at the end."""
    work = tmp_path_factory.mktemp("deploy-host")
    keys = authorized_keys(work / "authorized_keys", container_kit.login, host_key)
    maker = SystemdHosts(docker_engine, container_kit, gpu_hosts, keys, host_key)
    try:
        host = maker.make("debian12", storage="volume")
        ready_host(host)
        check_gpu_requests(host, f"{container_kit.label}={container_kit.session}")
        deploy = DeployHost(host)
        deploy.baseline = frozenset(deploy.containers())
        yield deploy
    finally:
        maker.remove()


@pytest.fixture(scope="session")
def fleet(deploy_host, docker_engine, container_kit, gpu_hosts, host_key, tmp_path_factory) -> list[DeployHost]:
    """Three provisioned hosts with stand-in GPUs, each its own network namespace and Docker engine, on Docker's default
    bridge: the session's deploy host and two more, booted side by side on first use; removed at the end.

    Shared by the rollout and the fabric modules (once per worker, not once per module: a fabric test moves the 1 GB
    slim image into each, which then stays). Images on the extra hosts' own volumes, not RAM, for that image's sake.
    """
    work = tmp_path_factory.mktemp("fleet-hosts")
    keys = authorized_keys(work / "keys", container_kit.login, host_key)
    maker = SystemdHosts(docker_engine, container_kit, gpu_hosts, keys, host_key)

    def boot(i: int) -> DeployHost:
        host = maker.make("debian12", storage="volume")
        ready_host(host)
        return DeployHost(host)

    try:
        with ThreadPoolExecutor(2) as pool:
            extra = list(pool.map(boot, (1, 2)))
        yield [deploy_host, *extra]
    finally:
        maker.remove()


@pytest.fixture
def clean_deploy_host(deploy_host) -> DeployHost:
    """The deploy host, cleaned after the test: its containers, volumes and driver version back to the session's start."""
    try:
        yield deploy_host
    finally:
        deploy_host.clean()


@pytest.fixture
def deploy_inventory(clean_deploy_host, tmp_path):
    """write(extra_vars=None, name=None) -> an inventory with the deploy host (become: true) and these vars."""

    def write(extra: dict | None = None, name: str | None = None) -> Path:
        path = inventory_for(tmp_path / "inventory" / "hosts.yaml", clean_deploy_host, extra)
        if name:  # the same host under another inventory name
            path.write_text(path.read_text().replace(f"{clean_deploy_host.name}:", f"{name}:", 1))
        return path

    return write


@pytest.fixture
def gpurig_cli(tmp_path):
    """run(*args, timeout=600, env=None) -> CompletedProcess: `gpurig ...` from tmp_path, HOME there too."""
    return lambda *args, **kw: gpurig(tmp_path, *args, **kw)


@pytest.fixture(scope="session")
def cpu_images(docker_engine, container_kit, systemd_images, tmp_path_factory) -> CpuImages:
    """slim/ssh/jupyter CPU images (torch from the local wheelhouse) on the session's Debian 12 base; removed at the end."""
    wheels = images_kit.wheel_dir()
    if not wheels:
        pytest.skip(f"no torch-{images_kit.CPU_TORCH}+cpu wheel in pip's find-links (PIP_FIND_LINKS / pip config list)")
    base = systemd_images.base("debian12")  # already debootstrapped for the hosts: no second bootstrap
    spec_name = f"gpurig-deploy-{container_kit.session[:8]}"
    project = make_project(tmp_path_factory.mktemp("deploy-project"), spec_name, base, wheels)
    images = CpuImages(project, spec_name, f"{container_kit.label}={container_kit.session}", base=base, wheels=wheels)
    try:
        yield images
    finally:
        for ref in images.built:
            docker_engine("image", "rm", ref, check=False)
