"""The deploy host itself: what gpurig sees of it over SSH is what the stand-ins were made to look like, and tests leave it clean."""

from __future__ import annotations

import json

import pytest

from .gpuhost import FAKE_GPUS

pytestmark = pytest.mark.integration
QUERY = "--query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id"


def test_nvidia_smi_answers_like_a_real_one_for_two_a100s(clean_deploy_host):
    host = clean_deploy_host
    out = host.sh(f"nvidia-smi {QUERY} --format=csv,noheader,nounits").stdout.splitlines()
    assert out == [f"{i}, {name}, {uuid}, {mem}, 580.95.05, {bus}" for i, name, uuid, mem, bus in FAKE_GPUS]
    with_units = host.sh(f"nvidia-smi {QUERY} --format=csv").stdout.splitlines()
    assert with_units[0] == "index, name, uuid, memory.total [MiB], driver_version, pci.bus_id"
    assert with_units[1].split(", ")[3] == "81920 MiB"
    assert host.sh("nvidia-smi -L -i 1").stdout == f"GPU 1: {FAKE_GPUS[1][1]} (UUID: {FAKE_GPUS[1][2]})\n"
    bad = host.sh("nvidia-smi --query-gpu=bogus --format=csv", check=False)
    assert (bad.returncode, bad.stdout.splitlines()[0]) == (2, 'Field "bogus" is not a valid field to query.')

    host.set_driver(None)
    gone = host.sh(f"nvidia-smi {QUERY} --format=csv,noheader,nounits", check=False)
    assert gone.returncode == 9 and "couldn't communicate with the NVIDIA driver" in gone.stdout


def test_gpurig_facts_sees_two_gpus_the_driver_and_the_nvidia_runtime(deploy_inventory, gpurig_cli, tmp_path):
    proc = gpurig_cli("facts", "--inventory", str(deploy_inventory()), "--json", str(tmp_path / "facts.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = json.loads((tmp_path / "facts.json").read_text())["hosts"][0]["data"]
    assert [(g["index"], g["uuid"], g["bus_id"]) for g in facts["gpus"]] == [(i, uuid, bus) for i, _, uuid, _, bus in FAKE_GPUS]
    assert facts["driver_version"] == "580.95.05"
    assert "nvidia" in facts["docker"]["runtimes"] and facts["docker"]["running"]


def test_a_test_leaves_no_container_behind(clean_deploy_host):
    host = clean_deploy_host
    cid = host.docker("run", "-d", "--gpus", "device=0", host.probe_image).stdout.strip()
    assert host.inspect(cid)["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["0"]
    host.clean()
    assert cid not in host.containers() and not set(host.containers()) - host.baseline
