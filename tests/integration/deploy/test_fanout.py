"""Fleet delivery for real (issue 37): `gpurig deploy` and `gpurig rollout` to four systemd hosts with Docker, the image sent into the fleet once.

The hosts (tests/integration/deploy/fanoutkit.py) are booted and provisioned as the other deploy tests' hosts are, on
Docker's default bridge, where they reach each other's sshd by container address (their gpurig_delivery.address); with
k=3 the first serves the other three. The image is made here on the fly: a few MB of random layers (no host holds them),
larger where the fan-out must still be under way when the test acts (Ctrl-C, a serving host's layer cache killed). What
the hosts hold afterwards is looked at through `docker exec`, not through gpurig.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from systemd_kit import SystemdHosts, authorized_keys, interrupt_when

from .cpuimages import make_project
from .fanoutkit import boot_hosts, listening, local_id, make_image, outer_veth, peer_keys, settle, token_bucket, wait_for, write_inventory
from .gpuhost import REPO, gpurig

CHILDREN = ("fan-1", "fan-2", "fan-3")


@pytest.fixture(scope="module")
def four(docker_engine, container_kit, gpu_hosts, host_key, tmp_path_factory):
    """Four provisioned hosts, each with its address on the default bridge; removed at the end."""
    work = tmp_path_factory.mktemp("fanout-hosts")
    keys = authorized_keys(work / "keys", container_kit.login, host_key)
    maker = SystemdHosts(docker_engine, container_kit, gpu_hosts, keys, host_key)
    try:
        yield boot_hosts(maker, 4)
    finally:
        maker.remove()


@pytest.fixture
def image_of(docker_engine, container_kit):
    made: list[str] = []

    def make(size: int) -> str:
        made.append(make_image(docker_engine, f"{container_kit.label}={container_kit.session}", size))
        return made[-1]

    yield make
    docker_engine("image", "rm", "-f", *made, check=False)


@pytest.fixture
def fleet_project(four, container_kit, tmp_path):
    """write(image, delivery_of={index: gpurig_delivery}) -> (project, inventory); the hosts cleaned afterwards."""
    project = tmp_path / "project"
    make_project(project, f"gpurig-fanout-{container_kit.session[:8]}", "gpurig-fanout-unused:base", "/nonexistent")
    used: list[str] = []

    def write(image: str, delivery_of: dict | None = None) -> tuple[Path, Path]:
        used.append(image)
        return project, write_inventory(project / "inventory" / "hosts.yaml", four, image, delivery_of)

    try:
        yield write
    finally:
        for h, _ in four:
            h.clean()
            h.docker("image", "rm", "-f", *used, check=False)


def run(project: Path, *args: str) -> subprocess.CompletedProcess:
    return gpurig(project, *args, env={"GPURIG_ROOT": str(project), "COLUMNS": "250"})


def start(project: Path, *args: str) -> subprocess.Popen:
    """`gpurig ARGS` started, as ``run`` runs it, for a test that acts while it runs."""
    env = {**os.environ, "HOME": str(project), "COLUMNS": "250", "PYTHONPATH": str(REPO), "GPURIG_ROOT": str(project)}
    env.pop("SSH_AUTH_SOCK", None)
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def clean_names(hosts, docker_engine, ref: str) -> None:
    """Nothing half-moved carries the image's name on any host, and no temporary name is left."""
    for h, _ in hosts:
        names = h.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert ref not in names or h.image_id(ref) == local_id(docker_engine, ref), h.name
        assert not [n for n in names if n.startswith("127.0.0.1:")], (h.name, names)
        assert not h.sh(f"ls -A /home/{h.user}/.cache/gpurig 2>/dev/null || true").stdout.strip()  # no cache's store left


def by_host(path: Path) -> tuple[dict, dict]:
    """--json's fan_out summary of the one image, and each host's container."""
    doc = json.loads(path.read_text())
    [fan] = doc["fan_out"]
    return fan, {h["host"]: h["containers"][0] for h in doc["hosts"]}


def test_the_build_machine_sends_the_image_once_and_the_hosts_pass_it_on(four, fleet_project, image_of, docker_engine):
    ref = image_of(3 << 20)
    project, inventory = fleet_project(ref)
    baseline = {h.name: listening(h) for h, _ in four}
    proc = ok(run(project, "deploy", "-i", str(inventory), "-v", "--json", str(project / "deploy.json")))
    want = local_id(docker_engine, ref)
    assert [h.image_id(ref) for h, _ in four] == [want] * 4
    fan, containers = by_host(project / "deploy.json")
    assert fan["hosts"]["fan-0"]["source"] == "the build machine"
    assert [fan["hosts"][c]["source"] for c in CHILDREN] == ["fan-0"] * 3
    image_bytes = fan["hosts"]["fan-0"]["bytes"]  # what the first host's forward carried: the image, once
    assert image_bytes >= 2 * (3 << 20)
    assert fan["sent"] <= 1.1 * image_bytes and fan["sent"] <= 1.1 * fan["size"] + (64 << 10)
    assert fan["received"] >= 3.6 * image_bytes  # each host received it all
    assert all(containers[c]["delivery"] == "fan-out" and containers[c]["delivery_source"] == "fan-0" for c in CHILDREN)
    assert "(fan-out from fan-0)" in proc.stdout and "(fan-out from the build machine)" in proc.stdout
    assert "fan-1, fan-2, fan-3 <- fan-0" in proc.stderr and "out of the build machine for 4 hosts" in proc.stderr
    assert settle(four, baseline) == ({}, {})


def test_a_parent_its_children_cannot_reach_sends_them_to_the_build_machine_and_they_say_why(four, fleet_project, image_of,
                                                                                          docker_engine):
    ref = image_of(1 << 20)
    first_address = four[0][1]
    project, inventory = fleet_project(ref, {0: {"address": first_address, "port": 9}})  # nothing listens there
    baseline = {h.name: listening(h) for h, _ in four}
    ok(run(project, "deploy", "-i", str(inventory), "--json", str(project / "deploy.json")))
    want = local_id(docker_engine, ref)
    assert [h.image_id(ref) for h, _ in four] == [want] * 4
    fan, containers = by_host(project / "deploy.json")
    for child in CHILDREN:
        assert containers[child]["delivery_source"] == "the build machine"
        note = containers[child]["delivery_note"]
        assert note.startswith(f"{child} cannot reach fan-0 at {first_address}:9: ") and note.endswith(": delivered from the build machine")
    assert fan["sent"] >= 3.6 * fan["hosts"]["fan-0"]["bytes"]  # the build machine sent it to each
    assert settle(four, baseline) == ({}, {})


def test_ctrl_c_mid_fan_out_leaves_no_key_no_process_and_nothing_listening(four, fleet_project, image_of, docker_engine):
    ref = image_of(96 << 20)
    project, inventory = fleet_project(ref)
    baseline = {h.name: listening(h) for h, _ in four}
    first = four[0][0]
    proc = start(project, "deploy", "-i", str(inventory))
    # mid fan-out: a child's one-time key is in the first host's authorized_keys, its link open into that host's cache
    out, err, took = interrupt_when(proc, lambda: bool(peer_keys(first)), "a peer link into the first host")
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "gpurig: interrupted", out + err
    assert took < 20, f"deploy took {took:.1f} s to end after Ctrl-C"
    assert settle(four, baseline) == ({}, {})
    clean_names(four, docker_engine, ref)


def test_a_serving_host_whose_layer_cache_dies_mid_transfer_the_hosts_it_served_finish_from_the_build_machine(
        four, fleet_project, image_of, docker_engine):
    ref = image_of(64 << 20)
    project, inventory = fleet_project(ref)
    baseline = {h.name: listening(h) for h, _ in four}
    first = four[0][0]
    # what the first host receives comes at 100 Mbit/s, so its cache, and the children behind it, are mid-transfer for seconds
    with token_bucket(outer_veth(first), "100mbit") as received:
        proc = start(project, "deploy", "-i", str(inventory), "--json", str(project / "deploy.json"))
        try:
            # every child's link is open into the first host's cache, and layers are flowing (the image is 128 MB)
            wait_for(lambda: len(peer_keys(first)) == 3 and received() > 16 << 20, "three links and 16 MB into the first host", proc)
            killed = first.sh("pkill -KILL -e -f '^python3 -c .*layer_cache.py'").stdout
            out, err = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
    assert "killed" in killed and proc.returncode == 0, f"exited {proc.returncode}:\n{out[-4000:]}\n{err[-4000:]}"
    want = local_id(docker_engine, ref)
    assert [h.image_id(ref) for h, _ in four] == [want] * 4
    fan, containers = by_host(project / "deploy.json")
    own = containers["fan-0"]["delivery_note"]  # the serving host itself pulled again, straight from the build machine
    assert containers["fan-0"]["delivery_source"] == "the build machine", containers["fan-0"]
    # ended when the cache's channel did, not after the engine's download retries (about 50 s)
    assert own == ("fan-0 could not pull from the build machine through its own layer cache: pulling from the build machine "
                   "through its own layer cache failed: the layer cache on fan-0 ended before its pulls did (its process ended, or the "
                   "connection to the host dropped): delivered from the build machine"), own
    for child in CHILDREN:  # each was pulling through it: it finished from the build machine, and says why
        note = containers[child]["delivery_note"]
        assert containers[child]["delivery_source"] == "the build machine", containers[child]
        assert note.startswith(f"{child} could not pull from fan-0's layer cache: pulling from fan-0's layer cache failed: "), note
        assert note.endswith(": delivered from the build machine"), note
    assert fan["sent"] >= 2 * fan["size"]  # the children's layers came from the build machine after all (what they lacked)
    assert settle(four, baseline) == ({}, {})
    clean_names(four, docker_engine, ref)


def test_a_rollouts_later_batches_pull_from_the_canary_and_nothing_is_left(four, fleet_project, docker_engine, container_kit, tmp_path):
    """`gpurig rollout --canary 1 --batch 2` over the four hosts: the canary gets the image from the build machine, the two later
    batches (two hosts, then one; each its own fleet run) pull it through the canary's layer cache, which outlives the canary's batch."""
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
        baseline = {h.name: listening(h) for h, _ in four}
        proc = ok(with_standin_probe(project, "rollout", "-i", str(inventory), "-l", "fleet", "--variant", "slim", "--to", ref,
                                     "--canary", "1", "--batch", "2", "--json", "-", "-v"))
        report = json.loads(proc.stdout)
        want = local_id(docker_engine, ref)
        assert [h.image_id(ref) for h, _ in four] == [want] * 4
        rows = {r["host"]: r for r in report["rows"]}
        assert [rows[f"fan-{i}"]["batch"] for i in range(4)] == ["canary", "1", "1", "2"], rows
        assert all(r["why"] == "new image, verify passed" for r in rows.values()), rows
        [fan] = report["fan_out"]
        assert fan["hosts"]["fan-0"]["source"] == "the build machine"
        assert [fan["hosts"][c]["source"] for c in CHILDREN] == ["fan-0"] * 3  # fan-3, in the last batch, too
        assert rows["fan-3"]["moved"].endswith("(fan-out from fan-0)") and fan["hosts"]["fan-3"]["bytes"] > 0
        assert fan["sent"] <= 1.1 * fan["hosts"]["fan-0"]["bytes"] + (64 << 10)  # the build machine sent the image once
        assert "fan-1, fan-2, fan-3 <- fan-0" in proc.stderr and "out of the build machine for 4 hosts" in proc.stderr
        assert settle(four, baseline) == ({}, {})
    finally:
        docker_engine("image", "rm", "-f", ref, check=False)
