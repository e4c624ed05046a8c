"""Image delivery onto the deploy host over real SSH: present, forward (only missing layers), save-load, resume.

The CPU images (about 1.1 GB each) are built once per session; the host's
own Docker engine is looked at through `docker exec`, not through gpurig.
Every test sets the host's images to what it needs first, so the tests do
not depend on each other's order.
"""

from __future__ import annotations

import json
import tarfile
import time
import types
from pathlib import Path

import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.engineopen import local_engine, open_engine
from gpurig.connect.ssh import SSHSettings
from gpurig.deploy.delivery import DeliveryInterrupted, deliver
from gpurig.inventory import load_inventory

from .gpuhost import bare, host_images

pytestmark = pytest.mark.integration
MB = 1024 * 1024


@pytest.fixture(scope="module")
def registry_cache(xdg_cache_home) -> Path:
    """The local registry's storage: the one every gpurig of this worker uses (tests/integration/conftest.py), where layers
    pushed by one test are there for the next, as in ~/.cache."""
    return xdg_cache_home / "gpurig" / "registry"


class Link:
    """The build machine's engine, the host's engine over SSH, and deliver() between them."""

    def __init__(self, inventory: Path, known_hosts: Path, cache: Path) -> None:
        host = next(iter(load_inventory(inventory).hosts.values()))
        settings = SSHSettings(project_known_hosts=known_hosts, user_known_hosts=None, ssh_config=None,
                               allow_agent=False, look_for_keys=False)
        self.connector = Connector(settings)
        self.conn = self.connector.open(host)
        self.local = local_engine()
        self.remote = open_engine(self.conn)
        self.cache = cache
        self.seen: list[tuple[int, int]] = []

    def deliver(self, ref: str, **kw):
        self.seen = []
        kw.setdefault("progress", lambda done, total: self.seen.append((done, total)))
        return deliver(self.local, self.remote, self.conn, ref, cache_dir=self.cache, **kw)

    def size(self, ref: str) -> int:
        return self.local.image(ref).size

    def close(self) -> None:
        self.remote.close()
        self.local.close()
        self.conn.close()
        self.connector.close()


@pytest.fixture
def link(deploy_inventory, tmp_path, registry_cache):
    made = Link(deploy_inventory(), tmp_path / "known_hosts", registry_cache)
    try:
        yield made
    finally:
        made.close()


def test_forward_moves_the_compressed_image_once_then_it_is_present(link, clean_deploy_host, cpu_images):
    host, slim = clean_deploy_host, cpu_images["slim"]
    bare(host)
    first = link.deliver(slim)
    want = link.local.image(slim).id
    assert (first.method, first.image_id, first.note) == ("forward", want, "")
    assert host.image_id(slim) == want  # the same image, not a rebuild
    assert 0.1 * link.size(slim) < first.bytes_moved < 0.6 * link.size(slim)  # compressed layers, not the 1.1 GB tar
    assert link.seen and link.seen[-1][0] == link.seen[-1][1] > 0.9 * first.bytes_moved
    assert not [t for t in host_images(host) if t.startswith("127.0.0.1:")]  # no temporary or stage name left

    again = link.deliver(slim)
    assert (again.method, again.bytes_moved, again.image_id) == ("present", 0, want)


def test_redeploy_after_a_one_file_checks_edit_moves_under_one_percent(link, clean_deploy_host, cpu_images, tmp_path):
    host, slim = clean_deploy_host, cpu_images["slim"]
    if host.image_id(slim) is None:
        link.deliver(slim)
    project = cpu_images.copy_project(tmp_path / "edited", f"{cpu_images.spec_name}-edit")
    probe = project / "checks" / "verify_torch.py"
    probe.write_text(probe.read_text() + "\n# edited for the redeploy test\n")
    edited = cpu_images.build(project, "slim")

    moved = link.deliver(edited)
    assert moved.method == "forward" and host.image_id(edited) == link.local.image(edited).id
    assert moved.bytes_moved < 0.01 * link.size(edited), f"{moved.bytes_moved} bytes of {link.size(edited)}"
    tail = host.docker("run", "--rm", "--entrypoint", "tail", edited, "-n", "1", "/opt/gpurig/checks/verify_torch.py").stdout
    assert tail.strip() == "# edited for the redeploy test"


def test_jupyter_onto_a_host_with_slim_moves_under_five_percent(link, clean_deploy_host, cpu_images):
    host, slim, jupyter = clean_deploy_host, cpu_images["slim"], cpu_images["jupyter"]
    host.docker("image", "rm", "-f", jupyter, check=False)  # its own layers go with it (no other image here is built on them)
    if host.image_id(slim) != link.local.image(slim).id:
        link.deliver(slim)
    moved = link.deliver(jupyter)
    assert moved.method == "forward" and host.image_id(jupyter) == link.local.image(jupyter).id
    # its own layers moved (about 58 MB compressed), and only those
    assert 0.01 * link.size(jupyter) < moved.bytes_moved < 0.05 * link.size(jupyter), f"{moved.bytes_moved} bytes of {link.size(jupyter)}"


def test_without_a_registry_binary_save_load_moves_the_whole_image_and_says_why(link, clean_deploy_host, cpu_images, monkeypatch):
    host, ssh = clean_deploy_host, cpu_images["ssh"]
    bare(host)
    monkeypatch.setenv("PATH", "/nonexistent")  # no docker-registry to be found; the engines are reached by socket and SSH
    moved = link.deliver(ssh)
    assert moved.method == "save-load" and host.image_id(ssh) == link.local.image(ssh).id
    assert "no docker-registry on this machine" in moved.note and "docker-registry package" in moved.note
    assert moved.bytes_moved >= 0.95 * link.size(ssh)  # the whole uncompressed tar crossed
    assert link.seen[-1][0] == moved.bytes_moved


class Interrupt(KeyboardInterrupt):
    pass


def test_an_interrupted_forward_leaves_no_tag_and_the_retry_moves_only_what_is_missing(link, clean_deploy_host, cpu_images):
    host, slim = clean_deploy_host, cpu_images["slim"]
    want = link.local.image(slim).id
    bare(host)
    full = link.deliver(slim).bytes_moved  # the compressed image's bytes (the progress's total grows as layers are announced)
    bare(host)

    def stop_midway(done: int, total: int) -> None:
        if done > 0.6 * full:
            raise Interrupt  # as Ctrl-C would, on the thread that runs the delivery
    with pytest.raises(Interrupt):
        link.deliver(slim, progress=stop_midway)
    names = host_images(host)
    assert slim not in names and want not in names.values()  # a half-moved image never carries its name
    kept = [n for n in names if ":gpurig-stage-" in n]
    assert kept, f"no completed stage kept its layers: {names}"

    retry = link.deliver(slim)
    assert retry.method == "forward" and host.image_id(slim) == want
    assert retry.bytes_moved < full - 20 * MB, f"the retry moved {retry.bytes_moved} of {full} bytes again (stages kept: {kept})"
    assert not [t for t in host_images(host) if t.startswith("127.0.0.1:")]
    built = json.loads(host.host.docker("image", "inspect", slim).stdout)[0]  # this machine's engine, by its CLI
    assert host.inspect(slim)["RootFS"]["Layers"] == built["RootFS"]["Layers"]


@pytest.fixture
def spec_registry(clean_deploy_host, tmp_path):
    """A registry the host reaches as <bridge gateway>:<port> (dockerd told it is insecure), this machine as 127.0.0.1:<port>.

    docker-registry listens on this machine's loopback (where the local engine pushes: loopback needs no TLS);
    a pump from gpurig's forward code listens on the Docker bridge's gateway address, which the host
    container reaches, and the host's daemon.json names that address in insecure-registries. Tests ask for it
    before ``link``: it restarts the host's dockerd, which ends the engine streams a link already holds.
    """
    import shutil
    import socket
    import subprocess
    import threading
    import time
    import urllib.request

    from gpurig.connect.forward import Meter, pump
    from gpurig.deploy.registry import CONFIG

    host = clean_deploy_host
    binary = shutil.which("docker-registry")
    if not binary:
        pytest.skip("docker-registry is not installed")
    gateway = host.host.docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.Gateway}}{{end}}", host.cid).stdout.strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(CONFIG.format(root=json.dumps(str(tmp_path / "data")), port=port, secret="test"))
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listener = socket.create_server((gateway, 0))
    outside = f"{gateway}:{listener.getsockname()[1]}"
    stop = threading.Event()

    class Chan:  # a socket with the channel calls pump makes
        def __init__(self, sock):
            self.sock, self.recv, self.sendall, self.close = sock, sock.recv, sock.sendall, sock.close

        def shutdown_write(self):
            self.sock.shutdown(socket.SHUT_WR)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            inner = socket.create_connection(("127.0.0.1", port))
            threading.Thread(target=pump, args=(Chan(conn), inner, Meter(), stop), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    daemon_json = host.read("/etc/docker/daemon.json") or "{}"
    doc = json.loads(daemon_json)
    doc["insecure-registries"] = [outside]
    host.write("/etc/docker/daemon.json", json.dumps(doc, indent=4) + "\n")
    from .gpuhost import restart_docker

    restart_docker(host.host)
    end = time.monotonic() + 20
    while True:  # the gateway address is this machine's own: asked from here, the answer comes through the pump
        try:
            with urllib.request.urlopen(f"http://{outside}/v2/", timeout=2):
                break
        except OSError:
            assert proc.poll() is None and time.monotonic() < end, "the test registry did not answer"
            time.sleep(0.1)  # polling interval while the registry starts
    try:
        yield types.SimpleNamespace(inside=f"127.0.0.1:{port}", outside=outside)
    finally:
        stop.set()
        listener.close()
        proc.terminate()
        proc.wait(timeout=10)
        host.write("/etc/docker/daemon.json", daemon_json)
        restart_docker(host.host)


def push(link, ref: str, registry: str) -> None:
    """``ref`` pushed to ``registry`` under its own repository and tag, by the local engine."""
    link.local.tag(ref, f"{registry}/{ref}")
    link.local.push(f"{registry}/{ref}")
    link.local.untag(f"{registry}/{ref}")


def test_the_host_pulls_from_the_specs_registry_when_it_holds_the_built_image(spec_registry, link, clean_deploy_host, cpu_images):
    host, slim = clean_deploy_host, cpu_images["slim"]
    bare(host)
    push(link, slim, spec_registry.inside)
    pulled = link.deliver(slim, registry=spec_registry.outside)
    assert (pulled.method, pulled.note) == ("pull", "") and host.image_id(slim) == link.local.image(slim).id
    assert 0.1 * link.size(slim) < pulled.bytes_moved < 0.6 * link.size(slim)  # the compressed layers the host downloaded


def test_a_registry_holding_another_image_under_the_name_is_passed_over(spec_registry, link, clean_deploy_host, cpu_images,
                                                                         docker_engine, tmp_path):
    host, slim = clean_deploy_host, cpu_images["slim"]
    bare(host)
    stale = f"{spec_registry.inside}/{slim}"
    with tarfile.open(tmp_path / "stale.tar", "w") as tar:  # a stale push: another image (one small file) under slim's name
        tar.add(__file__, arcname="stale")
    docker_engine("import", str(tmp_path / "stale.tar"), stale)
    link.local.push(stale)
    link.local.untag(stale)
    moved = link.deliver(slim, registry=spec_registry.outside)
    assert moved.method == "forward" and host.image_id(slim) == link.local.image(slim).id
    assert "holds another image" in moved.note and "push it again" in moved.note
    assert not [t for t in host_images(host) if t.startswith(spec_registry.outside)]  # the stale pull is not left behind


@pytest.mark.parametrize("method", ["forward", "save-load"])
def test_an_interrupt_mid_transfer_stops_it_within_seconds_and_names_nothing(link, clean_deploy_host, cpu_images, method):
    host, slim = clean_deploy_host, cpu_images["slim"]
    want = link.local.image(slim).id
    bare(host)
    interrupted: list[float] = []

    def interrupt_midway(done: int, total: int) -> None:
        if not interrupted and done > 0.3 * total:
            interrupted.append(time.monotonic())
            link.conn.interrupt()  # what the fleet does on Ctrl-C or SIGTERM, from another thread there

    with pytest.raises(DeliveryInterrupted, match="interrupted during the image's delivery"):
        link.deliver(slim, methods=(method,), progress=interrupt_midway)
    assert interrupted and time.monotonic() - interrupted[0] < 5
    names = host_images(host)
    assert slim not in names and want not in names.values()  # a half-moved image never carries its name
