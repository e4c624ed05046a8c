"""Fresh hosts that boot systemd: Debian 12 and Debian 13 containers with sshd, sudo and room for an inner Docker engine.

The provision tests install Docker on these hosts for real, so each must run
systemd (``systemctl enable --now docker``) and an inner dockerd. Both host
images are built once per test session, in parallel, from bases
debootstrapped from Debian's archive under this session's own names (no
other session can remove them from under it); every test gets a fresh
container, removed afterwards. The ``docker run`` flags are the ones
TEST-ENVIRONMENT.md records as working here without --privileged. NVIDIA's
and Docker's repositories resolve to 127.0.0.1 inside the hosts, so a step
that reaches for them fails at once and no traffic leaves for them.
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

SUITES = {"debian12": "bookworm", "debian13": "trixie"}
UNREACHABLE = ("nvidia.github.io", "download.docker.com", "developer.download.nvidia.com")

DOCKERFILE = """\
FROM {base}
# A bare server: systemd as init, sshd (host keys made at first boot), sudo; nothing else.
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends systemd systemd-sysv dbus openssh-server sudo \\
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \\
 && useradd -m -s /bin/sh -p '*' {login} \\
 && echo '{login} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{login} && chmod 0440 /etc/sudoers.d/{login} \\
 && printf '%s\\n' 'AuthorizedKeysFile /etc/ssh/authorized_keys/%u' 'PasswordAuthentication no' \\
      'KbdInteractiveAuthentication no' 'UsePAM no' > /etc/ssh/sshd_config.d/gpurig-test.conf \\
 && mkdir -p /etc/systemd/system/ssh.service.d \\
 && printf '%s\\n' '[Service]' 'ExecStartPre=' 'ExecStartPre=/usr/bin/ssh-keygen -A' 'ExecStartPre=/usr/sbin/sshd -t' \\
      > /etc/systemd/system/ssh.service.d/gpurig-test.conf \\
 && systemctl enable ssh.service \\
 && systemctl mask getty@tty1.service console-getty.service systemd-logind.service
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
"""

RUN_FLAGS = (
    "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--device-cgroup-rule", "a *:* rwm",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/var/lib/docker:exec",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
)


def _build(docker, kit, key: str, suite: str, bases: list) -> str:
    from gpurig.base import bootstrap_base
    from gpurig.spec import Bootstrap

    base = f"gpurig-test-base-{suite}:{kit.session}"
    # Removed by id at teardown: the bootstrap also tags it gpurig-base:<suite>-minbase, which a tag removal would leave.
    bases.append(bootstrap_base(docker.client, base, Bootstrap(suite, kit.mirror), {kit.label: kit.session}).image_id)
    tag = f"gpurig-test-systemd-host-{key}:{kit.session}"
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    docker("build", "-q", "-t", tag, "--label", f"{kit.label}={kit.session}", "-",
           input=DOCKERFILE.format(base=base, login=kit.login), env=env, timeout=600)
    return tag


@pytest.fixture(scope="session")
def systemd_images(docker_engine, container_kit):
    """{"debian12": image, "debian13": image}, built once, in parallel; removed with their bases at teardown."""
    session = container_kit.session
    bases: list[str] = []
    try:
        with ThreadPoolExecutor(len(SUITES)) as pool:
            futures = {key: pool.submit(_build, docker_engine, container_kit, key, suite, bases) for key, suite in SUITES.items()}
            images = {key: f.result() for key, f in futures.items()}
        yield images
    finally:
        # Also a container that `docker run` created but failed to start (its id never came back to the test).
        left = docker_engine("ps", "-aq", "--filter", f"label={container_kit.label}={session}", check=False).stdout.split()
        if left:
            docker_engine("rm", "-f", "-v", *left, check=False)
        for key, suite in SUITES.items():
            docker_engine("image", "rm", "-f", f"gpurig-test-systemd-host-{key}:{session}", check=False)
            docker_engine("image", "rm", "-f", f"gpurig-test-base-{suite}:{session}", check=False)
        for image_id in bases:
            docker_engine("image", "rm", "-f", image_id, check=False)


@dataclass
class SystemdHosts:
    """Makes fresh systemd hosts and starts killed ones again; remembers every container it made."""

    docker: Any
    kit: Any
    images: dict
    keys: Path
    key: Path
    made: list = field(default_factory=list)

    def make(self, os_key: str = "debian12"):
        name = f"gpurig-sdhost-{self.kit.session[:6]}-{uuid.uuid4().hex[:6]}"
        hosts = [f"--add-host={h}:127.0.0.1" for h in UNREACHABLE]
        cid = self.docker(
            "run", "-d", "--name", name, "--hostname", name, "--label", f"{self.kit.label}={self.kit.session}",
            *RUN_FLAGS, *hosts, "-p", "127.0.0.1::22", "-v", f"{self.keys}:/etc/ssh/authorized_keys:ro", self.images[os_key],
        ).stdout.strip()
        self.made.append(cid)
        return self._ready(cid, name)

    def restart(self, host):
        """The same container started again after a kill (its SSH port may change)."""
        self.docker("start", host.cid)
        return self._ready(host.cid, host.name)

    def _ready(self, cid: str, name: str):
        port = int(self.docker("port", cid, "22").stdout.split()[0].rsplit(":", 1)[1])
        end = time.monotonic() + 90
        while not self.kit.banner(port):
            state = self.docker("inspect", "-f", "{{.State.Status}}", cid).stdout.strip()
            if state != "running" or time.monotonic() > end:
                logs = self.docker("logs", cid, check=False)
                raise AssertionError(f"sshd in {name} did not answer ({state}): {(logs.stdout + logs.stderr)[-800:]}")
            time.sleep(0.1)  # polling interval while waiting for the banner, not a synchronisation sleep
        return self.kit.host(name, cid, port, self.kit.login, self.key, self.docker)


@pytest.fixture
def systemd_hosts(docker_engine, container_kit, systemd_images, host_key, tmp_path):
    """A SystemdHosts maker; every container it made is removed afterwards."""
    keys = tmp_path / "authorized_keys"
    keys.mkdir(mode=0o755)
    (keys / container_kit.login).write_text(host_key.with_suffix(".pub").read_text())
    (keys / container_kit.login).chmod(0o644)
    hosts = SystemdHosts(docker_engine, container_kit, systemd_images, keys, host_key)
    try:
        yield hosts
    finally:
        for cid in hosts.made:
            docker_engine("rm", "-f", "-v", cid, check=False)


def inventory_for(path: Path, host, extra: dict | None = None) -> Path:
    """An inventory file with ``host`` (become: true) and these vars; rewritten when the host's port changed."""
    entry = {
        "ansible_host": "127.0.0.1",
        "ansible_port": host.port,
        "ansible_user": host.user,
        "ansible_ssh_private_key_file": str(host.key),
        "ansible_become": True,
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"all": {"hosts": {host.name: entry}}}, sort_keys=False))
    return path


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
