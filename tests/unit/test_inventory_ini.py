"""INI inventories (hosts.ini): read as ansible-inventory 2.19 reads them, refused as strictly as YAML ones.

The files under tests/fixtures/inventory/ini/ are compared with ansible-core
2.19.14 itself, run live from .bench-venv (scripts/setup.sh installs it; CI
runs it). Without it the comparison fails rather than skips: a reader that
claims Ansible's format is only proven by Ansible. The refusals (one line
naming file and line) are the hostile corpus's *.ini files, which
tests/unit/test_inventory_cli.py runs through the CLI with the YAML ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, gpurig
from test_inventory_cli import _comparable

from gpurig.errors import InventoryError
from gpurig.inventory import load_inventory
from gpurig.inventory import loader as inventory_loader
from gpurig.strict.yamlio import MAX_BYTES, MAX_NODES

ROOT = Path(__file__).resolve().parents[2]
INI = ROOT / "tests" / "fixtures" / "inventory" / "ini"
ANSIBLE_INVENTORY = ROOT / ".bench-venv" / "bin" / "ansible-inventory"

# each ansible-inventory run costs seconds: every file's --list, the tree (with vars) of two, and one host
VIEWS = [
    ("hosts.ini", "--list"), ("hosts.ini", "--graph --vars"), ("hosts.ini", "--host 2001:db8::7"),
    ("order.ini", "--list"), ("order.ini", "--graph"), ("hosts", "--list"),
]


@pytest.mark.parametrize("name,flags", VIEWS, ids=[f"{n} {f}" for n, f in VIEWS])
def test_gpurig_reads_ini_as_ansible_inventory_does(name, flags, tmp_path):
    assert ANSIBLE_INVENTORY.exists(), "no ansible-core 2.19.14 in .bench-venv: run scripts/setup.sh (CI does); this comparison is not skipped"
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path), "ANSIBLE_HOME": str(tmp_path)}
    theirs = subprocess.run([str(ANSIBLE_INVENTORY), "-i", name, *flags.split()], cwd=INI, env=env, capture_output=True, text=True, timeout=120)
    ours = gpurig(tmp_path, "inventory", "-i", str(INI / name), *flags.split())
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr
    kind = "x.json" if flags.startswith(("--list", "--host")) else "x.txt"
    assert _comparable(ours.stdout, kind) == _comparable(theirs.stdout, kind)


def test_ini_hosts_connect_where_their_lines_say():
    inv = load_inventory(INI / "hosts.ini")
    h = inv.hosts
    assert (h["bastion"].address, h["bastion"].user, h["bastion"].groups) == ("192.0.2.1", "ops", ("ungrouped",))
    assert (h["login.example.invalid"].port, h["login.example.invalid"].groups) == (2222, ("fleet", "cpu"))
    assert (h["h100-05"].port, h["h100-05"].user, h["h100-05"].var("gpurig_gpu_model")) == (2201, "deploy", "NVIDIA H100 80GB HBM3")
    assert (h["h100-03"].port, h["h100-03"].user, h["h100-03"].become) == (22, "ml", True)  # 'true' from [gpu:vars], a string, as Ansible reads it
    assert (h["10.0.0.7"].port, h["10.0.0.7"].var("gpurig_gpus")) == (2022, {"count": 4, "model": "A100"})
    assert (h["2001:db8::7"].port, h["2001:db8::7"].become) == (2200, True)
    assert h["build01"].is_local
    assert h["a100-b"].var("options") == {"pull": True, "retries": 3} and h["a100-b"].var("pair") == [1, 2]
    assert h["h100-02"].var("tier") == "h100-02 from host_vars" and h["h100-01"].var("from_group_vars") == "gpu"
    assert [x.name for x in inv.select("fleet:!gpu")] == ["login.example.invalid", "build01", "late-01"]
    assert inv.groups["a100"] == ("a100-a", "a100-b", "a100-c", "10.0.0.7", "2001:db8::7")


def test_a_host_var_given_twice_on_one_line_is_refused_not_the_last_kept(tmp_path):
    # ansible-inventory 2.19.14 keeps the last (ansible_port 2200) without a word: a typo'd duplicate would move the connection
    (tmp_path / "hosts.ini").write_text("[gpu]\nh1 ansible_port=2222\nh2 ansible_port=2222 ansible_user=ml ansible_port=2200\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(tmp_path / "hosts.ini")
    assert err.value.problem == f"{tmp_path / 'hosts.ini'}: line 3: var ansible_port is given twice on this line"
    assert err.value.fix == "keep one of them"


def _ansible_hosts(path: Path, tmp_path: Path) -> list[str]:
    assert ANSIBLE_INVENTORY.exists(), "no ansible-core 2.19.14 in .bench-venv: run scripts/setup.sh (CI does); this comparison is not skipped"
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path), "ANSIBLE_HOME": str(tmp_path)}
    theirs = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(path), "--list"], env=env, capture_output=True, text=True, timeout=120)
    assert theirs.returncode == 0, theirs.stderr
    return json.loads(theirs.stdout)["gpu"]["hosts"]


@pytest.mark.parametrize("entry", ["web_:2200", "h-:2201"])
def test_a_port_ansible_keeps_in_the_name_is_never_split_off(entry, tmp_path):
    """Ansible splits :PORT only off a name it takes as a host; web_:2200 is a host named 'web_:2200' there, not web_ on 2200."""
    ansible = tmp_path / "ansible.ini"
    ansible.write_text(f"[gpu]\n{entry}\nweb-1:2200\n")
    assert _ansible_hosts(ansible, tmp_path) == [entry, "web-1"]  # the reference: kept whole; a DNS-like name is split
    # a name with ':' is no address ssh can reach: gpurig refuses the line, and never reads another host and port out of it
    (tmp_path / "hosts.ini").write_text(f"[gpu]\nh1\n{entry}\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(tmp_path / "hosts.ini")
    assert str(err.value).startswith(f"{tmp_path / 'hosts.ini'}: line 3: host name '{entry}' is not a valid host name")


def test_a_file_without_extension_is_yaml_when_it_reads_as_yaml(tmp_path):
    (tmp_path / "hosts").write_text("all:\n  hosts:\n    y1:\n      ansible_port: 2200\n")
    assert load_inventory(tmp_path / "hosts").hosts["y1"].port == 2200
    (tmp_path / "other").write_text("i1 ansible_port=2201\n")
    assert load_inventory(tmp_path / "other").hosts["i1"].port == 2201


def test_toml_is_refused_by_name(tmp_path):
    (tmp_path / "hosts.toml").write_text("[gpu.hosts.h1]\n")
    with pytest.raises(InventoryError, match="TOML inventories are not read"):
        load_inventory(tmp_path / "hosts.toml")


def test_an_ini_file_over_the_size_limit_is_one_line(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text("h1\n" + "#" * MAX_BYTES + "\n")
    assert_one_line_error(gpurig(tmp_path, "hosts", "-i", str(path)), str(path), "over the 5 MiB limit")


def test_the_host_count_is_capped_at_the_line_that_passes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(inventory_loader, "MAX_HOSTS", 50)
    (tmp_path / "hosts.ini").write_text("[a]\na[1:40]\n[b]\nb[1:40]\n")
    with pytest.raises(InventoryError, match=r"hosts.ini: line 4: the inventory defines more than 50 hosts"):
        load_inventory(tmp_path / "hosts.ini")


def test_a_value_of_too_many_items_is_refused_before_it_is_parsed(tmp_path):
    (tmp_path / "hosts.ini").write_text("[gpu:vars]\nbig = [" + "1," * (MAX_NODES + 1) + "]\n[gpu]\nh1\n")
    started = time.process_time()
    with pytest.raises(InventoryError, match=r"line 2: big: a value of more than 100,000 items"):
        load_inventory(tmp_path / "hosts.ini")
    assert time.process_time() - started < 1


def test_twenty_thousand_ini_hosts_load_in_linear_time(tmp_path):
    lines = ["[all:vars]", "ansible_user=ubuntu"]
    for g in range(20):
        lines += [f"[g{g}:vars]", f"rack={g}", f"[g{g}]"]
        lines += [f"h{g}-{i:04d} ansible_host=10.{g}.{i // 250}.{i % 250}" for i in range(1000)]
    (tmp_path / "big.ini").write_text("\n".join(lines) + "\n")
    started = time.process_time()
    inv = load_inventory(tmp_path / "big.ini")
    elapsed = time.process_time() - started
    assert len(inv.hosts) == 20_000 and inv.hosts["h7-0999"].var("rack") == 7 and inv.hosts["h7-0999"].address == "10.7.3.249"
    assert elapsed < 5, f"20,000 INI hosts took {elapsed:.1f}s of CPU"
