"""Inventories as Ansible reads them (ansible-inventory 2.19): another connection plugin's host loads, and is refused
only where a task that connects targets it; a vault-encrypted vars file is said to be one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.connect.target import TargetError, resolve_target
from gpurig.errors import InventoryError
from gpurig.inventory import load_inventory

ROOT = Path(__file__).resolve().parents[2]
MIXED = "all:\n  hosts:\n    win-01: {ansible_connection: winrm}\n    gpu-01: {ansible_host: 127.0.0.1, ansible_port: 1}\n"


def gpurig(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)


@pytest.mark.parametrize("plugin", ["winrm", "network_cli", "docker", "community.docker.docker", "my_plugin"])
def test_a_host_of_another_connection_plugin_loads_and_is_refused_when_connected_to(tmp_path, plugin):
    path = tmp_path / "hosts.yaml"
    path.write_text(MIXED.replace("winrm", plugin))
    inventory = load_inventory(path)
    assert [h.name for h in inventory.select("all")] == ["win-01", "gpu-01"]
    with pytest.raises(TargetError, match=f"win-01: ansible_connection '{plugin}' is not one gpurig drives"):
        resolve_target(inventory.select("win-01")[0], None)


def test_the_other_hosts_stay_usable_and_the_listing_shows_every_host(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text(MIXED)
    listed = gpurig(tmp_path, "hosts", "--inventory", str(path))
    assert listed.returncode == 0 and "win-01" in listed.stdout and "winrm" in listed.stdout, listed.stderr
    assert gpurig(tmp_path, "inventory", "--list", "--inventory", str(path)).returncode == 0
    targeted = gpurig(tmp_path, "facts", "--inventory", str(path), "-l", "win-01")
    lines = targeted.stderr.strip().splitlines()
    assert targeted.returncode != 0 and len(lines) == 1, targeted.stderr
    assert f"{path}: host win-01: ansible_connection 'winrm' is not one gpurig drives" in lines[0]
    assert "use ssh, paramiko, paramiko_ssh, smart or local, or leave the host out with --limit '!win-01'" in lines[0]
    other = gpurig(tmp_path, "facts", "--inventory", str(path), "-l", "gpu-01")
    assert "winrm" not in other.stderr + other.stdout  # refused for its own reason (nothing listens on port 1), not win-01's


@pytest.mark.parametrize("name", ["ssh", "paramiko", "paramiko_ssh", "smart"])
def test_every_name_of_ssh_ansible_knows_is_ssh(tmp_path, name):
    path = tmp_path / "hosts.yaml"
    path.write_text(f"all:\n  hosts:\n    a: {{ansible_connection: {name}}}\n")
    assert load_inventory(path).select("a")[0].connection == "ssh"


def test_a_quoted_number_is_a_host_name_and_a_bare_one_is_refused_as_ansible_does(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("all:\n  hosts:\n    '1234': {}\n")
    assert [h.name for h in load_inventory(path).select("all")] == ["1234"]
    path.write_text("all:\n  hosts:\n    1234: {}\n")
    with pytest.raises(InventoryError, match=r"all\.hosts\.1234: is not a host name: a host name must be a string; fix: enclose it in quotes"):
        load_inventory(path)


VAULT = "$ANSIBLE_VAULT;1.1;AES256\n62313365396662343061393464336163383764373764613633653634306231386433626436623361\n"


def test_a_vault_encrypted_vars_file_is_said_to_be_one(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("all:\n  hosts:\n    a: {}\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(VAULT)
    with pytest.raises(InventoryError, match="all.yml: is vault-encrypted; gpurig does not decrypt vaults"):
        load_inventory(path)
    path.write_text(VAULT)
    with pytest.raises(InventoryError, match="hosts.yaml: is vault-encrypted"):
        load_inventory(path)


@pytest.mark.parametrize("args", ["-J bastion$(id)", "-o ProxyJump=ops@jump`id`:22", "-J ok.example.com,-oProxyCommand=x"])
def test_a_hostile_jump_host_is_refused_at_load(tmp_path, args):
    path = tmp_path / "hosts.yaml"
    path.write_text(f"all:\n  hosts:\n    a: {{ansible_ssh_common_args: '{args}'}}\n")
    with pytest.raises(InventoryError, match=r"all\.hosts\.a\.ansible_ssh_common_args: .*jump host"):
        load_inventory(path)
