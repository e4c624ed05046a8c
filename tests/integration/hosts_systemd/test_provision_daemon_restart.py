"""A daemon.json that dockerd refuses never leaves a host's Docker broken: real Debian 12 host, real dockerd (20.10, no --validate).

The host gets Docker and a good daemon.json from gpurig first; then the
inventory asks for values only the engine can judge (valid JSON, keys the
inventory check allows): a log level dockerd refuses to start with, and a log
driver that does not exist (dockerd 20.10 starts with it, then fails every
container). Each time the old file is put back, Docker runs on it again, and
the step is `failed` with dockerd's reason. The tests look at the host
through `docker exec`.
"""

from __future__ import annotations

import json

import pytest

from .conftest import inventory_for

pytestmark = pytest.mark.integration
GOOD = {"log-driver": "local"}


@pytest.mark.parametrize("bad, said", [
    ({"log-level": "loud"}, "loud"),  # dockerd exits at start: its own line from the journal
    ({"log-driver": "no-such-driver"}, "no log driver named 'no-such-driver'"),  # dockerd starts, but no container could
], ids=["refused-at-start", "unknown-log-driver"])
def test_a_daemon_json_dockerd_refuses_leaves_docker_running_on_its_old_file(systemd_hosts, provision_cli, tmp_path, bad, said):
    host = systemd_hosts.make("debian12")
    inventory = tmp_path / "inventory" / "hosts.yaml"
    first = provision_cli(inventory_for(inventory, host, {"gpurig_daemon": GOOD}), "--only", "docker,daemon")
    assert first.returncode == 0, first.stdout + first.stderr
    good_file = host.read("/etc/docker/daemon.json")
    assert json.loads(good_file) == GOOD

    proc = provision_cli(inventory_for(inventory, host, {"gpurig_daemon": bad}), "--only", "daemon", "--json", "out.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "failed=1" in proc.stderr
    step = json.loads((tmp_path / "out.json").read_text())["hosts"][0]["steps"][0]
    assert step["step"] == "daemon" and step["status"] == "failed", step
    assert "the old one is back and Docker runs on it again" in step["reason"]
    assert said in step["reason"].split("dockerd said: ", 1)[1], step["reason"]  # dockerd's reason
    assert step["fix"].startswith("correct gpurig_daemon in the inventory")

    assert host.read("/etc/docker/daemon.json") == good_file  # byte for byte
    assert host.sh("systemctl is-active docker").stdout.strip() == "active"
    assert host.sh("docker info --format '{{.LoggingDriver}}'").stdout.strip() == "local"
    names = host.sh("ls /etc/docker").stdout.split()
    refused = [name for name in names if name.startswith("daemon.json.gpurig-rejected.")]
    assert len(refused) == 1 and json.loads(host.read(f"/etc/docker/{refused[0]}")) == {**GOOD, **bad}


def test_docker_23_or_later_checks_the_file_before_it_replaces_the_old_one(systemd_hosts, provision_cli, tmp_path):
    """Debian 13's docker.io (26): dockerd --validate refuses the file; the old one is never replaced, Docker never restarted."""
    host = systemd_hosts.make("debian13")
    inventory = tmp_path / "inventory" / "hosts.yaml"
    first = provision_cli(inventory_for(inventory, host, {"gpurig_daemon": GOOD}), "--only", "docker,daemon")
    assert first.returncode == 0, first.stdout + first.stderr
    good_file = host.read("/etc/docker/daemon.json")
    started = host.sh("systemctl show docker -p ExecMainStartTimestamp").stdout

    proc = provision_cli(inventory_for(inventory, host, {"gpurig_daemon": {"log-level": "loud"}}), "--only", "daemon",
                         "--diff", "--json", "out.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    step = json.loads((tmp_path / "out.json").read_text())["hosts"][0]["steps"][0]
    assert step["status"] == "failed" and "checked by dockerd --validate first" in step["changes"][0]["summary"]
    assert "dockerd refused the new /etc/docker/daemon.json, the old one stays: " in step["reason"]
    assert "loud" in step["reason"].split("the old one stays: ", 1)[1]  # dockerd's own line
    assert host.read("/etc/docker/daemon.json") == good_file
    assert host.sh("ls /etc/docker").stdout.split() == ["daemon.json"]  # no backup, no temp file: nothing was replaced
    assert host.sh("systemctl show docker -p ExecMainStartTimestamp").stdout == started  # never restarted
    assert host.sh("systemctl is-active docker").stdout.strip() == "active"
