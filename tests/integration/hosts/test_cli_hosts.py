"""`gpurig facts` / `gpurig hosts` as a user runs them: tables, JSON, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import fake_listener


def gpurig(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    code = "import sys; from gpurig.cli import main; main(sys.argv)"
    # HOME points at an empty directory so the user's own ~/.ssh does not leak into the test.
    env = {**os.environ, "HOME": str(cwd), "COLUMNS": "250"}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )


def one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def cli_hosts(farm):
    return farm.start(3, prefix="cli")


def test_facts_prints_a_table_and_writes_json(cli_hosts, write_inventory, tmp_path):
    inv = write_inventory({h.name: {"ansible_host": "127.0.0.1", "ansible_port": h.port} for h in cli_hosts})
    proc = gpurig(tmp_path, "facts", "--inventory", str(inv), "--host", f"{cli_hosts[0].name},{cli_hosts[1].name}", "--json", "out/facts.json")
    assert proc.returncode == 0, proc.stderr
    assert cli_hosts[0].name in proc.stdout and cli_hosts[1].name in proc.stdout
    assert cli_hosts[2].name not in proc.stdout
    assert "debian" in proc.stdout
    report = json.loads((tmp_path / "out" / "facts.json").read_text())
    assert report["summary"]["ok"] == 2
    assert {h["host"] for h in report["hosts"]} == {cli_hosts[0].name, cli_hosts[1].name}
    # accept-new recorded both keys next to the inventory.
    assert len((inv.parent / "known_hosts").read_text().splitlines()) == 2
    # facts reads the summary probes only: provision's package, service and trap probes were not run, and the report says so
    data = report["hosts"][0]["data"]
    assert {"packages", "services", "held"} <= set(data["unasked"]) and data["missing"] == []
    assert data["os"]["id"] == "debian" and data["docker"] is not None


def test_facts_full_runs_every_probe_as_provision_reads_them(cli_hosts, write_inventory, tmp_path):
    inv = write_inventory({cli_hosts[0].name: {"ansible_host": "127.0.0.1", "ansible_port": cli_hosts[0].port}})
    proc = gpurig(tmp_path, "facts", "--full", "--inventory", str(inv), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["hosts"][0]["data"]
    assert data["unasked"] == [] and data["missing"] == []  # every probe asked, and every one's section came back


def test_facts_exits_non_zero_when_a_host_is_unreachable(cli_hosts, write_inventory, tmp_path, silent_port, refused_port):
    inv = write_inventory(
        {
            cli_hosts[0].name: {"ansible_host": "127.0.0.1", "ansible_port": cli_hosts[0].port},
            "gone": {"ansible_host": "127.0.0.1", "ansible_port": refused_port},
            "hung": {"ansible_host": "127.0.0.1", "ansible_port": silent_port},
        }
    )
    proc = gpurig(tmp_path, "facts", "--inventory", str(inv), "--connect-timeout", "1")
    assert proc.returncode == 1
    assert "unreachable" in proc.stdout and "gone" in proc.stdout
    assert "unreachable=2" in proc.stderr and "ok=1" in proc.stderr
    # One reason line per host, and none of paramiko's own log lines or tracebacks.
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    reasons = [line for line in lines if " : ok=" not in line and " hosts in " not in line]  # the recap follows
    assert [line.split()[:2] for line in reasons] == [["unreachable", "gone:"], ["unreachable", "hung:"]], proc.stderr
    lines = reasons
    assert "connection refused" in lines[0] and "no SSH handshake within 1s" in lines[1]


def test_a_hostile_inventory_address_never_runs_on_this_machine(cli_hosts, write_inventory, tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text('Match exec "true %h"\n  User someone\n')
    inv = write_inventory(
        {
            cli_hosts[0].name: {"ansible_host": "127.0.0.1", "ansible_port": cli_hosts[0].port},
            "evil": {"ansible_host": f"x;touch${{IFS}}{marker}"},
        }
    )
    proc = gpurig(tmp_path, "facts", "--inventory", str(inv))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert not marker.exists()
    assert "evil" in proc.stderr and "shell metacharacter" in proc.stderr, proc.stderr


def test_strict_policy_from_the_command_line_refuses_unknown_hosts(cli_hosts, write_inventory, tmp_path):
    inv = write_inventory({cli_hosts[0].name: {"ansible_host": "127.0.0.1", "ansible_port": cli_hosts[0].port}})
    proc = gpurig(tmp_path, "facts", "--inventory", str(inv), "--host-key-policy", "strict")
    assert proc.returncode == 1
    assert "policy is strict" in proc.stderr


def test_off_policy_warns_loudly(cli_hosts, write_inventory, tmp_path):
    inv = write_inventory({cli_hosts[0].name: {"ansible_host": "127.0.0.1", "ansible_port": cli_hosts[0].port}})
    proc = gpurig(tmp_path, "facts", "--inventory", str(inv), "--host-key-policy", "off")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: host key checking is OFF" in proc.stderr
    assert not (inv.parent / "known_hosts").exists()


def test_malformed_yaml_is_one_line_with_the_position(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("all:\n  hosts:\n    a100-01: {ansible_host: [\n")
    one_line_error(gpurig(tmp_path, "facts", "--inventory", str(inv)), "malformed YAML", "line")


def test_unknown_host_and_group_suggest_the_right_name(write_inventory, tmp_path):
    inv = write_inventory({"a100-01": {}, "h100-01": {}})
    one_line_error(gpurig(tmp_path, "facts", "--inventory", str(inv), "--host", "a100-1"), "did you mean 'a100-01'")
    one_line_error(gpurig(tmp_path, "hosts", "--inventory", str(inv), "--group", "ungroupd"), "did you mean 'ungrouped'")


def test_hosts_lists_the_selection(tmp_path):
    repo_inventory = Path(__file__).resolve().parents[3] / "inventory" / "hosts.yaml"
    proc = gpurig(tmp_path, "hosts", "--inventory", str(repo_inventory), "--pattern", "gpu:!a100-01")
    assert proc.returncode == 0, proc.stderr
    assert "a100-02" in proc.stdout and "h100-01" in proc.stdout and "a100-01" not in proc.stdout


@pytest.fixture
def garbage_port():
    """A port that answers every connection with a line that is not an SSH banner, then hangs up."""
    with fake_listener(b"HTTP/1.1 400 Bad Request\r\n\r\n") as port:
        yield port


def test_exec_runs_over_ssh_with_per_host_rc_and_output(cli_hosts, write_inventory, tmp_path, refused_port):
    hosts = {h.name: {"ansible_host": "127.0.0.1", "ansible_port": h.port} for h in cli_hosts}
    hosts["gone"] = {"ansible_host": "127.0.0.1", "ansible_port": refused_port}
    inv = write_inventory(hosts)
    names = [h.name for h in cli_hosts]
    proc = gpurig(tmp_path, "exec", "-i", str(inv), "-l", "cli*", "--json", "exec.json", "--format", "tsv", "--", "echo", "$(id -un)", "on", "$0")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == names  # -l narrowed away the unreachable host
    assert all(r[1:4] == ["ok", "0", rows[0][3]] and r[3].startswith("gpt") and r[3].endswith(" on sh") for r in rows)
    report = json.loads((tmp_path / "exec.json").read_text())
    assert report["schema"] == "gpurig.exec/1" and report["command"] == "echo $(id -un) on $0"
    assert [h["data"]["rc"] for h in report["hosts"]] == [0, 0, 0]

    # a failing command and an unreachable host: exit 1, each host's own status, rc and stderr
    proc = gpurig(tmp_path, "exec", "-i", str(inv), "-l", f"{names[0]},gone", "--connect-timeout", "2", "--", "echo out; echo err >&2; exit 4")
    assert proc.returncode == 1
    line = next(line for line in proc.stdout.splitlines() if line.startswith(names[0]))
    assert line.split()[:5] == [names[0], "failed", "4", "out", "err"]
    assert "gone" in proc.stdout and "unreachable" in proc.stdout
    assert "failed=1" in proc.stderr and "unreachable=1" in proc.stderr

    # the inventory's ansible_become is honoured as Ansible's ad-hoc commands do (seen: ignored without --become)
    became = write_inventory({names[0]: {"ansible_host": "127.0.0.1", "ansible_port": cli_hosts[0].port, "ansible_become": True}})
    proc = gpurig(tmp_path, "exec", "-i", str(became), "--format", "tsv", "--", "id", "-un")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split("\t")[:4] == [names[0], "ok", "0", "root"], proc.stdout


def test_an_unreachable_host_is_one_line_unless_asked_for_more(garbage_port, write_inventory, tmp_path):
    inv = write_inventory({"babbler": {"ansible_host": "127.0.0.1", "ansible_port": garbage_port}})
    quiet = gpurig(tmp_path, "facts", "-i", str(inv), "--connect-timeout", "2")
    assert quiet.returncode == 1
    assert "Traceback" not in quiet.stderr and "paramiko" not in quiet.stderr
    reason_lines = [line for line in quiet.stderr.splitlines() if "babbler:" in line]
    assert len(reason_lines) == 1 and reason_lines[0].startswith("unreachable babbler: cannot connect")
    assert len(quiet.stderr.splitlines()) <= 3  # the reason, the host's recap, the totals
    loud = gpurig(tmp_path, "facts", "-i", str(inv), "--connect-timeout", "2", "-vv")
    assert "paramiko" in loud.stderr and "Traceback" in loud.stderr  # what a developer debugging it wants


def test_outdated_sets_newer_builds_against_the_drivers_of_the_hosts_it_asks_or_a_facts_report(cli_hosts, write_inventory, tmp_path):
    made = gpurig(tmp_path, "init", "proj")
    assert made.returncode == 0, made.stderr
    wheels = tmp_path / "wheels"  # an offline spec reads only its find-links folder; pip reads the wheels' names
    wheels.mkdir()
    for version in ("2.14.1", "2.9.1+cu128", "2.13.0+cpu", "2.15.0+cu130"):
        (wheels / f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    spec = tmp_path / "proj" / "images" / "pytorch.yaml"
    spec.write_text(spec.read_text().replace("build:\n", f"build:\n  offline: true\n  find_links: [{wheels}]\n"))
    inv = write_inventory({cli_hosts[0].name: {"ansible_host": "127.0.0.1", "ansible_port": cli_hosts[0].port}})
    proj = tmp_path / "proj"

    live = gpurig(proj, "outdated", "-i", str(inv), "--json", "-")
    assert live.returncode == 1, live.stderr  # 2.15.0 cu130 is newer
    doc = json.loads(live.stdout)
    assert doc["fleet"] == {"drivers": {}, "note": "0 GPU hosts, asked 1 host"}  # a loopback sshd host has no GPU
    assert {r["fleet"] for r in doc["torch"] if r["newer"] == "2.15.0 cu130"} == {"no GPU hosts"}

    assert gpurig(proj, "facts", "-i", str(inv), "--json", str(tmp_path / "facts.json")).returncode == 0
    recorded = gpurig(proj, "outdated", "--facts", str(tmp_path / "facts.json"), "--json", "-")
    assert json.loads(recorded.stdout)["fleet"]["note"] == f"0 GPU hosts, from {tmp_path / 'facts.json'}"
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    one_line_error(gpurig(proj, "outdated", "--facts", str(broken)), "not a gpurig facts report", "gpurig facts --json")
