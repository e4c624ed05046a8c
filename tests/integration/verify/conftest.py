"""Fixtures for verify: a CPU torch image built by gpurig, and a host over SSH whose Docker runs it.

The image is the CPU slim image of a test spec (torch 2.13.0+cpu from pip's
find-links wheelhouse), built once per session through ``gpurig build`` as
a user would, labelled io.gpurig.test=<session> and removed at the end. The
host is the session's sshd container (tests/integration/conftest.py) with
this machine's Docker socket and client mounted, so ``gpurig verify`` works
over real SSH and a real Docker engine without moving a 1 GB image into an
inner engine; what verify starts there (``docker run --rm``) runs on this
engine and is gone when it ends. Containers the tests start carry the label
and are removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CPU_TORCH = "2.13.0"
SPEC = """\
name: gpurig-verify-{session}
python: "3.11"
registry: ""
matrix:
  - {{torch: "{torch}", cuda: "cpu", default: true}}
base:
  image: debian:bookworm-slim
  bootstrap: {{suite: bookworm, mirror: "http://deb.debian.org/debian"}}
user: {{name: gpurig, uid: 1000}}
variants:
  slim: {{}}
build:
  find_links: [{wheels}]
  ca_bundle: auto
  aliases: []
"""


def gpurig(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def wheelhouse() -> str | None:
    for folder in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split():
        if list(Path(folder).glob(f"torch-{CPU_TORCH}+cpu-*.whl")):
            return folder
    return None


@pytest.fixture(scope="session")
def torch_image(docker_engine, container_kit, tmp_path_factory) -> str:
    """The CPU slim image's tag, built once per session by `gpurig build`."""
    wheels = wheelhouse()
    if not wheels:
        pytest.skip(f"no torch-{CPU_TORCH}+cpu wheel in the find-links wheelhouse")
    project = tmp_path_factory.mktemp("verify-project")
    for name in ("templates", "checks", ".hadolint.yaml"):
        (project / name).symlink_to(REPO / name)
    (project / "images").mkdir()
    (project / "images" / "pytorch.yaml").write_text(SPEC.format(session=container_kit.session[:8], torch=CPU_TORCH, wheels=wheels))
    built = gpurig("build", "--variant", "slim", "--cuda", "cpu", "--label", f"{container_kit.label}={container_kit.session}", cwd=project)
    assert built.returncode == 0, built.stderr[-2000:]
    tag = f"gpurig-verify-{container_kit.session[:8]}:slim-cpu"
    found = docker_engine("image", "ls", "-q", "--filter", f"reference=gpurig-verify-{container_kit.session[:8]}").stdout.split()
    assert found, built.stdout[-1000:]
    yield docker_engine("image", "inspect", "-f", "{{index .RepoTags 0}}", found[0]).stdout.strip() or tag
    docker_engine("image", "rm", "-f", *sorted(set(found)), check=False)


@dataclass(frozen=True)
class DockerHost:
    """An sshd host whose `docker` is this machine's engine, and an inventory file for it."""

    name: str
    inventory: Path
    project: Path
    cid: str
    docker: object

    def write(self, path: str, content: str, mode: str = "0755") -> None:
        """A file inside the host as root, not through gpurig (e.g. a stand-in nvidia-smi)."""
        self.docker("exec", "-i", self.cid, "sh", "-c", f"cat > {path} && chmod {mode} {path}", input=content)


@contextmanager
def sshd_docker_host(docker_engine, container_kit, host_image, host_key, folder: Path, name: str | None = None):
    """(name, cid, inventory vars) of an sshd container whose `docker` is this machine's engine; removed on the way out."""
    name = name or f"gpurig-verify-{container_kit.session[:6]}-{uuid.uuid4().hex[:6]}"
    keys = folder / f"authorized_keys-{name}"
    keys.mkdir(mode=0o755)
    (keys / container_kit.login).write_text(host_key.with_suffix(".pub").read_text())
    (keys / container_kit.login).chmod(0o644)
    cid = docker_engine(
        "run", "-d", "--name", name, "--hostname", name, "--label", f"{container_kit.label}={container_kit.session}",
        "-p", "127.0.0.1::22", "-v", f"{keys}:/etc/ssh/authorized_keys:ro",
        "-v", "/var/run/docker.sock:/var/run/docker.sock", "-v", f"{docker_engine.path}:/usr/local/bin/docker:ro", host_image,
    ).stdout.strip()
    try:
        port = int(docker_engine("port", cid, "22").stdout.split()[0].rsplit(":", 1)[1])
        end = time.monotonic() + 60
        while not container_kit.banner(port):
            assert time.monotonic() < end, f"sshd in {name} did not answer"
            time.sleep(0.1)  # polling interval while waiting for the banner
        yield name, cid, {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": container_kit.login,
                          "ansible_ssh_private_key_file": str(host_key), "ansible_become": True}
    finally:
        docker_engine("rm", "-f", "-v", cid, check=False)


@pytest.fixture
def docker_host(docker_engine, container_kit, host_image, host_key, tmp_path) -> DockerHost:
    with sshd_docker_host(docker_engine, container_kit, host_image, host_key, tmp_path) as (name, cid, hostvars):
        inventory = tmp_path / "hosts.yaml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {name: hostvars}}}))
        project = tmp_path / "project"
        project.mkdir()
        (project / "checks").symlink_to(REPO / "checks")
        yield DockerHost(name, inventory, project, cid, docker_engine)


@pytest.fixture
def workload(docker_engine, container_kit, torch_image):
    """start(*docker run flags) -> the name of a running container of the torch image (as deploy would start it)."""
    started: list[str] = []

    def start(*flags: str) -> str:
        name = f"gpurig-verify-work-{uuid.uuid4().hex[:8]}"
        docker_engine("run", "-d", "--name", name, "--label", f"{container_kit.label}={container_kit.session}", *flags,
                      "--entrypoint", "sleep", torch_image, "600")
        started.append(name)
        return name

    yield start
    for name in started:
        docker_engine("rm", "-f", "-v", name, check=False)
