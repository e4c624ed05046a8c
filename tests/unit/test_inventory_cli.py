"""Inventories as users meet them through the CLI: hostile files refused in one line, --limit narrowing, `gpurig inventory`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, gpurig

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "inventory"
HOSTILE = sorted([*(FIXTURES / "hostile").glob("*.yaml"), *(FIXTURES / "hostile").glob("*.ini")])
ANSIBLE = FIXTURES / "ansible"
ANSIBLE_INVENTORY = ROOT / ".bench-venv" / "bin" / "ansible-inventory"  # scripts/setup.sh installs ansible-core 2.19.14 there (CI runs it)


def _expectation(path: Path) -> tuple[str, str]:
    header = path.read_text().splitlines()[0]
    assert header.startswith("# expect: "), f"{path.name} has no '# expect: WHERE | RULE' line"
    where, rule = header[len("# expect: "):].split(" | ", 1)
    return where, rule


def test_the_corpus_covers_every_class():
    assert {p.name.split("-")[0] for p in HOSTILE} == {"c1", "c4", "c5", "c6"}


@pytest.mark.parametrize("path", HOSTILE, ids=[p.stem for p in HOSTILE])
def test_hostile_inventory_is_one_line_naming_file_place_and_rule(path, tmp_path):
    where, rule = _expectation(path)
    proc = gpurig(tmp_path, "hosts", "--inventory", str(path))
    assert_one_line_error(proc, str(path), where, rule)
    message = proc.stderr.strip()
    # class 6: the message quotes the file only in short excerpts: no 48 characters of any line of it in a row
    for line in path.read_text().splitlines()[1:]:
        text = line.strip()
        assert not any(text[i: i + 48] in message for i in range(0, max(len(text) - 47, 0), 8))
    assert len(message) < len(str(path)) + 400


@pytest.mark.parametrize("task", ["hosts", "inventory --list"])
def test_dev_zero_and_a_fifo_are_refused_at_once(task, tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        # a FIFO that is opened blocks until a writer comes: the timeout turns a hang into a failure
        proc = gpurig(tmp_path, *task.split(), "--inventory", path)
        assert_one_line_error(proc, path, "is not a regular file")


def test_a_symlink_to_another_file_never_prints_that_file(tmp_path):
    secret = "api_token_" + "5f0c9a8b7e6d4c3b2a190817" * 3
    (tmp_path / "private.yaml").write_text(f"{secret}: hunter2-and-more-secret\nother: 1\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.symlink_to(tmp_path / "private.yaml")
    proc = gpurig(tmp_path, "hosts", "--inventory", str(inventory))
    assert_one_line_error(proc, str(inventory), "must be a mapping")
    assert secret not in proc.stderr and "hunter2" not in proc.stderr and secret[-20:] not in proc.stderr


def test_a_hostile_name_never_reaches_ssh_config_match_exec(tmp_path):
    """Class 1: ~/.ssh/config's `Match exec` runs a shell with %h; a hostile inventory must be refused before any lookup."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    ran = tmp_path / "ran"
    ran.mkdir()
    (home / ".ssh" / "config").write_text(f'Match exec "touch {ran}/%h"\n  User nobody\n')
    env = {**os.environ, "HOME": str(home)}

    def facts(hosts: str) -> subprocess.CompletedProcess:
        inventory = tmp_path / "hosts.yaml"
        inventory.write_text(f"all:\n  hosts:\n{hosts}")
        code = "import sys; from gpurig.cli import main; main(sys.argv)"
        args = ["facts", "--inventory", str(inventory), "--connect-timeout", "2"]
        return subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    # the control: a plain address (a closed port) goes through the lookup, and Match exec runs
    facts("    plain:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n")
    assert (ran / "127.0.0.1").exists()
    for hostile in (
        "    x:\n      ansible_host: \"127.0.0.1$(touch${IFS}" + str(ran) + "/pwned)\"\n",
        "    \"a$(touch${IFS}" + str(ran) + "/pwned)b\":\n",
        "    x:\n      ansible_host: \"-oProxyCommand=touch${IFS}" + str(ran) + "/pwned\"\n",
    ):
        assert_one_line_error(facts(hostile), "hosts.yaml")
    assert sorted(p.name for p in ran.iterdir()) == ["127.0.0.1"]


def test_limits_narrow_never_widen(tmp_path):
    inventory = str(ANSIBLE / "hosts.yaml")
    assert _listed(tmp_path, "--group", "gpu", "--host", "h100-a") == ["h100-a"]
    assert _listed(tmp_path, "--pattern", "gpu:!a100-01", "--group", "rack1") == ["a100-02", "h100-a"]
    assert _listed(tmp_path, "--pattern", "~a100-0[23]", "--host", "a100-*") == ["a100-02", "a100-03"]
    assert _listed(tmp_path, "--pattern", "all:!gpu") == ["localhost"]
    assert inventory


def test_a_selection_that_matches_nothing_is_an_error(tmp_path):
    inventory = str(ANSIBLE / "hosts.yaml")
    assert_one_line_error(gpurig(tmp_path, "hosts", "--inventory", inventory, "--group", "a100", "--host", "h100-a"), "matches no host")
    assert_one_line_error(gpurig(tmp_path, "hosts", "--inventory", inventory, "--group", "gpu", "--host", "h100-x"), "did you mean 'h100-")


ALL_HOSTS = ["localhost", "a100-01", "a100-02", "a100-03", "h100-a", "h100-b"]


def _listed(tmp_path: Path, *selection: str) -> list[str]:
    """The example's hosts that `gpurig hosts` lists for a selection (whatever the table looks like)."""
    proc = gpurig(tmp_path, "hosts", "--inventory", str(ANSIBLE / "hosts.yaml"), *selection)
    assert proc.returncode == 0, proc.stderr
    return [h for h in ALL_HOSTS if re.search(rf"(?<![\w-]){re.escape(h)}(?![\w-])", proc.stdout)]


RECORDED = [
    ("--list", "list.json"),
    ("--graph", "graph.txt"),
    ("--graph --vars", "graph-vars.txt"),
    ("--graph gpu", "graph-gpu.txt"),
    ("--host h100-a", "host-h100-a.json"),
    ("--host h100-b", "host-h100-b.json"),
    ("--host a100-02", "host-a100-02.json"),
]


def _comparable(text: str, name: str):
    if not name.endswith(".json"):
        return text
    data = json.loads(text)
    data.get("_meta", {}).pop("profile", None)  # ansible-core's name for its output profile; nothing of the inventory
    return data


@pytest.mark.parametrize("flags,recorded", RECORDED, ids=[r for _, r in RECORDED])
def test_gpurig_inventory_prints_what_ansible_inventory_printed(flags, recorded, tmp_path):
    proc = gpurig(tmp_path, "inventory", "--inventory", str(ANSIBLE / "hosts.yaml"), *flags.split())
    assert proc.returncode == 0, proc.stderr
    assert _comparable(proc.stdout, recorded) == _comparable((ANSIBLE / recorded).read_text(), recorded)


@pytest.mark.parametrize("flags,recorded", RECORDED[:4], ids=[r for _, r in RECORDED[:4]])
def test_gpurig_inventory_matches_live_ansible_inventory(flags, recorded, tmp_path):
    assert ANSIBLE_INVENTORY.exists(), "no ansible-core 2.19.14 in .bench-venv: run scripts/setup.sh (CI does); this comparison is not skipped"
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCAL_TEMP": str(tmp_path), "ANSIBLE_HOME": str(tmp_path)}
    theirs = subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", "hosts.yaml", *flags.split()], cwd=ANSIBLE, env=env, capture_output=True, text=True, timeout=120
    )
    ours = gpurig(tmp_path, "inventory", "--inventory", str(ANSIBLE / "hosts.yaml"), *flags.split())
    assert theirs.returncode == 0 and ours.returncode == 0
    assert _comparable(ours.stdout, recorded) == _comparable(theirs.stdout, recorded)


def test_gpurig_inventory_errors_are_one_line(tmp_path):
    inventory = str(ANSIBLE / "hosts.yaml")
    assert_one_line_error(gpurig(tmp_path, "inventory", "--inventory", inventory), "give exactly one of --list, --graph or --host")
    assert_one_line_error(gpurig(tmp_path, "inventory", "--inventory", inventory, "--list", "--graph"), "got --list, --graph")
    assert_one_line_error(gpurig(tmp_path, "inventory", "--inventory", inventory, "--host", "h100-x"), "did you mean 'h100-")
    assert_one_line_error(gpurig(tmp_path, "inventory", "--inventory", inventory, "--host", "gpu"), "matches 5 hosts")
    assert_one_line_error(gpurig(tmp_path, "inventory", "--inventory", inventory, "--graph", "rak1"), "did you mean 'rack1'")


def test_short_inventory_flag_and_a_pattern_for_host(tmp_path):
    proc = gpurig(tmp_path, "inventory", "-i", str(ANSIBLE / "hosts.yaml"), "--host", "~h100-b")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ansible_host"] == "192.0.2.20"


# What ansible-inventory 2.19.14 printed for this host (recorded): every key named as JSON names it, then sorted as text.
MIXED_KEYS = "all:\n  hosts:\n    h1:\n      x: {a: 1, 0: 2, true: t, null: n, 1.5: f, 10: ten, 9: nine}\n"
MIXED_KEYS_PRINTED = """{
    "x": {
        "0": 2,
        "1.5": "f",
        "10": "ten",
        "9": "nine",
        "a": 1,
        "null": "n",
        "true": "t"
    }
}
"""


def test_vars_with_int_and_str_keys_print_as_ansible_prints_them(tmp_path):
    # json.dumps(sort_keys=True) compared 0 with "a" and raised TypeError: a traceback for a mapping Ansible accepts
    path = tmp_path / "hosts.yaml"
    path.write_text(MIXED_KEYS)
    host = gpurig(tmp_path, "inventory", "--inventory", str(path), "--host", "h1")
    assert host.returncode == 0, host.stderr
    assert host.stdout == MIXED_KEYS_PRINTED
    listed = gpurig(tmp_path, "inventory", "--inventory", str(path), "--list")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["_meta"]["hostvars"]["h1"] == json.loads(MIXED_KEYS_PRINTED)
