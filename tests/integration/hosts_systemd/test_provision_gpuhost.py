"""The GPU-host traps applied for real on Debian 12 and 13 hosts that boot systemd: daemon.json's cgroupfs and the apt hold.

These hosts have no GPU, so the facts are told there is one the way the other
provision tests do: a recorded A100 `lspci` line and an `nvidia-smi` that
prints the query rows of a real A100 on driver 550.54.15 (the loaded
driver the steps need). The driver's package is a stand-in .deb built here
with dpkg-deb (NVIDIA's cannot be downloaded); dpkg, apt-mark, apt-config,
systemd and dockerd are the hosts' own. Docker is set to the systemd cgroup
driver by hand and stopped, as on a host that followed a Kubernetes guide;
with no nvidia-ctk installed, the gpu-devices step must move it to cgroupfs.

Why the daemon-reload trap itself is not reproduced here: it needs runc's
systemd cgroup driver to hand a container's device rules to systemd, which a
daemon-reload then re-applies from /dev/char names; inside these test hosts
systemd runs in a container on this machine's cgroup v1 hierarchy, where the
device rules of a nested container are the outer Docker's, and a stand-in
/dev/nvidia0 (mknod 195:0 with no driver behind it) answers ENXIO whether or
not the cgroup allows it, so a reachable node and a lost one cannot be told
apart. The trap is covered by the facts (the links and the cgroup driver)
and the plans from recorded GPU hosts (tests/operations/gpu-devices).
"""

from __future__ import annotations

import json
import subprocess

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
    host.docker("cp", stand_in_driver_package(tmp_path), f"{host.cid}:/tmp/driver.deb")
    host.sh("dpkg -i /tmp/driver.deb && rm /tmp/driver.deb")
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
