"""`gpurig provision` on fresh Debian 12 and Debian 13 hosts that boot systemd: Docker installed for real, over SSH and sudo.

The tests look at each host through `docker exec`, not through gpurig. A
GPU is the one thing these hosts cannot have: the toolkit test gives one a
recorded `lspci` (an A100's lines) so the GPU steps run, and NVIDIA's
repository resolves to 127.0.0.1 there, as on an air-gapped host.
"""

from __future__ import annotations

import json
import time

import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.ssh import SSHSettings
from gpurig.inventory import load_inventory
from gpurig.inventory.profile import host_profile
from gpurig.steps import STEPS, converge

from .conftest import inventory_for

pytestmark = pytest.mark.integration
WANTED = {"default-shm-size": "1g", "log-driver": "local", "log-opts": {"max-file": "3"}}
VARS = {"gpurig_daemon": WANTED, "gpurig_docker": {"users": ["gpurig"]}}
GPU_STEPS = ("nouveau", "driver", "container-toolkit", "gpu-devices", "driver-hold", "fabric-manager", "mig", "persistence")
SNAPSHOT = ("dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' | sha256sum; "
            "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum")
A100_LSPCI = "07:00.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 SXM4 80GB] [10de:20b2] (rev a1)"


def steps_of(report_file) -> dict[str, tuple[str, str]]:
    host = json.loads(report_file.read_text())["hosts"][0]
    return {s["step"]: (s["status"], s["reason"]) for s in host["steps"]}


def converge_counting(inventory_path, tmp_path):
    """Converge every step in-process, recording each command gpurig sends: (statuses, kinds of command)."""
    inventory = load_inventory(inventory_path)
    host = next(iter(inventory.hosts.values()))
    settings = SSHSettings(project_known_hosts=tmp_path / "known_hosts", user_known_hosts=None, ssh_config=None,
                           allow_agent=False, look_for_keys=False)
    connector = Connector(settings)
    try:
        with connector.open(host) as conn:
            sent: list[str] = []
            run, sudo = conn.run, conn.sudo
            conn.run = lambda cmd, **kw: sent.append("run") or run(cmd, **kw)
            conn.sudo = lambda cmd, **kw: sent.append("sudo") or sudo(cmd, **kw)
            results = converge(conn, [cls() for cls in STEPS.values()], host_profile(host, inventory.path))
    finally:
        connector.close()
    return {r.step: r.status for r in results}, sent


@pytest.mark.parametrize("os_key", ["debian12", "debian13"])
def test_fresh_host_gets_docker_with_settings_then_all_ok(systemd_hosts, provision_cli, tmp_path, os_key):
    host = systemd_hosts.make(os_key)
    assert host.sh("command -v python3", check=False).returncode != 0  # a minimal server: sshd and sudo, no python3
    inventory = inventory_for(tmp_path / "inventory" / "hosts.yaml", host, VARS)
    first = provision_cli(inventory, "--diff", "--json", "first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    steps = steps_of(tmp_path / "first.json")
    assert steps["docker"][0] == "changed" and steps["daemon"][0] == "changed"
    assert steps["python3"] == ("changed", "no python3 on the host (gpurig's verify and monitor run their probes with it)")
    assert steps["gpus"] == ("skipped", "no NVIDIA GPU on this host")
    assert all(steps[s] == ("skipped", "no NVIDIA GPU on this host") for s in GPU_STEPS)
    assert "install docker.io" in first.stdout and '+    "log-driver": "local",' in first.stdout  # plan lines and the diff
    assert "changed=3" in first.stderr and "failed=0" in first.stderr

    assert host.sh("systemctl is-enabled docker; systemctl is-active docker").stdout.split() == ["enabled", "active"]
    assert host.sh("docker info --format '{{.LoggingDriver}}'").stdout.strip() == "local"  # restarted with the new file
    assert "docker" in host.sh("id -nG gpurig").stdout.split()

    statuses, sent = converge_counting(inventory, tmp_path)
    assert statuses == {"gpus": "skipped", **{s: "skipped" for s in GPU_STEPS}, "docker": "ok", "daemon": "ok", "python3": "ok",
                        "reboot": "ok"}
    assert sent == ["run"]  # one facts round trip, no changing command
    provisioned_host_is_verified_and_monitored(inventory, host.name, tmp_path)


def provisioned_host_is_verified_and_monitored(inventory, name: str, tmp_path) -> None:
    """What provision calls converged can be judged: verify's host probe runs there, the monitor samples it, facts says ready."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[3])
    # the checkout as the project: facts judges the host by its spec's default image (CUDA 13.0)
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200", "PYTHONPATH": repo, "GPURIG_ROOT": repo}
    env.pop("SSH_AUTH_SOCK", None)

    def gpurig(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)", *args, "--inventory", str(inventory)]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    facts = gpurig("facts", "--json", "facts.json")
    assert facts.returncode == 0, facts.stderr
    assert json.loads((tmp_path / "facts.json").read_text())["lacks"] == {name: ["no NVIDIA GPU"]}  # and not "no python3"

    verify = gpurig("verify", "--json", "verify.json")
    assert verify.returncode == 1 and "Traceback" not in verify.stderr, verify.stderr  # no GPU here: host.driver fails
    [report] = json.loads((tmp_path / "verify.json").read_text())["hosts"]
    records = {r["id"]: r["status"] for r in report["data"]["records"]}
    assert records["host.driver"] == "fail" and "host.probe" not in records, records  # the probe ran: no "no python3 on the host"

    monitor = gpurig("monitor", "--duration", "2", "--json", "monitor.json")
    assert monitor.returncode == 0, monitor.stdout + monitor.stderr
    watched = json.loads((tmp_path / "monitor.json").read_text())
    assert [h["status"] for h in watched["fleet"]["hosts"]] == ["ok"] and watched["hosts"][name]["samples"] >= 1, watched


def test_check_mode_changes_no_package_and_no_file(systemd_hosts, provision_cli, tmp_path):
    host = systemd_hosts.make("debian12")
    before = host.sh(SNAPSHOT).stdout
    proc = provision_cli(inventory_for(tmp_path / "inventory" / "hosts.yaml", host, VARS), "--check", "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "would change (check mode): Docker is not installed" in proc.stdout
    assert "+++ /etc/docker/daemon.json (gpurig)" in proc.stdout
    assert host.sh(SNAPSHOT).stdout == before
    assert host.sh("command -v dockerd", check=False).returncode != 0


def test_host_killed_mid_install_fails_cleanly_and_the_rerun_completes(systemd_hosts, provision_cli, tmp_path):
    host = systemd_hosts.make("debian12")
    inventory = tmp_path / "inventory" / "hosts.yaml"
    proc = provision_cli(inventory_for(inventory, host, VARS), "--json", "killed.json", wait=False)
    try:
        end = time.monotonic() + 120
        while host.sh("pgrep -a -x dpkg | grep -q -- --status-fd", check=False).returncode != 0:
            assert proc.poll() is None and time.monotonic() < end, "provision never reached dpkg unpacking Docker"
            time.sleep(0.1)  # polling interval while waiting for dpkg to start, not a synchronisation sleep
        host.docker("kill", host.cid)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err, out + err
    steps = steps_of(tmp_path / "killed.json")
    assert steps["docker"][0] == "failed"
    assert steps["docker"][1].startswith("could not install docker.io") and "connection to the host was lost" in steps["docker"][1]
    assert steps["daemon"] == ("skipped", "not run: step docker failed")

    host = systemd_hosts.restart(host)  # the same disk, booted again; dpkg was interrupted mid-install
    rerun = provision_cli(inventory_for(inventory, host, VARS), "--json", "rerun.json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert steps_of(tmp_path / "rerun.json")["docker"][0] == "changed"
    assert host.sh("systemctl is-active docker").stdout.strip() == "active"
    assert host.sh("docker info --format '{{.LoggingDriver}}'").stdout.strip() == "local"


def test_toolkit_with_nvidia_repository_unreachable_fails_with_the_air_gapped_fix(systemd_hosts, provision_cli, tmp_path):
    host = systemd_hosts.make("debian12")
    host.write("/usr/local/bin/lspci", f"#!/bin/sh\necho '{A100_LSPCI}'\n", mode="0755")  # recorded A100 output
    before = host.sh("ls /etc/apt/sources.list.d/ /usr/share/keyrings/").stdout
    proc = provision_cli(inventory_for(tmp_path / "inventory" / "hosts.yaml", host), "--only", "gpus,container-toolkit",
                         "--json", "out.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    steps = steps_of(tmp_path / "out.json")
    assert steps["gpus"] == ("ok", "1 NVIDIA GPU: GA100 [A100 SXM4 80GB]")
    status, reason = steps["container-toolkit"]
    assert status == "failed"
    assert reason.startswith("could not add NVIDIA's libnvidia-container apt repository")
    assert "nvidia.github.io" in reason  # the download's own last error line
    fix = {x["step"]: x["fix"] for x in json.loads((tmp_path / "out.json").read_text())["hosts"][0]["steps"]}["container-toolkit"]
    assert fix.startswith("the host cannot reach NVIDIA's repository") and "gpurig_toolkit.packages_dir" in fix
    assert host.sh("ls /etc/apt/sources.list.d/ /usr/share/keyrings/").stdout == before  # no list half-added


def stand_in_toolkit(folder) -> None:
    """A .deb named nvidia-container-toolkit 1.17.8-1 (NVIDIA's cannot be downloaded here): its nvidia-ctk prints the real version line."""
    import subprocess

    root = folder / "build"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: nvidia-container-toolkit\nVersion: 1.17.8-1\nArchitecture: all\nMaintainer: gpurig tests <t@example.com>\n"
        "Description: stand-in for NVIDIA's package in gpurig's air-gapped test\n")
    ctk = root / "usr" / "bin" / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\necho 'commit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d'\n")
    ctk.chmod(0o755)
    (folder / "debs").mkdir()
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(folder / "debs" / "nvidia-container-toolkit_1.17.8-1_all.deb")],
                   check=True, capture_output=True)


def test_air_gapped_toolkit_is_pushed_over_ssh_and_installed(systemd_hosts, provision_cli, tmp_path):
    host = systemd_hosts.make("debian12")
    host.write("/usr/local/bin/lspci", f"#!/bin/sh\necho '{A100_LSPCI}'\n", mode="0755")
    stand_in_toolkit(tmp_path)
    inventory = inventory_for(tmp_path / "inventory" / "hosts.yaml", host, {"gpurig_toolkit": {"packages_dir": str(tmp_path / "debs")}})
    first = provision_cli(inventory, "--only", "gpus,container-toolkit", "--json", "first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert steps_of(tmp_path / "first.json")["container-toolkit"] == ("changed", "nvidia-container-toolkit not installed")
    assert host.sh("dpkg-query -W -f '${Status} ${Version}' nvidia-container-toolkit").stdout == "install ok installed 1.17.8-1"
    assert json.loads(host.read("/etc/docker/daemon.json")) == {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    assert host.sh("find /tmp -name 'gpurig-toolkit-*' -o -name '*.deb'").stdout == ""  # what was pushed is gone
    second = provision_cli(inventory, "--only", "gpus,container-toolkit", "--json", "second.json")
    assert second.returncode == 0
    assert steps_of(tmp_path / "second.json")["container-toolkit"] == (
        "ok", "nvidia-container-toolkit 1.17.8-1 installed; Docker knows the nvidia runtime")
