"""Real sshd hosts on loopback for the hosts-layer tests: each with its own host key and port.

Every process started here is stopped at teardown; readiness is polled
(the SSH banner), never slept for.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpurig.connect.connector import Connector
from gpurig.connect.ssh import SSHSettings
from gpurig.inventory import Host

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)
            if SSHD is None:
                item.add_marker(pytest.mark.skip(reason="sshd not installed (apt-get install openssh-server)"))
            elif os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="sshd test hosts need root (to log in as root and create a sudo user)"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str = "gpurig-test") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


def ssh_fingerprint(pub: Path) -> str:
    """What OpenSSH itself says the key's fingerprint is (an oracle independent of gpurig)."""
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], check=True, capture_output=True, text=True).stdout.split()[1]


def wait_for_banner(port: int, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise RuntimeError(f"sshd on port {port} did not come up")
        time.sleep(0.02)  # polling interval while waiting for readiness, not a synchronisation sleep


@dataclass
class SshdHost:
    name: str
    port: int
    dir: Path
    host_key: Path
    proc: subprocess.Popen | None = None

    @property
    def fingerprint(self) -> str:
        return ssh_fingerprint(self.host_key.with_suffix(".pub"))

    @property
    def known_hosts_name(self) -> str:
        return f"[127.0.0.1]:{self.port}"


class SshdFarm:
    """Starts and stops sshd processes, one per test host."""

    def __init__(self, base: Path, client_pub: Path) -> None:
        self.base = base
        self.client_pub = client_pub
        self.hosts: list[SshdHost] = []
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory

    def start(self, count: int = 1, prefix: str = "h", extra: str = "") -> list[SshdHost]:
        made = []
        for _ in range(count):
            name = f"{prefix}{len(self.hosts):03d}"
            d = self.base / name
            d.mkdir()
            key = keygen(d / "host_key", name)
            shutil.copy(self.client_pub, d / "authorized_keys")
            host = SshdHost(name, 0, d, key)
            self._launch(host, extra)
            self.hosts.append(host)
            made.append(host)
        for host in made:
            self._wait_for_own(host, extra)
        return made

    def _launch(self, host: SshdHost, extra: str) -> None:
        host.port = free_port()
        d = host.dir
        (d / "sshd_config").write_text(
            f"Port {host.port}\nListenAddress 127.0.0.1\nHostKey {host.host_key}\nPidFile {d}/sshd.pid\n"
            f"AuthorizedKeysFile .ssh/authorized_keys {d}/authorized_keys\n"
            "UsePAM no\nStrictModes no\nMaxStartups 500\nMaxSessions 100\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "Subsystem sftp internal-sftp\nLogLevel ERROR\n" + extra
        )
        host.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.DEVNULL)

    def _wait_for_own(self, host: SshdHost, extra: str, attempts: int = 5) -> None:
        """Until the sshd answering on the host's port is its own (its host key): a port free_port found free may be taken
        by another worker's listener before this sshd binds it, and then that listener answered in its place."""
        mine = host.host_key.with_suffix(".pub").read_text().split()[1]
        for _ in range(attempts):
            try:
                wait_for_banner(host.port)
                scan = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(host.port), "127.0.0.1"],
                                      capture_output=True, text=True, timeout=30).stdout
            except RuntimeError:
                scan = ""
            if mine in scan.split():
                return
            self._stop(host)
            self._launch(host, extra)
        raise RuntimeError(f"sshd {host.name} found no port of its own in {attempts} tries")

    @staticmethod
    def _stop(host: SshdHost) -> None:
        if host.proc is not None and host.proc.poll() is None:
            host.proc.kill()
            host.proc.wait(timeout=60)

    def kill(self, host: SshdHost) -> None:
        """SIGKILL the listener and every process under it (its sessions), like a host dying."""
        if host.proc is None or host.proc.poll() is not None:
            return
        for pid in [host.proc.pid, *_descendants(host.proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        host.proc.wait(timeout=60)

    def stop_all(self) -> None:
        for host in self.hosts:
            self.kill(host)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@pytest.fixture(scope="session")
def client_key(tmp_path_factory) -> Path:
    return keygen(tmp_path_factory.mktemp("client") / "id_ed25519", "gpurig-client")


@pytest.fixture(scope="session")
def login_user(client_key) -> str:
    """The account tests log in as: /bin/sh, key-only, passwordless sudo; removed afterwards.

    Not root: root's ~/.bashrc may do real work on every SSH command (here it
    runs `pyenv init`, whose rehash lock a killed session would leave behind),
    and tests must neither pay for nor disturb the machine's own setup.
    """
    name = f"gpt{secrets.token_hex(3)}"
    sudoers = Path(f"/etc/sudoers.d/{name}")
    # Password '*': no password login, yet not a locked account (which sshd without PAM refuses).
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-p", "*", name], check=True)
    try:
        _authorize(name, client_key)
        sudoers.write_text(f"{name} ALL=(ALL) NOPASSWD: ALL\n")
        sudoers.chmod(0o440)
        yield name
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run(["userdel", "-r", "-f", name], check=False, capture_output=True)


def _authorize(user: str, client_key: Path) -> None:
    ssh_dir = Path(f"/home/{user}/.ssh")
    ssh_dir.mkdir(mode=0o700)
    shutil.copy(client_key.with_suffix(".pub"), ssh_dir / "authorized_keys")
    subprocess.run(["chown", "-R", f"{user}:{user}", str(ssh_dir)], check=True)


@pytest.fixture(scope="module", autouse=True)
def one_module_at_a_time():
    """A module of this folder runs while no other worker of the test run runs one (a run-wide lock, bounded by the test's
    timeout). Beside another worker's module, a login offering a refused key first was now and then refused its right
    key too (1 run in 5 with two workers; never when the modules took turns): the accounts and sshd processes they
    make are the machine's, not a container's."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:12]
    if not run:  # no other worker: nothing to take turns with (and no lock file left behind)
        yield
        return
    with open(Path(tempfile.gettempdir()) / f"gpurig-test-{run}-hosts.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def farm(tmp_path_factory, client_key):
    f = SshdFarm(tmp_path_factory.mktemp("sshd"), client_key.with_suffix(".pub"))
    yield f
    f.stop_all()


@pytest.fixture(scope="session")
def sshd(farm) -> SshdHost:
    """One ordinary host, shared by tests that do not change it."""
    return farm.start(1, prefix="shared")[0]


@pytest.fixture
def settings(tmp_path) -> SSHSettings:
    """Settings isolated from the user's ~/.ssh: project known_hosts in tmp, no agent, no default keys."""
    return SSHSettings(
        connect_timeout=5,
        connect_attempts=1,
        project_known_hosts=tmp_path / "known_hosts",
        user_known_hosts=None,
        ssh_config=None,
        allow_agent=False,
        look_for_keys=False,
    )


@pytest.fixture
def connector(settings):
    c = Connector(settings)
    yield c
    c.close()


def inventory_text(hosts: dict[str, dict], key: Path, user: str) -> str:
    data = {"all": {"vars": {"ansible_user": user, "ansible_ssh_private_key_file": str(key)}, "hosts": hosts}}
    return yaml.safe_dump(data, sort_keys=False)


@pytest.fixture
def write_inventory(tmp_path, client_key, login_user):
    def write(hosts: dict[str, dict]) -> Path:
        path = tmp_path / "inventory" / "hosts.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(inventory_text(hosts, client_key, login_user))
        return path

    return write


@pytest.fixture
def make_host(client_key, login_user):
    """A Host on 127.0.0.1 logging in as the test user with the test key."""

    def make(port: int, name: str = "h", user: str | None = None, key: Path | None = None, **vars) -> Host:
        return Host(name=name, groups=("ungrouped",), vars=vars, address="127.0.0.1", port=port, user=user or login_user, key_file=str(key or client_key))

    return make


@pytest.fixture
def refused_port():
    """A loopback port that refuses every connection for the whole test: bound and never listening, so no other process
    (another worker's sshd) can take it between the test choosing it and connecting, as a closed-and-forgotten port could be."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections and never says a word (a hung host)."""
    with fake_listener(None) as port:
        yield port


@contextlib.contextmanager
def fake_listener(reply: bytes | None, *, hang_up: bool = False):
    """A TCP port on loopback that is not sshd: it says ``reply`` (if any) to each connection, then hangs up
    (``hang_up``, or after a reply) or holds the connection open and silent. Stopped and closed on exit."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            if reply:
                conn.sendall(reply)
            if hang_up or reply:
                conn.close()
            else:
                held.append(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(timeout=30)
        for c in held:
            c.close()
        srv.close()


@pytest.fixture
def sudo_user(client_key):
    """A Linux user with a password and a sudoers rule that requires it; both removed afterwards."""
    name = f"gpst{secrets.token_hex(3)}"
    password = "pw-" + secrets.token_urlsafe(12)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
    sudoers = Path(f"/etc/sudoers.d/{name}")
    try:
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
        _authorize(name, client_key)
        sudoers.write_text(f"{name} ALL=(ALL) ALL\n")
        sudoers.chmod(0o440)
        yield name, password
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run(["userdel", "-r", "-f", name], check=False, capture_output=True)


class _Answer(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the path it was asked for."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = f"asked for {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def web_on_loopback():
    """An HTTP server on 127.0.0.1, the host's loopback as sshd (on this machine) sees it; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    serving.join(timeout=10)
