"""Fleet delivery for real (issue 37): `gpurig deploy` to three systemd hosts with Docker, the image sent into the fleet once.

The hosts are booted and provisioned as the other deploy tests' hosts are (tests/integration/deploy/gpuhost.py), on
Docker's default bridge, where they reach each other's sshd by container address (their gpurig_delivery.address).
Their sshd also reads ~/.ssh/authorized_keys beside the kit's read-only file, so a one-time peer key can be put
there, as on a real host. The image is made here on the fly: a few MB of random layers (no host holds them), larger
for the Ctrl-C test so that the fan-out is still under way when the signal comes. What the hosts hold afterwards is
looked at through `docker exec`, not through gpurig.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from systemd_kit import SystemdHosts, authorized_keys, interrupt_when

from .conftest import DeployHost
from .cpuimages import make_project
from .gpuhost import REPO, gpurig, prepare_host
from .test_deploy import HOST_ULIMITS

KEYS_CONF = "/etc/ssh/sshd_config.d/gpurig-test.conf"
LEFTOVER_PROCESSES = "layer_cache.py|peer_tunnel.py|gpurig-peer-"


@pytest.fixture(scope="module")
def trio(docker_engine, container_kit, systemd_images, host_key, tmp_path_factory):
    """Three provisioned hosts, each with its address on the default bridge; removed at the end."""
    work = tmp_path_factory.mktemp("fanout-hosts")
    keys = authorized_keys(work / "keys", container_kit.login, host_key)
    maker = SystemdHosts(docker_engine, container_kit, systemd_images, keys, host_key)

    def boot(i: int) -> tuple[DeployHost, str]:
        host = maker.make("debian12", storage="tmpfs")
        prepare_host(host, work / f"host{i}")
        host.sh(f"sed -i 's|^AuthorizedKeysFile .*|AuthorizedKeysFile /etc/ssh/authorized_keys/%u .ssh/authorized_keys|' {KEYS_CONF}"
                " && systemctl reload ssh")
        address = docker_engine("inspect", "-f", "{{.NetworkSettings.IPAddress}}", host.cid).stdout.strip()
        return DeployHost(host), address

    try:
        with ThreadPoolExecutor(3) as pool:
            yield list(pool.map(boot, range(3)))
    finally:
        maker.remove()


def random_layer(name: str, size: int) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        payload = os.urandom(size)
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return data.getvalue()


# a root of this machine's sleep and its libraries, and a random payload
ROOT_SCRIPT = r"""
set -e
root=$(mktemp -d)
for bin in /usr/bin/sleep; do
    cp --parents "$bin" "$root"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do cp --parents -L "$lib" "$root"; done
done
head -c "$2" /dev/urandom > "$root/payload0.bin"
tar -C "$root" -c . | docker import -c 'CMD ["/usr/bin/sleep", "infinity"]' -c "LABEL $3" - "$1" >/dev/null
rm -rf "$root"
"""


def make_image(docker_engine, label: str, size: int) -> str:
    """A two-layer image of random bytes (``size`` each) that runs sleep; its name."""
    ref = f"gpurig-fanout-{uuid.uuid4().hex[:8]}:1"
    base = ref.replace(":1", ":base")
    subprocess.run(["sh", "-s", "--", base, str(size), label], input=ROOT_SCRIPT, text=True, check=True, capture_output=True)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for member, content in (("Dockerfile", f"FROM {base}\nCOPY payload1.tar /\n".encode()), ("payload1.tar", random_layer("p1", size))):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    built = subprocess.run([docker_engine.path, "build", "-q", "--label", label, "-t", ref, "-"], input=context.getvalue(), capture_output=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr.decode()[-800:]
    docker_engine("image", "rm", base, check=False)
    return ref


@pytest.fixture
def image_of(docker_engine, container_kit):
    made: list[str] = []

    def make(size: int) -> str:
        made.append(make_image(docker_engine, f"{container_kit.label}={container_kit.session}", size))
        return made[-1]

    yield make
    docker_engine("image", "rm", "-f", *made, check=False)


@pytest.fixture
def fleet_project(trio, container_kit, tmp_path):
    """write(image, delivery_of={index: gpurig_delivery}) -> (project, inventory); the hosts cleaned afterwards."""
    project = tmp_path / "project"
    make_project(project, f"gpurig-fanout-{container_kit.session[:8]}", "gpurig-fanout-unused:base", "/nonexistent")
    used: list[str] = []

    def write(image: str, delivery_of: dict | None = None) -> tuple[Path, Path]:
        used.append(image)
        hosts = {}
        for i, (h, address) in enumerate(trio):
            hosts[f"fan-{i}"] = {
                "ansible_host": "127.0.0.1", "ansible_port": h.port, "ansible_user": h.user, "ansible_ssh_private_key_file": str(h.key),
                "ansible_become": True, "gpurig_delivery": (delivery_of or {}).get(i, {"address": address, "port": 22}),
                "gpurig_containers": [{"name": "fan", "variant": "slim", "image": image, "gpus": "none",
                                       "ulimits": HOST_ULIMITS, "command": ["/usr/bin/sleep", "infinity"]}],
            }
        path = project / "inventory" / "hosts.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"all": {"children": {"fleet": {"hosts": hosts}}}}, sort_keys=False))
        return project, path

    try:
        yield write
    finally:
        for h, _ in trio:
            h.clean()
            h.docker("image", "rm", "-f", *used, check=False)


def run(project: Path, *args: str) -> subprocess.CompletedProcess:
    return gpurig(project, *args, env={"GPURIG_ROOT": str(project), "COLUMNS": "250"})


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def local_id(docker_engine, ref: str) -> str:
    return json.loads(docker_engine("image", "inspect", ref).stdout)[0]["Id"]


def peer_keys(h: DeployHost) -> list[str]:
    found = h.sh(f"cat /home/{h.user}/.ssh/authorized_keys 2>/dev/null || true").stdout
    return [line for line in found.splitlines() if "gpurig-peer-" in line]


def listening(h: DeployHost) -> set[str]:
    """The host's listening TCP sockets (address:port in /proc's hex), read from /proc: no ss or netstat needed."""
    table = h.sh("cat /proc/net/tcp /proc/net/tcp6").stdout
    return {f[1] for f in (line.split() for line in table.splitlines()[1:]) if len(f) > 3 and f[3] == "0A"}


def leftovers(trio) -> dict[str, object]:
    """What a run must not leave on any host: peer keys, cache or tunnel processes."""
    out: dict[str, object] = {}
    for h, _ in trio:
        procs = h.sh(f"pgrep -af '{LEFTOVER_PROCESSES}' | grep -v pgrep || true").stdout.strip()
        if peer_keys(h) or procs:
            out[h.name] = (peer_keys(h), procs)
    return out


def settle(trio, baseline: dict[str, set[str]], deadline_s: float = 30) -> tuple[dict, dict]:
    """(leftovers, new listening sockets), once both are empty or the deadline passed (the hosts' side ends as channels close)."""
    end = time.monotonic() + deadline_s
    while True:
        left = leftovers(trio)
        extra = {h.name: listening(h) - baseline[h.name] for h, _ in trio}
        extra = {k: v for k, v in extra.items() if v}
        if (not left and not extra) or time.monotonic() > end:
            return left, extra
        time.sleep(0.2)  # polling interval while the hosts' processes end, not a synchronisation sleep


def test_the_build_machine_sends_the_image_once_and_the_hosts_pass_it_on(trio, fleet_project, image_of, docker_engine):
    ref = image_of(3 << 20)
    project, inventory = fleet_project(ref)
    baseline = {h.name: listening(h) for h, _ in trio}
    proc = ok(run(project, "deploy", "-i", str(inventory), "-v", "--json", str(project / "deploy.json")))
    want = local_id(docker_engine, ref)
    assert [h.image_id(ref) for h, _ in trio] == [want] * 3
    doc = json.loads((project / "deploy.json").read_text())
    [fan] = doc["fan_out"]
    assert fan["hosts"]["fan-0"]["source"] == "the build machine"
    assert fan["hosts"]["fan-1"]["source"] == fan["hosts"]["fan-2"]["source"] == "fan-0"
    image_bytes = fan["hosts"]["fan-0"]["bytes"]  # what the first host's forward carried: the image, once
    assert image_bytes >= 2 * (3 << 20)
    assert fan["sent"] <= 1.1 * image_bytes and fan["sent"] <= 1.1 * fan["size"] + (64 << 10)
    assert fan["received"] >= 2.7 * image_bytes  # each host received it all
    containers = {h["host"]: h["containers"][0] for h in doc["hosts"]}
    assert containers["fan-1"]["delivery"] == "fan-out" and containers["fan-1"]["delivery_source"] == "fan-0"
    assert "(fan-out from fan-0)" in proc.stdout and "(fan-out from the build machine)" in proc.stdout
    assert "fan-1, fan-2 <- fan-0" in proc.stderr and "out of the build machine for 3 hosts" in proc.stderr
    assert settle(trio, baseline) == ({}, {})


def test_a_parent_its_children_cannot_reach_sends_them_to_the_build_machine_and_they_say_why(trio, fleet_project, image_of,
                                                                                          docker_engine):
    ref = image_of(1 << 20)
    first_address = trio[0][1]
    project, inventory = fleet_project(ref, {0: {"address": first_address, "port": 9}})  # nothing listens there
    baseline = {h.name: listening(h) for h, _ in trio}
    ok(run(project, "deploy", "-i", str(inventory), "--json", str(project / "deploy.json")))
    want = local_id(docker_engine, ref)
    assert [h.image_id(ref) for h, _ in trio] == [want] * 3
    doc = json.loads((project / "deploy.json").read_text())
    containers = {h["host"]: h["containers"][0] for h in doc["hosts"]}
    for child in ("fan-1", "fan-2"):
        assert containers[child]["delivery_source"] == "the build machine"
        note = containers[child]["delivery_note"]
        assert note.startswith(f"{child} cannot reach fan-0 at {first_address}:9: ") and note.endswith(": delivered from the build machine")
    assert settle(trio, baseline) == ({}, {})


def test_ctrl_c_mid_fan_out_leaves_no_key_no_process_and_nothing_listening(trio, fleet_project, image_of, docker_engine):
    ref = image_of(96 << 20)
    project, inventory = fleet_project(ref)
    baseline = {h.name: listening(h) for h, _ in trio}
    first = trio[0][0]
    env = {**os.environ, "HOME": str(project), "COLUMNS": "200", "PYTHONPATH": str(REPO), "GPURIG_ROOT": str(project)}
    env.pop("SSH_AUTH_SOCK", None)
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    proc = subprocess.Popen([sys.executable, "-c", code, "deploy", "-i", str(inventory)], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # mid fan-out: a child's one-time key is in the first host's authorized_keys, its link open into that host's cache
    out, err, took = interrupt_when(proc, lambda: bool(peer_keys(first)), "a peer link into the first host")
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "gpurig: interrupted", out + err
    assert took < 20, f"deploy took {took:.1f} s to end after Ctrl-C"
    assert settle(trio, baseline) == ({}, {})
    for h, _ in trio:
        names = h.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert ref not in names or h.image_id(ref) == local_id(docker_engine, ref)  # nothing half-moved carries the name
        assert not [n for n in names if n.startswith("127.0.0.1:")]
        assert not h.sh(f"ls -A /home/{h.user}/.cache/gpurig 2>/dev/null || true").stdout.strip()  # no cache's store left


def test_a_rollouts_later_batches_pull_from_the_canary_and_nothing_is_left(trio, fleet_project, docker_engine, container_kit, tmp_path):
    """`gpurig rollout --canary 1 --batch 1` over the three hosts: the canary gets the image from the build machine, the two later
    batches (one host each, each its own fleet run) pull it through the canary's layer cache, which outlives the canary's batch."""
    from .test_rollout import IMAGE_SCRIPT, PYTHON3
    from .test_rollout import gpurig as with_standin_probe

    ref = f"gpurig-fanout-roll-{uuid.uuid4().hex[:8]}:new"
    python3 = tmp_path / "python3"
    python3.write_text(PYTHON3)
    label = f"{container_kit.label}={container_kit.session}"
    subprocess.run(["sh", "-s", "--", ref, ref, label, str(python3)], input=IMAGE_SCRIPT, text=True, check=True, capture_output=True)
    try:
        project, inventory = fleet_project(ref)
        doc = yaml.safe_load(inventory.read_text())
        for host in doc["all"]["children"]["fleet"]["hosts"].values():  # a GPU container, as the rollout tests verify one
            host["gpurig_containers"][0]["gpus"] = [0]
        inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
        baseline = {h.name: listening(h) for h, _ in trio}
        proc = ok(with_standin_probe(project, "rollout", "-i", str(inventory), "-l", "fleet", "--variant", "slim", "--to", ref,
                                     "--canary", "1", "--batch", "1", "--json", "-", "-v"))
        report = json.loads(proc.stdout)
        want = local_id(docker_engine, ref)
        assert [h.image_id(ref) for h, _ in trio] == [want] * 3
        rows = {r["host"]: r for r in report["rows"]}
        assert [rows[f"fan-{i}"]["batch"] for i in range(3)] == ["canary", "1", "2"], rows
        assert all(r["why"] == "new image, verify passed" for r in rows.values()), rows
        [fan] = report["fan_out"]
        assert fan["hosts"]["fan-0"]["source"] == "the build machine"
        assert fan["hosts"]["fan-1"]["source"] == fan["hosts"]["fan-2"]["source"] == "fan-0"
        assert rows["fan-2"]["moved"].endswith("(fan-out from fan-0)") and fan["hosts"]["fan-2"]["bytes"] > 0
        assert fan["sent"] <= 1.1 * fan["hosts"]["fan-0"]["bytes"] + (64 << 10)  # the build machine sent the image once
        assert "fan-1, fan-2 <- fan-0" in proc.stderr and "out of the build machine for 3 hosts" in proc.stderr
        assert settle(trio, baseline) == ({}, {})
    finally:
        docker_engine("image", "rm", "-f", ref, check=False)
