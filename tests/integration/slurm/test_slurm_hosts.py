"""The Slurm hosts fixture keeps its promises: names, one network, SSH as the sudo user, stand-in GPUs on the nodes.

Only what tests/integration/slurm_kit.py promises is checked here, not Slurm
(the Slurm tests provision these hosts with gpurig). The hosts are looked at
through SSH as gpurig reaches them and through `docker exec`.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from deploy.gpuhost import FAKE_GPUS, PROVISION_VARS, gpurig
from slurm_kit import CONTROLLER_GROUP, DEVICES, JOB_IMAGE, NODES_GROUP

PROBE = Path(__file__).resolve().parents[3] / "checks" / "verify_host.py"


def addresses(docker, cluster) -> dict[str, str]:
    """Each host's address on the cluster's network, as Docker gave it."""
    fmt = "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}} {{end}}"
    found = {}
    for host in cluster.hosts:
        nets = dict(pair.split("=") for pair in docker("inspect", "-f", fmt, host.cid).stdout.split())
        assert list(nets) == [cluster.network], nets  # on the cluster's network only, not the default bridge
        found[host.name] = nets[cluster.network]
    return found


def test_each_hostname_is_its_unique_name_and_the_hosts_resolve_each_other(slurm_hosts, docker_engine):
    cluster = slurm_hosts
    names = cluster.names
    assert len(set(names)) == 3 and all(n.startswith("gpurig-slurm-") for n in names)
    assert names[0].endswith("-ctl") and [n[-3:] for n in names[1:]] == ["-n1", "-n2"]
    where = addresses(docker_engine, cluster)
    for host in cluster.hosts:
        assert cluster.ssh(host, "hostname").stdout.strip() == host.name
        assert cluster.ssh(host, "sudo -n id -u").stdout.strip() == "0"  # the sudo user, passwordless
        for other in names:
            found = cluster.ssh(host, f"getent hosts {other}").stdout.split()
            assert found[:2] == [where[other], other], (host.name, other, found)


def test_nodes_have_two_standin_gpus_and_the_controller_none(slurm_hosts):
    cluster = slurm_hosts
    listing = "".join(f"GPU {i}: {name} (UUID: {uuid})\n" for i, name, uuid, _, _ in FAKE_GPUS)
    for node in cluster.nodes:
        for name, major, minor in DEVICES:
            assert cluster.ssh(node, f"stat -c '%F %Hr:%Lr' /dev/{name}").stdout.strip() == f"character special file {major}:{minor}"
        assert cluster.ssh(node, "nvidia-smi -L").stdout == listing
        assert cluster.ssh(node, "nvidia-smi -L | grep -c A100").stdout.strip() == "2"
    ctl = cluster.controller
    assert cluster.ssh(ctl, "ls /dev/nvidia0 /dev/nvidiactl; command -v nvidia-smi", check=False).returncode != 0


def test_the_inventory_gives_gpurig_the_groups_and_it_sees_two_a100s_per_node(slurm_hosts, tmp_path):
    cluster = slurm_hosts
    inventory = cluster.write(tmp_path / "inventory" / "hosts.yaml", {"gpurig_shm_size": "8g"})
    doc = yaml.safe_load(inventory.read_text())["all"]
    assert doc["vars"]["ansible_become"] is True and doc["vars"]["gpurig_shm_size"] == "8g"
    assert list(doc["children"][CONTROLLER_GROUP]["hosts"]) == [cluster.controller.name]
    assert list(doc["children"][NODES_GROUP]["hosts"]) == [n.name for n in cluster.nodes]
    proc = gpurig(tmp_path, "facts", "--inventory", str(inventory), "--json", "facts.json")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: the verdict says what the hosts lack (Docker)
    facts = {h["host"]: h["data"] for h in json.loads((tmp_path / "facts.json").read_text())["hosts"]}
    assert set(facts) == set(cluster.names)
    for node in cluster.nodes:
        assert [(g["index"], g["uuid"]) for g in facts[node.name]["gpus"]] == [(i, uuid) for i, _, uuid, _, _ in FAKE_GPUS]
        assert all("A100" in g["name"] for g in facts[node.name]["gpus"])
    assert facts[cluster.controller.name]["gpus"] == []


def test_provisioned_nodes_run_the_job_image_and_the_replayed_probe(slurm_hosts, tmp_path):
    cluster = slurm_hosts
    inventory = cluster.write(tmp_path / "hosts.yaml", PROVISION_VARS)
    proc = gpurig(tmp_path, "provision", "--inventory", str(inventory), "--group", NODES_GROUP, "--only", "docker,python3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert cluster.make_job_image() == JOB_IMAGE
    for node in cluster.nodes:
        run = cluster.ssh(node, f"docker run --rm {JOB_IMAGE} sh -c 'echo job on $(cat /etc/hostname)'")
        assert run.stdout == f"job on {run.stdout.split()[-1]}\n" and len(run.stdout.split()[-1]) == 12  # a container's id
    assert cluster.ssh(cluster.controller, "command -v docker", check=False).returncode != 0  # only the nodes were asked

    def probe(node) -> dict[str, str]:
        proc = cluster.ssh(node, "xargs -a /etc/gpurig/slurm-health.args python3 - --json --expect-gpus 2 --expect-model A100",
                           input=PROBE.read_text())
        return {r["id"]: r["status"] for r in json.loads(proc.stdout)["records"]}

    node = cluster.nodes[0]
    cluster.replay_probe(node)
    passing = probe(node)
    assert passing["host.gpu_count"] == passing["host.gpu_model"] == passing["host.xid"] == "pass" and "fail" not in passing.values()
    assert {"host.gpu0.temperature", "host.gpu1.temperature"} <= set(passing)
    cluster.replay_probe(node, "dmesg-xid.txt")
    assert [k for k, v in probe(node).items() if v == "fail"] == ["host.xid"]
    cluster.replay_probe(node, smi="nvidia-smi-no-driver.txt")
    assert probe(node)["host.driver"] == "fail"


def test_a_restarted_node_has_its_devices_again(slurm_hosts):
    cluster = slurm_hosts
    node = cluster.nodes[1]
    node.sh("rm /dev/nvidia1")
    cluster.make_devices(node)
    assert node.sh("stat -c '%Hr:%Lr' /dev/nvidia1").stdout.strip() == "195:1"
    fresh = cluster.restart(node)
    assert cluster.nodes[1] is fresh and fresh.name == node.name
    assert cluster.ssh(fresh, "hostname").stdout.strip() == node.name
    for name, major, minor in DEVICES:
        assert fresh.sh(f"stat -c '%Hr:%Lr' /dev/{name}").stdout.strip() == f"{major}:{minor}"
    assert cluster.ssh(cluster.controller, f"getent hosts {fresh.name}").returncode == 0
