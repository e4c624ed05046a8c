"""`gpurig provision --only daemon` against fresh container hosts over real SSH and sudo.

Converging twice: first `changed` with a diff, then `ok` with no changing
command; an existing daemon.json keeps the user's keys and is backed up;
--check changes nothing in /etc; an invalid daemon.json fails the step and
stays untouched. The tests look at the host through `docker exec`, not
through gpurig.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.ssh import SSHSettings
from gpurig.inventory import load_inventory
from gpurig.inventory.profile import host_profile
from gpurig.steps import DaemonStep, converge

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
WANTED = {"default-shm-size": "1g", "log-driver": "local", "log-opts": {"max-file": "3"}}
USER_FILE = '{\n  "data-root": "/srv/docker",\n  "log-opts": {"max-size": "10m"},\n  "runtimes": {"custom": {"path": "/usr/local/bin/custom-runc"}}\n}\n'
DAEMON_JSON = "/etc/docker/daemon.json"
ETC_SUM = "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"


def provision(cwd: Path, inventory: Path, *flags: str) -> subprocess.CompletedProcess:
    """`gpurig provision --only daemon` as a user runs it (HOME empty so the user's ~/.ssh stays out).

    These hosts run sshd without systemd or room for a Docker engine: the docker step is
    tested on the systemd hosts of tests/integration/hosts_systemd.
    """
    code = "import sys; from gpurig.cli import main; main(sys.argv)"
    env = {**os.environ, "HOME": str(cwd), "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    argv = [sys.executable, "-c", code, "provision", "--only", "daemon", "--inventory", str(inventory), *flags]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_fresh_host_changes_with_a_diff_then_is_ok(container_host, host_inventory, tmp_path):
    inventory = host_inventory({"gpurig_daemon": WANTED})
    first = provision(tmp_path, inventory, "--diff", "--json", "first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "changed" in first.stdout and "create /etc/docker/daemon.json" in first.stdout
    assert '+    "default-shm-size": "1g",' in first.stdout  # the unified diff
    assert "changed=1" in first.stderr and "failed=0" in first.stderr  # the recap
    assert json.loads(container_host.read(DAEMON_JSON)) == WANTED
    assert container_host.sh(f"stat -c '%a %U' {DAEMON_JSON}").stdout.split() == ["644", "root"]
    report = json.loads((tmp_path / "first.json").read_text())
    assert report["converged"] and report["hosts"][0]["steps"][0]["status"] == "changed"
    assert report["hosts"][0]["steps"][0]["changes"][0]["diff"].startswith("--- /dev/null")

    stat_before = container_host.sh(f"stat -c '%i %Y %Z' {DAEMON_JSON}").stdout
    second = provision(tmp_path, inventory, "--json", "second.json")
    assert second.returncode == 0, second.stdout + second.stderr
    steps = json.loads((tmp_path / "second.json").read_text())["hosts"][0]["steps"]
    assert [(s["step"], s["status"], s["changes"]) for s in steps] == [("daemon", "ok", [])]
    assert "ok=1" in second.stderr and "changed=0" in second.stderr
    assert container_host.sh(f"stat -c '%i %Y %Z' {DAEMON_JSON}").stdout == stat_before  # not even rewritten
    assert container_host.sh("ls /etc/docker").stdout.split() == ["daemon.json"]  # no backup, no temp file


def test_second_run_runs_only_the_facts_script(container_host, host_inventory, tmp_path):
    inventory = load_inventory(host_inventory({"gpurig_daemon": WANTED}))
    host = next(iter(inventory.hosts.values()))
    settings = SSHSettings(project_known_hosts=tmp_path / "known_hosts", user_known_hosts=None, ssh_config=None,
                           allow_agent=False, look_for_keys=False)
    connector = Connector(settings)
    try:
        runs = []
        for _ in range(2):
            with connector.open(host) as conn:
                commands: list[tuple[str, str]] = []
                # each pass records into its own list and calls its own connection's methods: bound as defaults
                conn.run = lambda cmd, _log=commands, _run=conn.run, **kw: _log.append(("run", cmd)) or _run(cmd, **kw)
                conn.sudo = lambda cmd, _log=commands, _sudo=conn.sudo, **kw: _log.append(("sudo", cmd)) or _sudo(cmd, **kw)
                results = converge(conn, [DaemonStep()], host_profile(host, inventory.path))
                runs.append(([r.status for r in results], [kind for kind, _ in commands]))
    finally:
        connector.close()
    # facts, a private staging folder, the write (content over SFTP, never in argv), facts again
    assert runs[0] == (["changed"], ["run", "run", "sudo", "run"])
    assert runs[1] == (["ok"], ["run"])  # facts only


def test_existing_file_keeps_user_keys_and_is_backed_up(container_host, host_inventory, tmp_path):
    container_host.write(DAEMON_JSON, USER_FILE, mode="0640")
    proc = provision(tmp_path, host_inventory({"gpurig_daemon": WANTED}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "merge into /etc/docker/daemon.json: add default-shm-size, log-driver, log-opts.max-file" in proc.stdout
    merged = json.loads(container_host.read(DAEMON_JSON))
    assert merged == {
        "data-root": "/srv/docker",
        "log-opts": {"max-size": "10m", "max-file": "3"},
        "runtimes": {"custom": {"path": "/usr/local/bin/custom-runc"}},
        "default-shm-size": "1g",
        "log-driver": "local",
    }
    assert container_host.sh(f"stat -c '%a %U' {DAEMON_JSON}").stdout.split() == ["640", "root"]
    backups = container_host.sh("ls /etc/docker/").stdout.split()
    backup = next(b for b in backups if b.startswith("daemon.json.gpurig-bak."))
    assert container_host.read(f"/etc/docker/{backup}") == USER_FILE
    assert sorted(backups) == sorted(["daemon.json", backup])


def test_check_mode_shows_the_diff_and_changes_nothing(container_host, host_inventory, tmp_path):
    container_host.write(DAEMON_JSON, USER_FILE)
    before = container_host.sh(ETC_SUM).stdout
    proc = provision(tmp_path, host_inventory({"gpurig_daemon": WANTED}), "--check", "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "would change (check mode)" in proc.stdout
    assert '+  "default-shm-size": "1g",' in proc.stdout and "-  " in proc.stdout
    assert container_host.sh(ETC_SUM).stdout == before
    assert container_host.read(DAEMON_JSON) == USER_FILE


def test_invalid_json_fails_and_is_left_untouched(container_host, host_inventory, tmp_path):
    broken = '{"log-driver": "json-file",}\n'
    container_host.write(DAEMON_JSON, broken)
    before = container_host.sh(ETC_SUM).stdout
    proc = provision(tmp_path, host_inventory({"gpurig_daemon": WANTED}), "--json", "out.json")
    assert proc.returncode == 1
    assert "not valid JSON" in proc.stdout and "never overwrites" in proc.stdout
    assert "failed=1" in proc.stderr and "Traceback" not in proc.stderr
    step = json.loads((tmp_path / "out.json").read_text())["hosts"][0]["steps"][0]
    assert step["status"] == "failed" and "Expecting property name enclosed in double quotes" in step["reason"]
    assert container_host.sh(ETC_SUM).stdout == before
    assert container_host.read(DAEMON_JSON) == broken


def test_a_login_user_without_become_gets_the_fix(container_host, host_inventory, tmp_path):
    proc = provision(tmp_path, host_inventory({"gpurig_daemon": WANTED, "ansible_become": False}), "--json", "out.json")
    assert proc.returncode == 1
    step = json.loads((tmp_path / "out.json").read_text())["hosts"][0]["steps"][0]
    assert step["status"] == "failed" and "Permission denied" in step["reason"]
    assert step["fix"].startswith("set ansible_become: true")
    assert container_host.read(DAEMON_JSON) is None
