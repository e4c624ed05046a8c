"""Logins begun while a task loads (connect_early): one login per host and jump host, none for a run refused here."""

from __future__ import annotations

import json

import pytest
from delayproxy import DelayProxy

from .test_cli_hosts import gpurig, one_line_error


@pytest.fixture(scope="module")
def early_hosts(farm):
    return farm.start(2, prefix="early")


def test_facts_logs_in_once_through_a_slow_link(early_hosts, write_inventory, tmp_path):
    host = early_hosts[0]
    with DelayProxy(host.port, rtt_s=0.05) as link:
        inv = write_inventory({"far": {"ansible_host": "127.0.0.1", "ansible_port": link.port}})
        proc = gpurig(tmp_path, "facts", "-i", str(inv), "-l", "far", "--json", "-")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["hosts"][0]["status"] == "ok"
        assert link.accepted == 1  # the early login is the one the probe ran on, not a second connection


def test_status_and_verify_reuse_the_early_login_too(early_hosts, write_inventory, tmp_path):
    host = early_hosts[0]
    with DelayProxy(host.port, rtt_s=0.0) as link:
        inv = write_inventory({"far": {"ansible_host": "127.0.0.1", "ansible_port": link.port}})
        for task in ("status", "verify"):
            gpurig(tmp_path, task, "-i", str(inv), "-l", "far", "--json", f"{task}.json")  # no Docker/GPU here: the host fails, after logging in
            assert json.loads((tmp_path / f"{task}.json").read_text())["hosts"][0]["host"] == "far"
        assert link.accepted == 2  # one login per command


def test_a_jump_host_sees_one_login(early_hosts, write_inventory, tmp_path, login_user):
    target, jump = early_hosts
    with DelayProxy(jump.port, rtt_s=0.05) as link:
        inv = write_inventory({"behind": {"ansible_host": "127.0.0.1", "ansible_port": target.port,
                                          "ansible_ssh_common_args": f"-o ProxyJump={login_user}@127.0.0.1:{link.port}"}})
        proc = gpurig(tmp_path, "facts", "-i", str(inv), "-l", "behind", "--json", "-")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["hosts"][0]["status"] == "ok"
        assert link.accepted == 1


def test_a_run_refused_here_contacts_no_host(early_hosts, write_inventory, tmp_path):
    with DelayProxy(early_hosts[0].port, rtt_s=0.0) as link:
        inv = write_inventory({"far": {"ansible_host": "127.0.0.1", "ansible_port": link.port, "gpurig_gpuss": 2}})
        one_line_error(gpurig(tmp_path, "facts", "-i", str(inv), "-l", "far"), "gpurig_gpuss")
        inv = write_inventory({"far": {"ansible_host": "127.0.0.1", "ansible_port": link.port}})
        one_line_error(gpurig(tmp_path, "logs", "-i", str(inv), "-l", "far", "bad/name"), "bad/name")
        assert link.accepted == 0
        assert not (inv.parent / "known_hosts").exists()  # no host key recorded for a run that never started


def test_an_unreachable_host_is_reported_as_before(write_inventory, tmp_path, refused_port):
    inv = write_inventory({"gone": {"ansible_host": "127.0.0.1", "ansible_port": refused_port}})
    proc = gpurig(tmp_path, "facts", "-i", str(inv), "-l", "gone", "--connect-timeout", "2", "--json", "-")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    row = json.loads(proc.stdout)["hosts"][0]
    assert row["status"] == "unreachable" and "connection refused" in row["reason"] and row["fix"]
