"""Three fresh systemd hosts shaped for a Slurm cluster: a controller and two GPU nodes with stand-in GPUs, on one network.

The hosts are tests/integration/systemd_kit.py's (Debian 12 or 13, sshd, sudo
user ``gpurig``), started on a user-defined Docker network of their own so
they resolve each other by name (Docker's DNS), each with its hostname equal
to its container name (Slurm's NodeName must be the hostname). Names are
unique per cluster (``gpurig-slurm-<session>-<random>-ctl|n1|n2``): Slurm
22.05 on cgroup v1 builds its job tree at ``/sys/fs/cgroup/*/slurm_<node>`` on
the machine's shared hierarchy, which outlives the container, so two clusters
with one node name would share it; ``remove`` rmdirs those trees.

The nodes get what a GPU host has and this machine cannot, put in through
the test's own ``docker exec``, never through gpurig: the stand-in
``nvidia-smi`` (two A100s) and container-toolkit binaries of
tests/integration/deploy/gpuhost.py, and the device files ``/dev/nvidia0``,
``/dev/nvidia1`` (char 195:0, 195:1) and ``/dev/nvidiactl`` (195:255). Those
live in the container's /dev and vanish when it restarts, so a oneshot unit
(``gpurig-test-gpus.service``, ordered before slurmd and docker, as a driver
makes them at boot) makes them at every boot, and ``make_devices`` makes them
again on demand. Nothing of Slurm, munge or Docker is installed here: that is
what `gpurig provision` does under test (``write`` gives it the inventory);
``make_job_image`` then puts a tiny image into each node's engine.

The stand-in nvidia-smi answers no ``-q -x``, so gpurig's host probe
(checks/verify_host.py, which Slurm runs through checks/slurm_health.py) is
given recorded outputs instead: ``replay_probe`` writes them on a node and
names them in /etc/gpurig/slurm-health.args, the admin's file that
slurm_health.py passes to the probe. The `nvidia-smi -q -x` replayed is
derived from tests/fixtures/verify/a100-sxm4-mig-535.xml (a real A100
capture): its one <gpu> copied for the two stand-in GPUs (their index, UUID
and bus id) and the driver set to the stand-in's, so the probe sees what
gpurig's facts see; the kernel log is a recorded one (dmesg-xid.txt: Xid
48, 63, 79, so host.xid fails).
"""

from __future__ import annotations

import copy
import fcntl
import os
import subprocess
import tempfile
import time
import uuid
import warnings
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from deploy.gpuhost import DEFAULT_DRIVER, FAKE_GPUS, JOB_BINARIES, install_standins, make_probe_image
from systemd_kit import SystemdHosts, authorized_keys

REPO = Path(__file__).resolve().parents[2]
VERIFY_FIXTURES = REPO / "tests" / "fixtures" / "verify"

CONTROLLER_GROUP = "slurm_controller"
NODES_GROUP = "slurm_nodes"
NODE_COUNT = 2
JOB_IMAGE = "gpurig-test-job:1"
# (file under /dev, major, minor): what the NVIDIA driver makes for two GPUs
DEVICES = (("nvidia0", 195, 0), ("nvidia1", 195, 1), ("nvidiactl", 195, 255))
CGROUP_ROOT = Path("/sys/fs/cgroup")
REPLAY_DIR = "/etc/gpurig-test/replay"
HEALTH_ARGS = "/etc/gpurig/slurm-health.args"

MAKE_DEVICES = "#!/bin/sh\n# gpurig test stand-in: the device files the NVIDIA driver makes for two GPUs (no driver behind them).\nset -e\n" + "".join(
    f"[ -c /dev/{name} ] || mknod -m 0666 /dev/{name} c {major} {minor}\n" for name, major, minor in DEVICES)
DEVICES_SCRIPT = "/usr/local/sbin/gpurig-test-gpus"
DEVICES_UNIT = f"""\
[Unit]
Description=gpurig test: stand-in NVIDIA device files, made at boot as the driver makes them
DefaultDependencies=no
Before=slurmd.service docker.service
After=systemd-tmpfiles-setup-dev.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={DEVICES_SCRIPT}

[Install]
WantedBy=multi-user.target
"""


@dataclass
class SlurmHosts:
    """One cluster's hosts: ``controller`` and ``nodes``, on Docker network ``network``, reachable over SSH on 127.0.0.1."""

    network: str
    controller: Any  # ContainerHost (tests/integration/conftest.py)
    nodes: list
    maker: Any = field(repr=False, default=None)  # the SystemdHosts that made them, for restart

    @property
    def hosts(self) -> list:
        return [self.controller, *self.nodes]

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def write(self, path: Path, extra_vars: dict | None = None) -> Path:
        """An Ansible YAML inventory at ``path``: group slurm_controller (the controller), slurm_nodes (the nodes), each
        host by its hostname at 127.0.0.1:<published port>, the kit's user and key, become true, ``extra_vars`` in
        all.vars. Write it again after ``restart``: a restarted host's port may change."""
        def hosts(group: list) -> dict:
            return {h.name: {"ansible_host": "127.0.0.1", "ansible_port": h.port} for h in group}

        first = self.controller
        doc = {"all": {
            "vars": {"ansible_user": first.user, "ansible_ssh_private_key_file": str(first.key), "ansible_become": True,
                     **(extra_vars or {})},
            "children": {CONTROLLER_GROUP: {"hosts": hosts([self.controller])}, NODES_GROUP: {"hosts": hosts(self.nodes)}},
        }}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def ssh(self, host, command: str, check: bool = True, input: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        """``command`` run over SSH as the sudo user (as gpurig reaches the host), not through gpurig."""
        argv = ["ssh", "-q", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10",
                "-i", str(host.key), "-p", str(host.port), f"{host.user}@127.0.0.1", command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {host.name} {command!r} exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-800:]}")
        return proc

    def make_devices(self, node=None) -> None:
        """The stand-in GPU device files on ``node`` (default: every node), where missing: after a restart the boot unit
        makes them, this makes sure (and puts back one a test removed)."""
        for host in [node] if node is not None else self.nodes:
            host.sh(DEVICES_SCRIPT)

    def make_job_image(self, ref: str = JOB_IMAGE, binaries: tuple[str, ...] | None = None) -> str:
        """A few-MB image ``ref`` in each node's own engine, from the node's binaries (gpuhost.JOB_BINARIES: sh, sleep,
        cat, env, ls, ...). Needs Docker on the nodes: `gpurig provision --group slurm_nodes --only docker` first."""
        for node in self.nodes:
            engine = node.sh("docker info --format '{{.ServerVersion}}'", check=False)
            if engine.returncode != 0:
                raise AssertionError(f"no Docker engine answers on {node.name}: provision it first "
                                     f"(gpurig provision --group {NODES_GROUP} --only docker): {engine.stderr.strip()[-300:]}")
            make_probe_image(node, ref, binaries or JOB_BINARIES)
        return ref

    def replay_probe(self, node, dmesg: str = "dmesg-clean.txt", smi: str | None = None) -> None:
        """Make ``node``'s host probe replay two A100s on the stand-in's driver and the kernel log
        tests/fixtures/verify/``dmesg`` (dmesg-xid.txt: host.xid fails), or ``smi`` from there instead of the A100s
        (nvidia-smi-no-driver.txt: host.driver fails), through /etc/gpurig/slurm-health.args. Call again to switch."""
        xml = (VERIFY_FIXTURES / smi).read_text() if smi else two_a100s_xml()
        node.write(f"{REPLAY_DIR}/nvidia-smi-q-x.xml", xml)
        node.write(f"{REPLAY_DIR}/proc-version", f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DEFAULT_DRIVER}  "
                   "Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:05:07 UTC 2025\n"
                   "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n")
        node.write(f"{REPLAY_DIR}/dmesg", (VERIFY_FIXTURES / dmesg).read_text())
        for *_, bus in FAKE_GPUS:  # sysfs's folder per PCI function: an NVIDIA 3D controller each
            node.write(f"{REPLAY_DIR}/pci/{bus[4:].lower()}/vendor", "0x10de\n")
            node.write(f"{REPLAY_DIR}/pci/{bus[4:].lower()}/class", "0x030200\n")
        node.write(HEALTH_ARGS, "".join(f"{a}\n" for a in (
            "--source", "smi", "--smi-xml", f"{REPLAY_DIR}/nvidia-smi-q-x.xml", "--proc-version", f"{REPLAY_DIR}/proc-version",
            "--dmesg", f"{REPLAY_DIR}/dmesg", "--pci-devices", f"{REPLAY_DIR}/pci")))

    def restart(self, host):
        """``host`` stopped and started again (its SSH port may change, the stand-in devices are made again); the new
        handle replaces the old one here. Rewrite the inventory afterwards."""
        self.maker.docker("stop", "-t", "10", host.cid)
        fresh = self.maker.restart(host)
        if host is self.controller:
            self.controller = fresh
        else:
            self.nodes[self.nodes.index(host)] = fresh
            wait_active(fresh, "gpurig-test-gpus.service")
        return fresh


class SlurmKit:
    """Makes clusters of fresh hosts on networks of their own; ``remove`` takes away every one it made.

    One worker of a test run at a time has clusters: while any cluster this kit made lives, it holds the run's
    Slurm lock, and another worker's ``make`` waits for it (bounded by the test's timeout). Two clusters side by
    side on one machine are not what these tests check (the hosts share the machine's cgroup tree, where Slurm and
    systemd keep their units), and the suite's workers each take a module, so the three Slurm modules may run at once.
    """

    def __init__(self, docker, kit, images, key: Path, folder: Path) -> None:
        self.docker, self.kit = docker, kit
        keys = authorized_keys(folder / "authorized_keys", kit.login, key)
        self.maker = SystemdHosts(docker, kit, images, keys, key)
        self.clusters: list[SlurmHosts] = []
        self.networks: list[str] = []
        self._held = None  # the run's Slurm lock file, open and locked while this worker has clusters

    def _take_turn(self) -> None:
        if self._held is None:
            held = open(Path(tempfile.gettempdir()) / f"gpurig-test-{self.kit.run}-slurm.lock", "w")
            fcntl.flock(held, fcntl.LOCK_EX)  # waits for the worker whose clusters live; pytest-timeout bounds it
            self._held = held

    def _end_turn(self) -> None:
        if self._held is not None and not self.clusters:
            self._held.close()  # closing the file releases the lock
            self._held = None

    def make(self, os_key: str = "debian12", storage: str = "tmpfs") -> SlurmHosts:
        """Three booted hosts (controller, node 1, node 2) answering SSH, the nodes with their stand-in GPUs."""
        self._take_turn()
        before = len(self.clusters)
        try:
            prefix = f"gpurig-slurm-{self.kit.session[:6]}-{uuid.uuid4().hex[:4]}"
            network = prefix
            self.docker("network", "create", "--label", f"{self.kit.label}={self.kit.session}", network)
            self.networks.append(network)
            names = [f"{prefix}-ctl", *(f"{prefix}-n{i}" for i in range(1, NODE_COUNT + 1))]
            with ThreadPoolExecutor(len(names)) as pool:
                made = list(pool.map(lambda name: self.maker.make(os_key, storage, network=network, name=name), names))
            cluster = SlurmHosts(network, made[0], made[1:], self.maker)
            self.clusters.append(cluster)
            for node in cluster.nodes:
                gpu_node(node)
            return cluster
        except BaseException:  # no fixture will remove what failed half-way: it goes now, and the turn passes on
            for one in self.clusters[before:]:
                self.remove(one)
            self._end_turn()
            raise

    def remove(self, cluster: SlurmHosts | None = None) -> None:
        """``cluster`` (default: all made here): its containers, its network, the Slurm cgroup trees its names left."""
        for one in [cluster] if cluster is not None else list(self.clusters):
            for host in one.hosts:
                self.docker("rm", "-f", "-v", host.cid, check=False)
                if host.cid in self.maker.made:
                    self.maker.made.remove(host.cid)
            self.docker("network", "rm", one.network, check=False)
            if one.network in self.networks:
                self.networks.remove(one.network)
            left = [d for name in one.names for d in remove_slurm_cgroups(name)]
            if left:
                warnings.warn(f"Slurm cgroups left on this machine (still in use?): {left[:5]}", stacklevel=2)
            self.clusters.remove(one)
        if cluster is None:
            self.maker.remove()  # a host whose make failed half-way
            for network in self.networks:
                self.docker("network", "rm", network, check=False)
            self.networks.clear()
        self._end_turn()


def gpu_node(host) -> None:
    """The stand-ins of a GPU host on ``host``: nvidia-smi (two A100s), the toolkit's hook and runtime, the device files
    (made now and at every boot)."""
    install_standins(host)
    host.write(DEVICES_SCRIPT, MAKE_DEVICES, "0755")
    host.write("/etc/systemd/system/gpurig-test-gpus.service", DEVICES_UNIT)
    host.sh("systemctl daemon-reload && systemctl enable --now -q gpurig-test-gpus.service")


def two_a100s_xml() -> str:
    """`nvidia-smi -q -x` for the two stand-in A100s: the recorded A100's <gpu> once per stand-in GPU (index, UUID, bus)."""
    log = ET.fromstring((VERIFY_FIXTURES / "a100-sxm4-mig-535.xml").read_text())
    recorded = log.find("gpu")
    log.remove(recorded)
    log.find("driver_version").text = DEFAULT_DRIVER
    log.find("attached_gpus").text = str(len(FAKE_GPUS))
    for index, name, uuid_, _, bus in FAKE_GPUS:
        gpu = copy.deepcopy(recorded)
        gpu.set("id", bus)
        gpu.find("product_name").text = name
        gpu.find("uuid").text = uuid_
        gpu.find("minor_number").text = str(index)
        gpu.find("pci/pci_bus_id").text = bus
        gpu.find("pci/pci_bus").text = bus.split(":")[1]
        log.append(gpu)
    return '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n' + ET.tostring(log, encoding="unicode")


def wait_active(host, unit: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while host.sh(f"systemctl is-active -q {unit}", check=False).returncode != 0:
        if time.monotonic() > end:
            raise AssertionError(f"{unit} is not active on {host.name}: {host.sh(f'systemctl status {unit}', check=False).stdout[-800:]}")
        time.sleep(0.2)  # polling interval while the host boots, not a synchronisation sleep


def remove_slurm_cgroups(node: str, root: Path = CGROUP_ROOT) -> list[str]:
    """rmdir the cgroup trees Slurm made for ``node`` on this machine (``<root>/<controller>/slurm_<node>``, and
    ``<root>/slurm_<node>`` on a unified hierarchy), deepest first; returns the folders that could not go."""
    left = []
    for top in [*root.glob(f"*/slurm_{node}"), *root.glob(f"slurm_{node}")]:
        for folder, _, _ in os.walk(top, topdown=False):
            try:
                os.rmdir(folder)
            except OSError:
                left.append(folder)
    return left
