"""The GPU-host traps (issue 19) from recorded facts: parsers fail closed, the steps' other paths, verify's records.

The recordings are tests/fixtures/facts (Ubuntu 22.04/24.04 GPU hosts written
in the tools' real formats, Debian 12/13 recorded); a variant of a recording
(Docker on the systemd driver without nvidia-ctk, another fabric manager) is
that recording with one fact replaced, as a host in that state would print.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from fakes import ScriptedConnection

from gpurig.errors import InventoryError
from gpurig.facts import parse_facts
from gpurig.facts.gpuhost import (
    parse_dev_char,
    parse_fabric,
    parse_gpu_modes,
    parse_held,
    parse_mig_devices,
    parse_upgrades,
)
from gpurig.facts.probes import Section
from gpurig.facts.system import parse_packages
from gpurig.inventory import Host
from gpurig.inventory.profile import host_profile
from gpurig.steps import STEPS
from gpurig.verify.runner import VerifyPlan, verify_host
from gpurig.verify.traps import TRAPS, trap_records

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def facts_of(name: str):
    return parse_facts((FIXTURES / f"{name}.txt").read_text())


def plan(step: str, facts, wanted=None):
    return STEPS[step]().plan(facts, host_profile(Host("h", (), wanted or {})))


# ---- parsers fail closed: no end line, a missing command, a failed command give "not known", never "nothing wrong" ----

@pytest.mark.parametrize("parse", [parse_dev_char, parse_fabric, parse_upgrades])
def test_a_probe_cut_short_or_failed_is_not_known(parse):
    assert parse(Section(0, "node /dev/nvidia0")) is None  # no end line: cut short
    assert parse(Section(127, "sh: 1: find: not found\nend")) is None
    assert parse(Section(0, "end")) is not None  # ran, found nothing: an answer


def test_nvidia_smi_failing_leaves_modes_unknown():
    mismatch = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.90"
    assert parse_gpu_modes(Section(18, mismatch)) is None
    assert parse_gpu_modes(Section(0, "")) is None  # no row is no answer
    assert parse_held(Section(127, "sh: 1: apt-mark: not found")) is None


def test_recorded_modes_and_mig_devices():
    facts = facts_of("a100-driver550-open-docker-stopped")
    modes = facts.gpuhost.gpu_modes
    assert len(modes) == 8 and modes[0].mig and modes[0].mig_pending and not modes[1].mig and modes[0].persistence is False
    assert [d.uuid for d in facts.gpuhost.mig_devices] == ["MIG-4f3c2a1b-7e6d-5c4b-9a8f-0e1d2c3b4a50", "MIG-9b8a7c6d-1e2f-4a3b-8c7d-6e5f4a3b2c10"]
    assert parse_mig_devices(Section(0, "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\n  MIG 1g.5gb      Device  0: (UUID: MIG-a/1/0)\n"))[0].gpu == 0


def test_a_held_package_is_still_installed():
    """dpkg-query says 'hi ' for a package apt-mark held (found on the systemd hosts: the hold step's second run saw no driver)."""
    installed, broken = parse_packages(Section(0, "libnvidia-compute-550-server\thi \t550.54.15-0ubuntu1\nnvidia-persistenced\tun \t"))
    assert installed == {"libnvidia-compute-550-server": "550.54.15-0ubuntu1"} and broken == ()


def test_unattended_upgrades_policy_from_apt_config_dump():
    dump = ('APT::Periodic::Unattended-Upgrade "1";\nUnattended-Upgrade::Allowed-Origins "";\n'
            'Unattended-Upgrade::Allowed-Origins:: "${distro_id}:${distro_codename}-security";\n'
            'Unattended-Upgrade::Package-Blacklist "";\nUnattended-Upgrade::Package-Blacklist:: "nvidia-";\nend')
    policy = parse_upgrades(Section(0, dump))
    assert policy.enabled and policy.origins == ("${distro_id}:${distro_codename}-security",)
    assert policy.blacklisted("nvidia-driver-550-server") and not policy.blacklisted("libnvidia-compute-550-server")


def test_fabric_of_a_dgx_h100():
    fabric = facts_of("h100-driver535-docker-nvidia").gpuhost.fabric
    assert len(fabric.nvswitches) == 4 and set(fabric.states) == {"Completed"}


def test_docker_cgroup_driver_running_stopped_and_absent():
    assert facts_of("h100-driver535-docker-nvidia").cgroup_driver == "systemd"  # docker info
    assert facts_of("debian12-systemd-docker").cgroup_driver == "cgroupfs"
    assert facts_of("a100-driver550-open-docker-stopped").cgroup_driver == "systemd"  # stopped, cgroup v2: dockerd's default
    assert facts_of("debian12-systemd-fresh").cgroup_driver is None  # no Docker


# ---- steps: the paths the recordings do not show as they are ----

def test_without_nvidia_ctk_docker_is_set_to_cgroupfs_keeping_other_exec_opts():
    h100 = facts_of("h100-driver535-docker-nvidia")
    daemon = dataclasses.replace(h100.daemon_json, content={**h100.daemon_json.content, "exec-opts": ["native.cgroupdriver=systemd", "isolation=default"]})
    facts = dataclasses.replace(h100, toolkit_version=None, daemon_json=daemon)
    p = plan("gpu-devices", facts)
    assert p.status == "changed" and "nvidia-ctk is not installed" in p.reason and "cgroupfs driver instead" in p.reason
    assert json.loads(p.changes[0].content)["exec-opts"] == ["isolation=default", "native.cgroupdriver=cgroupfs"]
    assert p.changes[1].summary.startswith("restart Docker")
    asked = plan("gpu-devices", facts, {"gpurig_daemon": {"exec-opts": ["native.cgroupdriver=systemd"]}})
    assert asked.status == "failed" and "gpurig_daemon.exec-opts" in asked.fix


def test_a_fabric_manager_of_another_version_is_refused_with_both_numbers():
    h100 = facts_of("h100-driver535-docker-nvidia")
    installed = {**h100.system.installed, "nvidia-fabricmanager-535": "535.104.05-0ubuntu1"}
    p = plan("fabric-manager", dataclasses.replace(h100, system=dataclasses.replace(h100.system, installed=installed)))
    assert p.status == "failed" and "535.104.05-0ubuntu1" in p.reason and "535.161.08" in p.reason
    assert "nvidia-fabricmanager-535=535.161.08-*" in p.fix


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_new_inventory_keys_are_strict(value):
    for key in ({"gpurig_driver": {"auto_upgrade": value}}, {"gpurig_gpus": {"mig": value}}):
        with pytest.raises(InventoryError) as caught:
            host_profile(Host("h", (), key))
        assert "must be true or false" in caught.value.problem


# ---- verify: one record per trap with its catalogue fix ----

def test_verify_names_each_trap_with_its_fix():
    by_id = {r.id: r for r in trap_records(facts_of("h100-driver535-docker-nvidia"))}
    assert by_id["host.daemon_reload"].status == "fail" and "create-dev-char-symlinks" in by_id["host.daemon_reload"].fix
    assert by_id["host.fabric_manager"].status == "pass"
    by_id = {r.id: r for r in trap_records(facts_of("h100-ubuntu2404-driver550-nvswitch"))}
    assert by_id["host.fabric_manager"].status == "fail" and by_id["host.fabric_manager"].fix == TRAPS["host.fabric_manager"].fix
    assert by_id["host.daemon_reload"].status == "pass"
    mismatch = {r.id: r for r in trap_records(facts_of("a100-driver-mismatch"))}
    libraries = mismatch["host.driver_libraries"]
    assert libraries.status == "fail" and "550.90.07 is newer than the loaded kernel module 550.54.15" in libraries.detail
    assert mismatch["host.mig"].status == "fail"  # nvidia-smi refused: MIG not known is not a pass


def test_verify_mig_against_the_inventory():
    a100 = facts_of("a100-driver550-open-docker-stopped")
    unasked = next(r for r in trap_records(a100) if r.id == "host.mig")
    refused = next(r for r in trap_records(a100, False) if r.id == "host.mig")
    wanted = next(r for r in trap_records(a100, True) if r.id == "host.mig")
    assert unasked.status == "warn" and "does not ask for MIG" in unasked.detail and "2 MIG devices" in unasked.detail
    assert refused.status == "fail" and wanted.status == "fail" and "MIG is off on GPU 1, 2" in wanted.detail


def test_verify_a_pending_reboot_with_equal_versions_is_a_warning():
    h100 = facts_of("h100-driver535-docker-nvidia")
    facts = dataclasses.replace(h100, system=dataclasses.replace(h100.system, reboot_required=True))
    record = next(r for r in trap_records(facts) if r.id == "host.driver_libraries")
    assert record.status == "warn" and "reboot is pending" in record.detail


def test_a_cpu_host_skips_every_trap():
    assert {r.status for r in trap_records(facts_of("debian13-systemd-docker"))} == {"skip"}


@pytest.mark.parametrize(("on_pci", "rounds"), [(0, 1), (2, 2), (None, 2)])
def test_verify_asks_for_the_traps_facts_only_where_the_probe_did_not_count_zero_gpus(on_pci, rounds):
    """No NVIDIA GPU on the PCI bus: the traps' records skip without the second round trip (it doubled verify's time
    on 20 GPU-less hosts); a GPU counted, or a count not known, still asks."""
    probe_doc = json.dumps({"probe": "host", "version": 1, "nvidia_gpus_on_pci": on_pci,
                            "records": [{"id": "host.driver", "status": "fail", "detail": "no driver"}]})
    recorded = (FIXTURES / "debian13-systemd-docker.txt").read_text()
    conn = ScriptedConnection("h", lambda line: (0, recorded, "") if "@@gpurig-fact" in line else (0, probe_doc, ""))
    verdict = verify_host(conn, dataclasses.replace(VerifyPlan.from_checks(), traps=True))
    assert len(conn.lines) == rounds
    traps = [r for r in verdict.records if r.id in TRAPS]
    assert traps and {r.status for r in traps} == {"skip"}  # this recorded host has no GPU either way
