"""Ansible-format inventories: precedence, selection, patterns and the errors users meet."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from gpurig.errors import InventoryError
from gpurig.inventory import expand_host_pattern, load_inventory
from gpurig.inventory import loader as inventory_loader

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


# "shared" sits under lab (depth 2) and under site/rack (depth 3); "tier" (depth 2) would win a tie by name.
SHALLOW_PATH = """
    lab:
      children:
        shared:
"""
DEEP_PATH = """
    site:
      children:
        rack:
          children:
            shared:
              vars: {role: shared}
              hosts: {n1: }
"""
TIER = """
    zone:
      children:
        tier:
          vars: {role: tier}
          hosts: {n1: }
"""


@pytest.mark.parametrize("paths", [SHALLOW_PATH + DEEP_PATH, DEEP_PATH + SHALLOW_PATH], ids=["shallow first", "deep first"])
def test_a_group_reachable_by_two_paths_merges_at_its_deepest(tmp_path, paths):
    """ansible-inventory 2.19.14 --host n1 says role: shared for both orders (and tier once the rack path is gone)."""
    assert _load(tmp_path, "all:\n  children:" + paths + TIER).hosts["n1"].var("role") == "shared"


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
        ("all:\n  hosts:\n    a: {ansible_connection: 'win rm'}\n", "all.hosts.a.ansible_connection: 'win rm' is not a connection plugin's name"),
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


# -- Ansible's pattern language, and patterns that narrow ---------------------------------


@pytest.mark.parametrize(
    "patterns,expected",
    [
        (("gpu",), ["a100-01", "a100-02"]),
        (("gpu", "a100-01"), ["a100-01"]),  # --group gpu --host a100-01: the limit narrows, never widens
        (("all", "!gpu"), ["solo"]),
        (("a100-01,solo",), ["solo", "a100-01"]),
        (("a100-01:solo",), ["solo", "a100-01"]),
        (("gpu:!a100-01,solo",), None),  # with a comma, ':' is part of a name, as in Ansible: matches nothing
        (("gpu:&zeta",), ["a100-02"]),
        (("gpu:!zeta",), ["a100-01"]),
        (("!gpu",), ["solo"]),  # only exclusions: from all, as Ansible does
        (("&zeta:gpu",), ["a100-02"]),  # unions first, whatever the order written
        (("*",), ["solo", "a100-01", "a100-02"]),
        (("a100-*",), ["a100-01", "a100-02"]),
        (("a1*",), ["a100-01", "a100-02"]),  # a glob over group names too (a100)
        (("~a100-0[2]",), ["a100-02"]),
        (("~.*-02",), ["a100-02"]),
        (("a100[0]",), ["a100-01"]),
        (("a100[-1]",), ["a100-02"]),
        (("all[0:1]",), ["solo", "a100-01"]),
        (("all[1:]",), ["a100-01", "a100-02"]),
        ((None, "", "gpu"), ["a100-01", "a100-02"]),
        ((), ["solo", "a100-01", "a100-02"]),
    ],
)
def test_ansible_patterns(inv, patterns, expected):
    if expected is None:
        with pytest.raises(InventoryError, match="no host or group matches"):
            inv.select(*patterns)
        return
    assert [h.name for h in inv.select(*patterns)] == expected


def test_a_regex_matches_from_the_start_as_in_ansible(inv):
    with pytest.raises(InventoryError, match="no host or group matches '~100'"):
        inv.select("~100")


@pytest.mark.parametrize(
    "pattern,message",
    [
        ("gpu:&alpah", "did you mean 'alpha'"),
        ("all:!a100-1", "did you mean 'a100-01'"),
        ("~a100-(", "is not a valid regular expression"),
        ("~a100-[", "unbalanced '['"),
        ("gpu:&", "'&' or '!' with no name after it"),
        (" , ", "empty host pattern"),
        ("gpu[7]", "index 7 is past the 2 hosts"),
    ],
)
def test_every_term_must_match(inv, pattern, message):
    with pytest.raises(InventoryError, match=re.escape(message)):
        inv.select(pattern)


def test_old_keyword_spelling_narrows_too(inv):
    assert [h.name for h in inv.select(groups="gpu", hosts="a100-02")] == ["a100-02"]
    assert [h.name for h in inv.select(hosts="a100-*", pattern="zeta")] == ["a100-02"]


def test_ipv6_host_names_are_one_term(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("all:\n  hosts:\n    '2001:db8::1':\n    '2001:db8::2':\n")
    inv = load_inventory(path)
    assert [h.name for h in inv.select("2001:db8::1")] == ["2001:db8::1"]
    assert [h.name for h in inv.select("2001:db8::1,2001:db8::2")] == ["2001:db8::1", "2001:db8::2"]


# -- strict, unambiguous loading ----------------------------------------------------------


def _load(tmp_path, text: str):
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return load_inventory(path)


def _refused(tmp_path, text: str) -> str:
    with pytest.raises(InventoryError) as err:
        _load(tmp_path, text)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "hosts.yaml") + ": ") and err.value.fix
    return message


def test_quoted_digits_are_a_port_as_ini_inventories_write_it(tmp_path):
    assert _load(tmp_path, "all:\n  hosts:\n    a: {ansible_port: '2222'}\n").hosts["a"].port == 2222


@pytest.mark.parametrize("value", ["true", "22.9", "'22x'", "'0x16'", "0", "65536", "[22]", "'٢٢'"])
def test_ports_are_strict(tmp_path, value):
    assert "all.hosts.a.ansible_port: " in _refused(tmp_path, f"all:\n  hosts:\n    a: {{ansible_port: {value}}}\n")


def test_a_host_listed_twice_in_one_group_names_both_entries(tmp_path):
    message = _refused(tmp_path, "all:\n  children:\n    g:\n      hosts:\n        n[1:3]:\n        n[3:5]:\n")
    assert "all.children.g.hosts.n[3:5]: host n3 is listed twice in group g (first at all.children.g.hosts.n[1:3])" in message


def test_one_host_in_several_groups_is_fine_and_same_values_agree(tmp_path):
    inv = _load(tmp_path, "all:\n  children:\n    a:\n      hosts:\n        h: {x: 1}\n    b:\n      hosts:\n        h: {x: 1}\n")
    assert inv.hosts["h"].groups == ("a", "b") and inv.hosts["h"].var("x") == 1


def test_a_group_defined_twice_with_different_values_is_ambiguous(tmp_path):
    message = _refused(
        tmp_path,
        "all:\n  children:\n    p:\n      children:\n        g: {vars: {x: 1}}\n    q:\n      children:\n        g: {vars: {x: 2}}\n",
    )
    assert "all.children.q.children.g.vars.x: group g already has x = 1 from all.children.p.children.g.vars.x" in message


def test_vars_files_name_their_own_file_and_key(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text("ansible_user: 'root; id'\n")
    with pytest.raises(InventoryError) as err:
        _load(tmp_path, "all:\n  children:\n    gpu:\n      hosts:\n        a:\n")
    assert str(err.value).startswith(str(tmp_path / "group_vars" / "gpu.yml") + ": ansible_user: 'root; id' contains whitespace")


def test_a_fifo_among_host_vars_is_refused_not_waited_on(tmp_path):
    (tmp_path / "host_vars").mkdir()
    os.mkfifo(tmp_path / "host_vars" / "a.yml")
    with pytest.raises(InventoryError, match="is not a regular file"):
        _load(tmp_path, "all:\n  hosts:\n    a:\n")


def test_vars_of_hosts_and_groups_the_inventory_lacks_are_not_read(tmp_path):
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "other.yml").write_text("broken: [\n")
    assert _load(tmp_path, "all:\n  hosts:\n    a:\n").hosts["a"].var("broken") is None


def test_group_priority_orders_the_merge_and_is_not_a_host_var(inv):
    assert "ansible_group_priority" not in inv.hosts["a100-02"].vars
    assert inv.tree["alpha"].vars["ansible_group_priority"] == 10


def test_ungrouped_is_always_the_first_child_of_all(tmp_path):
    inv = _load(tmp_path, "all:\n  children:\n    g:\n      hosts:\n        h:\n")
    assert inv.tree["all"].children == ("ungrouped", "g") and inv.groups["ungrouped"] == ()


# -- bounded ----------------------------------------------------------------------------


def test_a_huge_range_is_refused_before_it_is_expanded():
    started = time.process_time()
    with pytest.raises(InventoryError, match="expands to 100,000,000 names, over the limit of 10,000"):
        expand_host_pattern("node[0:99999999]")
    assert time.process_time() - started < 0.5


def test_ranges_like_ansible():
    assert expand_host_pattern("n[1:7:3]") == ["n1", "n4", "n7"]
    assert expand_host_pattern("n[:2]") == ["n0", "n1", "n2"]
    assert expand_host_pattern("n[y:B]") == ["ny", "nz", "nA", "nB"]
    assert len(expand_host_pattern("n[0001:9999]")) == 9999


def test_the_host_count_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(inventory_loader, "MAX_HOSTS", 50)
    message = _refused(tmp_path, "all:\n  children:\n    a:\n      hosts:\n        a[1:40]:\n    b:\n      hosts:\n        b[1:40]:\n")
    assert "the inventory defines more than 50 hosts" in message and "all.children.b.hosts.b[1:40]" in message


def test_deep_group_graphs_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(inventory_loader, "MAX_MEMBERSHIPS", 5_000)
    chain = "".join(f"g{i}:\n  children:\n    g{i + 1}:\n" for i in range(200))
    hosts = "g200:\n  hosts:\n    h[1:100]:\n"
    assert "groups in all (counting parents)" in _refused(tmp_path, chain + hosts)


def test_a_lattice_of_groups_loads_in_linear_time(tmp_path):
    # each level's two groups are children of both groups above: 2^40 paths from 'all' to the bottom
    lines = []
    for i in range(40):
        for side in "ab":
            lines += [f"l{i}{side}:", "  children:", f"    l{i + 1}a:", f"    l{i + 1}b:"]
    lines += ["l40a:", "  hosts:", "    h1:", "l40b:", "  hosts:", "    h2:"]
    started = time.process_time()
    inv = _load(tmp_path, "\n".join(lines) + "\n")
    assert time.process_time() - started < 2
    assert len(inv.hosts["h1"].groups) == 81 and inv.groups["l0a"] == ("h1", "h2")


def test_twenty_thousand_hosts_load_in_linear_time(tmp_path):
    lines = ["all:", "  vars: {ansible_user: ubuntu}", "  children:"]
    for g in range(20):
        lines += [f"    g{g}:", f"      vars: {{rack: {g}}}", "      hosts:"]
        lines += [f"        h{g}-{i:04d}: {{ansible_host: 10.{g}.{i // 250}.{i % 250}}}" for i in range(1000)]
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.process_time()  # CPU time: other jobs on the machine do not count
    inv = load_inventory(path)
    hosts = inv.select("g19:!h19-0000")
    elapsed = time.process_time() - started
    assert len(inv.hosts) == 20_000 and len(hosts) == 999 and inv.hosts["h7-0999"].var("rack") == 7
    assert elapsed < 5, f"20,000 hosts took {elapsed:.1f}s of CPU (bench/bench_inventory.py has the real figures)"
