"""The GPU-host traps for real on Debian 12 and 13 hosts that boot systemd: the daemon-reload trap, cgroupfs, the apt hold.

These hosts have no GPU, so the facts are told there is one the way the other
provision tests do: a recorded A100 `lspci` line and an `nvidia-smi` that
prints the query rows of a real A100 on driver 550.54.15 (the loaded
driver the steps need). The driver's package is a stand-in .deb built here
with dpkg-deb (NVIDIA's cannot be downloaded); dpkg, apt-mark, apt-config,
systemd, dockerd and runc are the hosts' own. Docker is set to the systemd
cgroup driver by hand, as on a host that followed a Kubernetes guide.

The daemon-reload trap is reproduced with a stand-in device node: `mknod
/dev/nvidia0 c 195 0` with no driver behind it. Opening it in a container
that was given it answers "No such device or address" (ENXIO) while the
container's device cgroup allows it, and "Operation not permitted" (EPERM)
once the cgroup denies it, so the two cases can be told apart without a GPU.
What cannot be reproduced here is NVIDIA's own fix, nvidia-ctk making the
links from the driver's device list: the links are made by hand with `ln`,
as `nvidia-ctk system create-dev-char-symlinks` makes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import inventory_for

pytestmark = pytest.mark.integration
A100_LSPCI = "07:00.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 SXM4 80GB] [10de:20b2] (rev a1)"
UUID = "GPU-00000000-5c1e-4b2a-9d3f-a1b2c3d4e5f6"
NVIDIA_SMI = f"""#!/bin/sh
# gpurig test stand-in for nvidia-smi (not a GPU): one A100's rows in the format real ones print.
case "$*" in
  *index,name,uuid,memory.total,driver_version,pci.bus_id*) echo "0, NVIDIA A100-SXM4-80GB, {UUID}, 81920, 550.54.15, 00000000:07:00.0" ;;
  *persistence_mode,mig.mode.current,mig.mode.pending*) echo "0, {UUID}, Enabled, Disabled, Disabled" ;;
  -L) echo "GPU 0: NVIDIA A100-SXM4-80GB (UUID: {UUID})" ;;
  *) echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."; exit 2 ;;
esac
"""


def steps_of(report_file) -> dict[str, tuple[str, str]]:
    host = json.loads(report_file.read_text())["hosts"][0]
    return {s["step"]: (s["status"], s["reason"]) for s in host["steps"]}


def stand_in_driver_package(folder) -> str:
    """A .deb named libnvidia-compute-550-server 550.54.15 (what Ubuntu's driver holds its CUDA libraries in)."""
    root = folder / "build"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: libnvidia-compute-550-server\nVersion: 550.54.15-0ubuntu1\nArchitecture: all\n"
        "Maintainer: gpurig tests <t@example.com>\nDescription: stand-in for the driver's library package in gpurig's tests\n")
    deb = folder / "libnvidia-compute-550-server_550.54.15-0ubuntu1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True)
    return str(deb)


@pytest.mark.parametrize("os_key", ["debian12", "debian13"])
def test_cgroupfs_and_the_driver_hold_are_applied_then_all_ok(systemd_hosts, provision_cli, tmp_path, os_key):
    host = systemd_hosts.make(os_key)
    inventory = inventory_for(tmp_path / "inventory" / "hosts.yaml", host)
    docker = provision_cli(inventory, "--only", "docker")
    assert docker.returncode == 0, docker.stdout + docker.stderr
    host.write("/usr/local/bin/lspci", f"#!/bin/sh\necho '{A100_LSPCI}'\n", mode="0755")
    host.write("/usr/local/bin/nvidia-smi", NVIDIA_SMI, mode="0755")
    host.docker("cp", stand_in_driver_package(tmp_path), f"{host.cid}:/var/tmp/driver.deb")  # /tmp is a tmpfs on Debian 13
    host.sh("dpkg -i /var/tmp/driver.deb && rm /var/tmp/driver.deb")
    host.write("/etc/docker/daemon.json", '{\n  "log-driver": "local",\n  "exec-opts": ["native.cgroupdriver=systemd"]\n}\n', mode="0644")
    host.sh("systemctl stop docker.socket docker")

    check = provision_cli(inventory, "--only", "gpu-devices,driver-hold", "--check", "--diff")
    assert check.returncode == 0, check.stdout + check.stderr
    assert '+    "native.cgroupdriver=cgroupfs"' in check.stdout and host.sh("apt-mark showhold").stdout == ""

    first = provision_cli(inventory, "--only", "gpu-devices,driver-hold", "--json", "first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    steps = steps_of(tmp_path / "first.json")
    assert steps["gpu-devices"][0] == "changed" and "nvidia-ctk is not installed" in steps["gpu-devices"][1]
    assert steps["driver-hold"][0] == "changed"
    assert json.loads(host.read("/etc/docker/daemon.json")) == {"log-driver": "local", "exec-opts": ["native.cgroupdriver=cgroupfs"]}
    host.sh("systemctl start docker")
    assert host.sh("docker info --format '{{.CgroupDriver}} {{.LoggingDriver}}'").stdout.split() == ["cgroupfs", "local"]
    assert host.sh("apt-mark showhold").stdout.split() == ["libnvidia-compute-550-server"]
    blacklist = host.sh("apt-config dump | grep '^Unattended-Upgrade::Package-Blacklist::'").stdout.splitlines()
    assert 'Unattended-Upgrade::Package-Blacklist:: "libnvidia-";' in blacklist

    second = provision_cli(inventory, "--only", "gpu-devices,driver-hold", "--json", "second.json")
    assert second.returncode == 0, second.stdout + second.stderr
    again = steps_of(tmp_path / "second.json")
    assert again == {"gpu-devices": ("ok", "Docker uses the cgroupfs cgroup driver: systemctl daemon-reload leaves running containers "
                                            "their GPUs"),
                     "driver-hold": ("ok", "libnvidia-compute-550-server held and blacklisted for unattended-upgrades")}


MINI_IMAGE = ("rm -rf /var/tmp/mini && mkdir -p /var/tmp/mini/bin /var/tmp/mini/lib64 /var/tmp/mini/lib/x86_64-linux-gnu && "
              "cp /bin/dash /var/tmp/mini/bin/sh && cp /lib/x86_64-linux-gnu/libc.so.6 /var/tmp/mini/lib/x86_64-linux-gnu/ && "
              "cp /lib64/ld-linux-x86-64.so.2 /var/tmp/mini/lib64/ && tar -C /var/tmp/mini -c . | docker import - gpurig-mini && "
              "rm -rf /var/tmp/mini")  # the host's own dash as an image: the inner Docker has no registry to pull from


def test_daemon_reload_takes_the_gpu_from_a_container_until_gpu_devices_moves_docker_to_cgroupfs(systemd_hosts, provision_cli, tmp_path):
    host = systemd_hosts.make("debian12")
    inventory = inventory_for(tmp_path / "inventory" / "hosts.yaml", host)
    docker = provision_cli(inventory, "--only", "docker")
    assert docker.returncode == 0, docker.stdout + docker.stderr
    host.write("/usr/local/bin/lspci", f"#!/bin/sh\necho '{A100_LSPCI}'\n", mode="0755")
    host.write("/usr/local/bin/nvidia-smi", NVIDIA_SMI, mode="0755")
    host.write("/etc/docker/daemon.json", '{"exec-opts": ["native.cgroupdriver=systemd"]}\n', mode="0644")
    host.sh("systemctl restart docker && mknod -m 0666 /dev/nvidia0 c 195 0 && " + MINI_IMAGE)
    assert host.sh("docker info --format '{{.CgroupDriver}}'").stdout.strip() == "systemd"

    def open_error(container: str) -> str:
        host.sh(f"docker run -d -i --name {container} --device /dev/nvidia0 gpurig-mini /bin/sh")
        before = host.sh(f"docker exec {container} /bin/sh -c 'exec 3</dev/nvidia0'", check=False).stderr
        host.sh("systemctl daemon-reload")
        after = host.sh(f"docker exec {container} /bin/sh -c 'exec 3</dev/nvidia0'", check=False).stderr
        assert "No such device or address" in before, before  # allowed by the cgroup; no driver behind the stand-in
        return after

    assert "Operation not permitted" in open_error("trapped")  # the trap: the device rule is gone after daemon-reload
    # gpurig's facts see it (--full: the traps' probes): a node, no /dev/char link to it, Docker set to systemd
    facts = subprocess.run([sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)", "facts", "--full",
                            "--inventory", str(inventory), "--json", "facts.json"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert facts.returncode == 0, facts.stdout + facts.stderr
    data = json.loads((tmp_path / "facts.json").read_text())["hosts"][0]["data"]
    assert data["gpuhost"]["dev_char"] == {"nodes": ["/dev/nvidia0"], "links": [], "rules": []}
    assert data["daemon_json"]["content"]["exec-opts"] == ["native.cgroupdriver=systemd"]  # the login user is not in the docker group

    first = provision_cli(inventory, "--only", "gpu-devices", "--json", "first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert steps_of(tmp_path / "first.json")["gpu-devices"][0] == "changed"
    assert host.sh("docker info --format '{{.CgroupDriver}}'").stdout.strip() == "cgroupfs"  # restarted on the merged file
    second = provision_cli(inventory, "--only", "gpu-devices", "--json", "second.json")
    assert second.returncode == 0 and steps_of(tmp_path / "second.json")["gpu-devices"][0] == "ok"
    host.sh("docker rm -f trapped")
    assert "No such device or address" in open_error("cgroupfs")  # daemon-reload no longer touches the device rules

    # NVIDIA's other fix, on the systemd driver again: the /dev/char link (made by hand as nvidia-ctk makes it) keeps the rule
    host.write("/etc/docker/daemon.json", '{"exec-opts": ["native.cgroupdriver=systemd"]}\n', mode="0644")
    host.sh("docker rm -f cgroupfs && systemctl restart docker && mkdir -p /dev/char && ln -s ../nvidia0 /dev/char/195:0")
    assert "No such device or address" in open_error("linked")
