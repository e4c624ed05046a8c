"""Fresh hosts that boot systemd, as an importable module: Debian 12 and 13 containers with sshd, sudo and an inner Docker engine.

Shared by tests/integration/hosts_systemd (provision), tests/integration/deploy
and bench/bench_deploy.py; a conftest cannot be imported, this module can
(tests/integration is on sys.path under pytest's default import mode).
Each host image is built once per run, on first use, from a base
debootstrapped from Debian's archive and kept from run to run under a name
keyed by its recipe and the week (``kept_base``), so that builds on it find
the engine's build cache; the run's own names for them go at its end. The ``docker run`` flags are the
ones TEST-ENVIRONMENT.md records as working without --privileged. NVIDIA's
and Docker's repositories resolve to 127.0.0.1 inside the hosts, so a step
that reaches for them fails at once and no traffic leaves for them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SUITES = {"debian12": "bookworm", "debian13": "trixie"}
KEPT_LABEL = "io.gpurig.test.kept-base"  # its value: the suite of a base kept from run to run (kept_base)
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
    "--tmpfs", "/run", "--tmpfs", "/run/lock",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
)
# Where the inner engine keeps its images: RAM for small ones; an anonymous volume (on the outer engine's
# disk, removed with `docker rm -v`) where images of a gigabyte or more land.
STORAGE = {
    "tmpfs": ("--tmpfs", "/var/lib/docker:exec"),
    "volume": ("-v", "/var/lib/docker"),
}


def base_tag(kit, suite: str) -> str:
    return f"gpurig-test-base-{suite}:{kit.run}"


def host_tag(kit, key: str) -> str:
    return f"gpurig-test-systemd-host-{key}:{kit.run}"


def shared(kit) -> bool:
    """Whether this session is one of several workers of a run (pytest-xdist), which share the host images."""
    return kit.run != kit.session


@contextlib.contextmanager
def run_lock(kit, key: str):
    """Held by one worker of the run at a time: the first builds ``key``'s image, the others then find it built."""
    with open(Path(tempfile.gettempdir()) / f"gpurig-test-{kit.run}-{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def kept_base(docker, kit, suite: str) -> str:
    """The suite's debootstrapped base, kept from run to run (never labelled with a run or session) under a name keyed by what
    makes it: the suite, the mirror, gpurig's bootstrap code and the ISO week. A later run finds it, and with it the engine's
    build cache for every image built FROM it (the host images' apt installs, the CPU images' torch), instead of bootstrapping
    a base whose new id missed that cache in every build. The suite's base of an earlier key is removed when a new one is made."""
    from gpurig.image import baseimage
    from gpurig.image.spec import Bootstrap

    recipe = "\n".join((suite, kit.mirror, Path(baseimage.__file__).read_text(), time.strftime("%G-W%V", time.gmtime())))
    tag = f"gpurig-test-base-{suite}:kept-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    with open(Path(tempfile.gettempdir()) / f"gpurig-test-{tag.replace(':', '-')}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # one bootstrap at a time for this key, across the runs of this machine too
        if docker("image", "inspect", "--format", "{{.Id}}", tag, check=False).returncode != 0:
            baseimage.bootstrap_base(docker.engine, tag, Bootstrap(suite, kit.mirror), {KEPT_LABEL: suite})
            older = docker("image", "ls", "--filter", f"label={KEPT_LABEL}={suite}", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
            for ref in older:
                if ref != tag and ref.startswith(f"gpurig-test-base-{suite}:kept-"):
                    docker("image", "rm", ref, check=False)  # not -f: a base a host of another run still runs on stays
    return tag


def build_image(docker, kit, key: str) -> str:
    """The host image for ``key`` (debian12, debian13) on the suite's kept base (tagged for this run as ``base_tag``).

    Once per run: the workers of an xdist run take turns, and a worker that finds the image built uses it.
    """
    suite, tag = SUITES[key], host_tag(kit, key)
    labels = {kit.label: kit.session, kit.run_label: kit.run}
    with run_lock(kit, key):
        if docker("image", "inspect", "--format", "{{.Id}}", tag, check=False).returncode == 0:
            return tag
        base = base_tag(kit, suite)
        docker("tag", kept_base(docker, kit, suite), base)  # a name of this run's: removed at its end, the kept base stays
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        docker("build", "-q", "-t", tag, *(f"--label={k}={v}" for k, v in labels.items()), "-",
               input=DOCKERFILE.format(base=base, login=kit.login), env=env, timeout=600)
    return tag


class SystemdImages:
    """The session's host images, each built once on first use (``images["debian12"]``); ``prebuild`` starts several at once."""

    def __init__(self, docker, kit) -> None:
        self.docker, self.kit = docker, kit
        self._lock = threading.Lock()
        self._builds: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(len(SUITES))

    def prebuild(self, *keys: str) -> None:
        for key in keys:
            self._build(key)

    def __getitem__(self, key: str) -> str:
        return self._build(key).result()

    def base(self, key: str) -> str:
        """The debootstrapped base under the host image (built with it): a Debian base other images may reuse."""
        self[key]
        return base_tag(self.kit, SUITES[key])

    def _build(self, key: str) -> Future:
        with self._lock:
            if key not in self._builds:
                self._builds[key] = self._pool.submit(build_image, self.docker, self.kit, key)
            return self._builds[key]

    def remove(self) -> None:
        """Every container of the session (also one `docker run` created but failed to start), the images, their bases."""
        self._pool.shutdown(wait=True)
        docker, kit = self.docker, self.kit
        left = docker("ps", "-aq", "--filter", f"label={kit.label}={kit.session}", check=False).stdout.split()
        if left:
            docker("rm", "-f", "-v", *left, check=False)
        # the networks hosts were started on (SystemdHosts.make(network=...)), once no container is left on them
        docker("network", "prune", "-f", "--filter", f"label={kit.label}={kit.session}", check=False)
        if shared(kit):
            return  # the images are the run's: its controller removes them once every worker is done (tests/conftest.py)
        # what the run made from them (deploy/gpuhost.gpu_host_image) first, then its names for them; the kept bases stay
        made = docker("image", "ls", "-q", "--filter", f"label={kit.run_label}={kit.run}", check=False).stdout.split()
        for key, suite in SUITES.items():
            made.append(host_tag(kit, key))
            made.append(base_tag(kit, suite))
        for ref in dict.fromkeys(made):
            docker("image", "rm", "-f", ref, check=False)


@dataclass
class SystemdHosts:
    """Makes fresh systemd hosts and starts killed ones again; remembers every container it made."""

    docker: Any
    kit: Any
    images: Any  # SystemdImages, or a mapping key -> image
    keys: Path
    key: Path
    made: list = field(default_factory=list)

    def make(self, os_key: str = "debian12", storage: str = "tmpfs", network: str | None = None, name: str | None = None):
        """A booted host answering SSH; ``network``: a user-defined Docker network to join (where hosts resolve each
        other by name), else the default bridge; ``name``: its container name and hostname (default: a random one)."""
        name = name or f"gpurig-sdhost-{self.kit.session[:6]}-{uuid.uuid4().hex[:6]}"
        hosts = [f"--add-host={h}:127.0.0.1" for h in UNREACHABLE]
        joins = ("--network", network) if network else ()
        proc = self.docker(
            "run", "-d", "--name", name, "--hostname", name, "--label", f"{self.kit.label}={self.kit.session}",
            *RUN_FLAGS, *STORAGE[storage], *hosts, *joins, "-p", "127.0.0.1::22",
            "-v", f"{self.keys}:/etc/ssh/authorized_keys:ro", self.images[os_key], check=False,
        )
        if proc.returncode != 0:  # created but not started still leaves a container (and its volume) to remove
            self.docker("rm", "-f", "-v", name, check=False)
            raise AssertionError(f"docker run of host {name} failed: {proc.stderr.strip()[-800:]}")
        cid = proc.stdout.strip()
        self.made.append(cid)
        return self._ready(cid, name)

    def restart(self, host):
        """The same container started again after a kill (its SSH port may change)."""
        self.docker("start", host.cid)
        return self._ready(host.cid, host.name)

    def remove(self) -> None:
        for cid in self.made:
            self.docker("rm", "-f", "-v", cid, check=False)
        self.made.clear()

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


def authorized_keys(folder: Path, login: str, key: Path) -> Path:
    """A folder to mount at /etc/ssh/authorized_keys holding ``key``'s public half for ``login``."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    (folder / login).write_text(key.with_suffix(".pub").read_text())
    (folder / login).chmod(0o644)
    return folder


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


def interrupt_when(proc, started: Callable[[], bool], what: str, sig: int = signal.SIGINT, deadline_s: float = 300) -> tuple[str, str, float]:
    """Send ``sig`` to ``proc`` (a gpurig run) once ``started()`` holds, polled with a deadline.

    Returns its stdout, stderr and the seconds from the signal to its end; a
    run that will not end within two minutes is killed (and the test fails).
    """
    try:
        end = time.monotonic() + deadline_s
        while not started():
            assert proc.poll() is None, f"gpurig ended before {what}: {proc.communicate()}"
            assert time.monotonic() < end, f"{what} never happened"
            time.sleep(0.1)  # polling interval while waiting for the event, not a synchronisation sleep
        proc.send_signal(sig)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=120)
        return out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
