"""Ansible-format inventories: precedence, selection, patterns and the errors users meet."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurig.errors import InventoryError
from gpurig.inventory import expand_host_pattern, load_inventory

REPO_INVENTORY = Path(__file__).resolve().parents[2] / "inventory" / "hosts.yaml"

PRECEDENCE = """
all:
  vars:
    who: all
    ansible_user: deploy
    only_all: 1
  hosts:
    solo:
  children:
    gpu:
      vars: {who: gpu, gpu_only: yes}
      children:
        a100:
          vars: {who: a100}
          hosts:
            a100-01: {who: host, ansible_host: 10.0.0.1, ansible_port: "2222"}
            a100-02:
        zeta:
          vars: {who: zeta, sibling: zeta}
          hosts:
            a100-02:
        alpha:
          vars: {who: alpha, sibling: alpha, ansible_group_priority: 10}
          hosts:
            a100-02:
"""


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text(PRECEDENCE)
    return load_inventory(path)


def test_host_vars_beat_child_groups_beat_parents_beat_all(inv):
    h = inv.hosts["a100-01"]
    assert h.var("who") == "host"
    assert h.var("gpu_only") is True and h.var("only_all") == 1
    assert (h.address, h.port, h.user) == ("10.0.0.1", 2222, "deploy")
    assert h.groups == ("gpu", "a100")


def test_siblings_merge_by_priority_then_name(inv):
    # zeta sorts after alpha by name, but alpha's ansible_group_priority 10 puts it last, so it wins.
    assert inv.hosts["a100-02"].var("sibling") == "alpha"


def test_group_vars_and_host_vars_directories(tmp_path):
    (tmp_path / "hosts.yaml").write_text(PRECEDENCE)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("who: group_vars_all\nfrom_dir: all\n")
    (tmp_path / "group_vars" / "a100.yaml").write_text("from_dir: a100\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "a100-01.yml").write_text("who: host_vars_file\n")
    inv = load_inventory(tmp_path / "hosts.yaml")
    assert inv.hosts["a100-01"].var("who") == "host_vars_file"
    assert inv.hosts["a100-01"].var("from_dir") == "a100"
    # group_vars/all.yml outranks the inventory file's group vars, as in Ansible.
    assert inv.hosts["solo"].var("who") == "group_vars_all"


def test_ungrouped_and_all_groups(inv):
    assert inv.groups["ungrouped"] == ("solo",)
    assert set(inv.groups["all"]) == {"solo", "a100-01", "a100-02"}


def test_select_by_host_group_and_pattern(inv):
    assert [h.name for h in inv.select(hosts="a100-02,solo")] == ["solo", "a100-02"]
    assert [h.name for h in inv.select(groups="a100")] == ["a100-01", "a100-02"]
    assert [h.name for h in inv.select(hosts="a100-*")] == ["a100-01", "a100-02"]
    assert [h.name for h in inv.select(pattern="all:!gpu")] == ["solo"]
    assert [h.name for h in inv.select(pattern="gpu:&zeta")] == ["a100-02"]
    assert [h.name for h in inv.select(pattern="~a100-0[1]")] == ["a100-01"]
    assert len(inv.select()) == 3


def test_unknown_names_suggest_the_closest(inv):
    with pytest.raises(InventoryError, match="did you mean 'a100-01'"):
        inv.select(hosts="a100-1")
    with pytest.raises(InventoryError, match="did you mean 'alpha'"):
        inv.select(groups="alpah")
    with pytest.raises(InventoryError, match="no host or group matches 'h100-\\*'"):
        inv.select(hosts="h100-*")


def test_host_ranges_expand_like_ansible():
    assert expand_host_pattern("gpu[01:03]") == ["gpu01", "gpu02", "gpu03"]
    assert expand_host_pattern("node[a:c]-x") == ["nodea-x", "nodeb-x", "nodec-x"]
    assert expand_host_pattern("r[1:2]n[1:2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_host_pattern("plain") == ["plain"]


def test_local_connection(tmp_path):
    (tmp_path / "h.yaml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    assert load_inventory(tmp_path / "h.yaml").hosts["localhost"].is_local


@pytest.mark.parametrize(
    "text,message",
    [
        ("all:\n  hosts:\n    a: {x: [\n", "malformed YAML"),
        ("all:\n  host:\n    a:\n", "all.host: unknown key (did you mean 'hosts'?)"),
        ("all:\n  children:\n    g:\n      hosts: [a, b]\n", "all.children.g.hosts: must be a mapping"),
        ("all:\n  hosts:\n    a: {ansible_port: ssh}\n", "all.hosts.a.ansible_port: 'ssh' must be a whole number"),
        ("all:\n  hosts:\n    a: {ansible_connection: winrm}\n", "all.hosts.a.ansible_connection: 'winrm' is not supported"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("all:\n  children:\n    a:\n      children:\n        b:\n          children:\n            a:\n", "group cycle"),
    ],
)
def test_bad_inventories_say_where_and_what(tmp_path, text, message):
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert message in str(err.value) and str(path) in str(err.value)
    assert err.value.fix


def test_missing_file(tmp_path):
    with pytest.raises(InventoryError, match="not found"):
        load_inventory(tmp_path / "nope.yaml")


def test_repository_example_inventory_loads():
    inv = load_inventory(REPO_INVENTORY)
    assert {"a100-01", "h100-01", "localhost"} <= set(inv.hosts)
    assert inv.hosts["localhost"].is_local
    h100 = inv.hosts["h100-01"]
    assert h100.var("gpurig_gpu_count") == 8 and h100.become and h100.port == 2222
