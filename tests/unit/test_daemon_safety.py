"""Provision never breaks a working Docker: what the daemon step does on the host, run for real on this machine.

The keys are checked when the inventory is loaded (test_profile.py,
test_cli_provision.py); here: the host's own check of the new file before it
replaces the old one (``Upload.check``, dockerd --validate on Docker >= 23),
and the restart that puts the old file back when Docker does not come back.
The restart script runs against stand-ins for systemctl/service/journalctl/
docker that start "dockerd" only when the file holds no unknown log driver,
as dockerd 20.10 does, and say dockerd's own line when it does not.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.ssh import SSHSettings
from gpurig.errors import HostError
from gpurig.facts import parse_facts
from gpurig.inventory import Host
from gpurig.inventory.profile import host_profile
from gpurig.steps import DaemonStep, Upload
from gpurig.steps.commands import run_change
from gpurig.steps.daemon import VALIDATE, engine_version, restart_command

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
OLD = '{\n  "data-root": "/srv/docker",\n  "log-driver": "json-file"\n}\n'
BAD = '{\n  "data-root": "/srv/docker",\n  "log-driver": "no-such-driver"\n}\n'
GOOD = '{\n  "data-root": "/srv/docker",\n  "log-driver": "local"\n}\n'
DOCKERD_SAYS = "failed to start daemon: failed to set log opts: error looking up logging plugin no-such-driver: plugin not found"

# "dockerd" starts when the file names no unknown driver; its last words go to the log journalctl reads.
ENGINE = r"""#!/bin/sh
start() {
  if grep -q no-such-driver "$CONF" 2>/dev/null; then echo "$DOCKERD_SAYS" >> "$LOG"; rm -f "$RUNNING"; return 1; fi
  echo "API listen on /run/docker.sock" >> "$LOG"; : > "$RUNNING"; echo start >> "$STARTS"
}
case "$(basename "$0") $*" in
  "systemctl restart docker"|"service docker restart") start ;;
  "systemctl is-active --quiet docker") [ -e "$RUNNING" ] ;;
  "service docker status") tail -n 1 "$LOG" 2>/dev/null; [ -e "$RUNNING" ] ;;
  "systemctl reset-failed docker") : ;;
  "systemctl status docker"*) tail -n 1 "$LOG" ;;
  "journalctl "*) tail -n 1 "$LOG" ;;
  "docker version"*) [ -e "$RUNNING" ] ;;
  "docker info"*) grep -o '"log-driver": "[^"]*"' "$CONF" 2>/dev/null | cut -d'"' -f4 | tr '\n' ' ' | grep . || printf 'json-file '
                  echo "json-file local syslog" ;;
  *) echo "unexpected: $0 $*" >&2; exit 99 ;;
esac
"""


@pytest.fixture
def host(tmp_path):
    """A folder standing for /etc/docker and the stand-in tools on PATH; ``run(had, when)`` runs the restart script."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("systemctl", "service", "journalctl", "docker"):
        (bin_dir / tool).write_text(ENGINE)
        (bin_dir / tool).chmod(0o755)
    conf = tmp_path / "etc" / "daemon.json"
    conf.parent.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CONF": str(conf), "LOG": str(tmp_path / "log"),
           "RUNNING": str(tmp_path / "running"), "STARTS": str(tmp_path / "starts"), "DOCKERD_SAYS": DOCKERD_SAYS}
    (tmp_path / "running").touch()  # Docker runs on the old file

    def run(had: bool, only_if_running: bool = False) -> subprocess.CompletedProcess:
        line = restart_command(had, only_if_running, path=str(conf))
        return subprocess.run(["/bin/sh", "-c", line], env=env, capture_output=True, text=True, timeout=120)

    run.conf, run.starts = conf, tmp_path / "starts"
    return run


def installed(conf: Path, old: str | None, new: str) -> None:
    """What the install left before the restart: the old file as its newest backup, the new one in place."""
    if old is not None:
        (conf.parent / "daemon.json.gpurig-bak.20240101T000000Z").write_text("an older backup\n")
        (conf.parent / "daemon.json.gpurig-bak.20250101T000000Z").write_text(old)
    conf.write_text(new)


def test_a_restart_that_does_not_come_back_puts_the_old_file_back_and_says_dockerds_line(host):
    installed(host.conf, OLD, BAD)
    proc = host(had=True)
    assert proc.returncode == 1
    assert host.conf.read_text() == OLD  # Docker runs on its old file again
    assert host.starts.read_text().split() == ["start"]  # the second restart, on the old file, came back
    said = proc.stderr.strip().splitlines()[-1]
    assert "the old one is back and Docker runs on it again" in said and said.endswith(f"dockerd said: {DOCKERD_SAYS}")
    rejected = list(host.conf.parent.glob("daemon.json.gpurig-rejected.*"))
    assert len(rejected) == 1 and rejected[0].read_text() == BAD  # kept for the user to look at


def test_without_an_old_file_the_refused_one_is_moved_aside_and_docker_starts_on_its_defaults(host):
    installed(host.conf, None, BAD)
    proc = host(had=False)
    assert proc.returncode == 1 and DOCKERD_SAYS in proc.stderr
    assert not host.conf.exists()
    assert host.starts.read_text().split() == ["start"]


def test_an_old_backup_is_not_restored_on_a_host_that_had_no_daemon_json(host):
    """A ``.gpurig-bak.*`` from an earlier change (the file removed since) is not this host's state before the change."""
    installed(host.conf, OLD, BAD)  # backups of a daemon.json that was there once
    proc = host(had=False)
    assert proc.returncode == 1 and DOCKERD_SAYS in proc.stderr
    assert not host.conf.exists()  # Docker is back on its defaults, not on a file from the past
    assert host.starts.read_text().split() == ["start"]


def test_a_good_file_is_kept_and_docker_restarted_once(host):
    installed(host.conf, OLD, GOOD)
    proc = host(had=True)
    assert proc.returncode == 0, proc.stderr
    assert host.conf.read_text() == GOOD and host.starts.read_text().split() == ["start"]
    assert not list(host.conf.parent.glob("*.gpurig-rejected.*"))


def test_an_engine_that_starts_without_its_log_driver_did_not_come_back(host):
    """dockerd 20.10 starts with "log-driver": "no-such-driver" and then fails every container: that is put back too."""
    installed(host.conf, OLD, '{"log-driver": "no-such-plugin"}\n')
    proc = host(had=True)
    assert proc.returncode == 1 and host.conf.read_text() == OLD
    assert proc.stderr.strip().endswith("dockerd said: dockerd started, but has no log driver named 'no-such-plugin' "
                                        "(it has: json-file local syslog), so no container would start")


def test_when_the_old_file_fails_too_both_reasons_are_said(host):
    installed(host.conf, BAD, BAD)
    proc = host(had=True)
    assert proc.returncode == 1
    said = proc.stderr.strip().splitlines()[-1]
    assert "nor with the old one put back" in said and said.count(DOCKERD_SAYS) == 2


def test_a_stopped_docker_is_not_started_when_only_a_running_one_is_to_restart(host):
    installed(host.conf, OLD, BAD)
    os.unlink(host.conf.parent.parent / "running")
    proc = host(had=True, only_if_running=True)
    assert proc.returncode == 0 and not host.starts.exists() and host.conf.read_text() == BAD


@pytest.fixture
def conn(tmp_path):
    connector = Connector(SSHSettings(project_known_hosts=tmp_path / "known_hosts", user_known_hosts=None, ssh_config=None))
    with connector.open(Host("local", (), {}, connection="local")) as c:
        yield c


REFUSE = ('grep -q no-such-driver "$1" && { echo "unable to configure the Docker daemon with file $1: '
          'no log driver named no-such-driver" >&2; exit 1; }; echo "configuration OK"')


def test_a_file_the_check_refuses_never_replaces_the_old_one(conn, tmp_path):
    target = tmp_path / "daemon.json"
    target.write_text(OLD)
    with pytest.raises(HostError) as err:
        run_change(conn, "merge into daemon.json", (Upload(str(target), content=BAD, check=REFUSE),))
    assert target.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]  # no backup, no temp file
    assert err.value.problem == (f"could not merge into daemon.json: exited 1: grep refused the new {target}, the old one stays: "
                                 f"unable to configure the Docker daemon with file {target} (new): no log driver named no-such-driver")


def test_a_file_the_check_accepts_replaces_the_old_one(conn, tmp_path):
    target = tmp_path / "daemon.json"
    target.write_text(OLD)
    run_change(conn, "merge into daemon.json", (Upload(str(target), content=GOOD, check=REFUSE),))
    assert target.read_text() == GOOD and len(list(tmp_path.glob("daemon.json.gpurig-bak.*"))) == 1


def plan(facts_name: str, daemon: dict):
    facts = parse_facts((FACTS / f"{facts_name}.txt").read_text())
    return facts, DaemonStep().plan(facts, host_profile(Host("h", (), {"gpurig_daemon": daemon}), "hosts.yaml"))


@pytest.mark.parametrize("facts_name, version, checked", [
    ("h100-driver535-docker-nvidia", (24, 0), True),  # running 24.0.7
    ("a100-driver550-open-docker-stopped", (26, 1), True),  # stopped: the docker-ce package's 5:26.1.4
    ("debian12-root", (20, 10), False),  # Debian 12's docker.io: no --validate
])
def test_the_engine_checks_the_file_where_it_can(facts_name, version, checked):
    facts, p = plan(facts_name, {"log-driver": "local"})
    assert engine_version(facts) == version
    upload = p.changes[0].written
    assert upload is not None and upload.check == (VALIDATE if checked else "")
    assert ("cannot check the file before it is used" in p.reason) is not checked


def test_the_restart_puts_the_old_file_back_only_when_there_was_one():
    _, merged = plan("debian12-daemon-user-keys", {"log-driver": "local"})
    _, created = plan("debian12-root", {"log-driver": "local"})
    assert "gpurig-restart-docker /etc/docker/daemon.json yes always" in str(merged.changes[1].commands[0])
    assert "gpurig-restart-docker /etc/docker/daemon.json no always" in str(created.changes[1].commands[0])


def test_proxy_credentials_in_daemon_json_reach_the_host_by_file_only():
    """daemon.json content is an Upload's (SFTP into a 0700 staging folder), never part of a shell line."""
    secret = "http://alice:s3cret@proxy.example.com:3128"
    _, p = plan("debian12-root", {"proxies": {"http-proxy": secret}})
    assert secret in (p.changes[0].content or "")
    for change in p.changes:
        for command in change.commands:
            line = command.line if hasattr(command, "line") else install_line(command)
            assert "s3cret" not in line


def install_line(upload: Upload) -> str:
    from gpurig.steps.commands import install_file_command

    return install_file_command(upload.remote, "/tmp/gpurig-upload.x/daemon.json", check=upload.check)


@pytest.mark.parametrize("server_version, checked", [
    ("23.0.0", True),  # the first engine with dockerd --validate
    ("23.0.6", True),
    ("20.10.24", False),  # the last release before it (22.06 was a beta only)
])
def test_docker_23_0_itself_checks_the_file_before_it_is_used(server_version, checked):
    facts = parse_facts((FACTS / "h100-driver535-docker-nvidia.txt").read_text())
    facts = dataclasses.replace(facts, docker=dataclasses.replace(facts.docker, server_version=server_version))
    p = DaemonStep().plan(facts, host_profile(Host("h", (), {"gpurig_daemon": {"log-driver": "local"}}), "hosts.yaml"))
    upload = p.changes[0].written
    assert upload is not None and upload.check == (VALIDATE if checked else "")
    assert ("checked by dockerd --validate first" in p.changes[0].summary) is checked
    engine = ".".join(server_version.split(".")[:2])
    assert (f"Docker {engine} cannot check the file before it is used" in p.reason) is not checked
