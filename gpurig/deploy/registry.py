"""The build machine's own image registry, which a host's dockerd pulls from through a reverse SSH forward (gpurig.connect.forward).

``LocalRegistry`` runs Debian's ``docker-registry`` (distribution) on
127.0.0.1 with gpurig's own config: no auth (it answers on loopback only),
storage under a cache directory that outlives the run, so a later push moves
only layers it has not seen. It prefers the port it had last time: the local
engine remembers which layers it pushed to which ``host:port/repo``, and
with the same name it skips even the existence checks. ``shared_registry``
starts one per process on first use and stops it when the last user leaves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpurig.errors import GpurigError
from gpurig.process import stop

BINARIES = ("docker-registry", "registry")  # Debian's package name, upstream's binary name
STOP_GRACE_S = 10  # seconds the registry gets to end on SIGTERM before SIGKILL


class RegistryError(GpurigError):
    """The local registry could not be started or used."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpurig" / "registry"


def find_registry_binary() -> str | None:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


# --- image references ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """An image name split as Docker does: ``domain/path:tag`` (the domain is None for Docker Hub style names)."""

    domain: str | None
    path: str
    tag: str

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    def __str__(self) -> str:
        return f"{self.name}:{self.tag}"

    def on(self, registry: str) -> str:
        """This repository and tag on another registry (``host:port`` or ``host/prefix``)."""
        return f"{registry.rstrip('/')}/{self.path}:{self.tag}"


def parse_reference(ref: str) -> Reference:
    """``[domain/]path[:tag]``; a digest reference is refused (delivery needs a tag to give the host)."""
    if "@" in ref:
        raise RegistryError(f"image {ref}: a digest reference cannot be delivered", "name the image by its tag (name:tag)")
    name, tag = ref, "latest"
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        name, tag = ref[:colon], ref[colon + 1:]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return Reference(first, rest, tag)
    return Reference(None, name, tag)


STAGING_REPOSITORY = "gpurig/deliver"


def staging_reference(ref: Reference) -> Reference:
    """Where ``ref`` lives in the local registry: one repository for every image, so a push finds the layers any
    earlier push stored (the engine checks layers it knows per repository) and writes only new ones."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{ref.name}_{ref.tag}")
    if len(tag) > 128:
        tag = tag[:111] + "_" + hashlib.sha256(tag.encode()).hexdigest()[:16]
    return Reference(None, STAGING_REPOSITORY, tag)


# --- the local registry ----------------------------------------------------------------------------


CONFIG = """\
version: 0.1
log: {{level: error, accesslog: {{disabled: true}}}}
storage:
  filesystem: {{rootdirectory: {root}}}
  delete: {{enabled: false}}
  maintenance: {{uploadpurging: {{enabled: false}}}}
http:
  addr: "127.0.0.1:{port}"
  secret: "{secret}"
"""


class LocalRegistry:
    """``docker-registry`` on 127.0.0.1:``port`` storing under ``cache_dir``; ``start()``/``stop()`` or a with-block."""

    def __init__(self, cache_dir: Path | None = None, binary: str | None = None) -> None:
        self.cache_dir = Path(cache_dir or default_cache_dir())
        self.binary = binary or find_registry_binary()
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, deadline_s: float = 20) -> None:
        if self._proc is not None:
            return
        if not self.binary:
            raise RegistryError("no docker-registry binary on this machine",
                                "install Debian's docker-registry package (scripts/setup.sh does)")
        # Only this user: the cache holds every image delivered, the config the registry's HTTP secret.
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.cache_dir.chmod(0o700)
        (self.cache_dir / "data").mkdir(exist_ok=True)
        reap_orphans(self.cache_dir)
        last = ""
        for port in self._ports():
            config = self.cache_dir / f"config-{os.getpid()}.yml"
            fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(CONFIG.format(root=json.dumps(str(self.cache_dir / "data")), port=port, secret=secrets.token_hex(16)))
            log = self.cache_dir / f"registry-{os.getpid()}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen([self.binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            if self._wait_ready(proc, port, deadline_s) and proc.poll() is None:  # not another server's answer
                self._proc, self.port = proc, port
                (self.cache_dir / "port").write_text(f"{port}\n")
                return
            stop(proc, STOP_GRACE_S)
            last = (log.read_text(errors="replace").strip().splitlines() or ["it did not answer"])[-1]
        raise RegistryError(f"the local registry did not start: {last}", f"see {self.cache_dir}; `{self.binary} serve CONFIG` by hand")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop(proc, STOP_GRACE_S)
        for name in (f"config-{os.getpid()}.yml", f"registry-{os.getpid()}.log"):
            (self.cache_dir / name).unlink(missing_ok=True)

    def _ports(self) -> Iterator[int]:
        """The port of last time if it is free, then two the kernel picks."""
        try:
            remembered = int((self.cache_dir / "port").read_text())
        except (OSError, ValueError):
            remembered = 0
        if remembered and _free(remembered):
            yield remembered
        for _ in range(2):
            yield _any_free_port()

    @staticmethod
    def _wait_ready(proc: subprocess.Popen, port: int, deadline_s: float) -> bool:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)  # polling interval while the registry starts
        return False


def reap_orphans(cache_dir: Path) -> list[int]:
    """Stop registries whose gpurig died without stopping them (SIGKILL, a lost terminal): their config names a dead pid.

    Each registry runs from ``config-<gpurig pid>.yml``; a registry process whose
    config's gpurig pid is gone is stopped and its files removed. Returns the pids stopped.
    """
    stopped = []
    for config in cache_dir.glob("config-*.yml"):
        owner = config.stem.split("-", 1)[1]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        needle = str(config).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if needle in (proc / "cmdline").read_bytes().split(b"\0"):
                    os.kill(int(proc.name), 15)
                    stopped.append(int(proc.name))
            except OSError:
                continue
        config.unlink(missing_ok=True)
        (cache_dir / f"registry-{owner}.log").unlink(missing_ok=True)
    return stopped


def _free(port: int) -> bool:
    """Nothing listens on it (connections of the last run in TIME_WAIT do not count: the registry binds with SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _any_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_shared_lock = threading.Lock()
_shared: dict[Path, list] = {}  # cache dir -> [registry, users]


@contextmanager
def shared_registry(cache_dir: Path | None = None) -> Iterator[LocalRegistry]:
    """One registry per cache dir in this process, however many hosts deliver at once; stopped when the last leaves."""
    key = Path(cache_dir or default_cache_dir()).resolve()
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            registry = LocalRegistry(key)
            registry.start()
            entry = _shared[key] = [registry, 0]
        entry[1] += 1
    try:
        yield entry[0]
    finally:
        with _shared_lock:
            entry[1] -= 1
            if entry[1] == 0:
                _shared.pop(key, None)
                entry[0].stop()
