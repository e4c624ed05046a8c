"""A host's ``gpurig_*`` inventory variables as one typed, validated ``HostProfile``.

The inventory stays Ansible's format; this module reads the variables gpurig
owns (every var named ``gpurig_*``) into frozen dataclasses that steps plan
from. A misspelt key, a wrong type (``true`` where a count belongs, ``"8"``
where a number belongs) or an unknown choice is one ``InventoryError`` naming
the inventory file, the host and the key path, with a did-you-mean and what
would be valid: never a silently ignored setting.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpurig.errors import InventoryError, did_you_mean
from gpurig.inventory import Host
from gpurig.inventory.daemonkeys import DAEMON_KEYS, DAEMON_KEYS_DOC
from gpurig.strict.validate import excerpt, free_text_problem, image_ref_problem, user_problem
from gpurig.strict.yamlnode import MAX_TEXT

DRIVER_SOURCES = ("distro", "nvidia")  # the OS's own packages, or NVIDIA's CUDA repository
DOCKER_SOURCES = ("distro", "docker")  # docker.io from the OS, or Docker's own repository

_SHM = re.compile(r"[0-9]+(?:\.[0-9]+)?[bkmgBKMG]?")
_RUNTIME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_CLUSTER = re.compile(r"[a-z][a-z0-9_-]{0,39}")  # slurm.conf's ClusterName: lower case (Slurm folds it), no spaces
_INTERFACES = re.compile(r"\^?=?[A-Za-z0-9_.:-]{1,15}(?:,[A-Za-z0-9_.:-]{1,15})*")  # NCCL_SOCKET_IFNAME's grammar
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")  # an IPv4/IPv6 address or a host name, nothing a shell reads
_BRANCH = re.compile(r"[0-9]{3}")
_TOOLKIT_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.~]+)?")


@dataclass(frozen=True)
class GpuExpectation:
    """What GPUs the inventory says the host has (None: not stated)."""

    count: int | None = None
    model: str | None = None
    mig: bool | None = None  # MIG mode wanted on every GPU; None: leave it as it is


@dataclass(frozen=True)
class DriverSettings:
    install: bool = False
    branch: str | None = None  # e.g. "550"; None: the newest the source offers
    source: str = "distro"
    auto_upgrade: bool = False  # true: the driver is left to apt and unattended-upgrades (no hold)


@dataclass(frozen=True)
class DockerSettings:
    source: str = "distro"
    users: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolkitSettings:
    version: str | None = None  # pin nvidia-container-toolkit; None: the newest
    packages_dir: str | None = None  # air-gapped: .deb files on this machine, pushed over SSH


@dataclass(frozen=True)
class SlurmSettings:
    """``gpurig_slurm``: the cluster's settings (read from the controller's vars; the groups say who is what)."""

    cluster: str = "gpurig"
    def_mem_per_cpu: int = 1024  # MiB a job gets per CPU unless it asks: without it one job takes a node's whole memory
    health_interval: int = 60  # seconds between two runs of gpurig's host probe on each node (HealthCheckInterval)
    min_job_age: int = 300  # seconds an ended job stays in slurmctld's memory (MinJobAge)
    rest: bool = False  # slurmrestd with JWT on the controller: gpurig run submits through it (else sbatch over SSH)


@dataclass(frozen=True)
class FabricSettings:
    """``gpurig_fabric``: how verify --level fabric reaches this host's rank (the first host's address and port are the rendezvous')."""

    interface: str | None = None  # NCCL_SOCKET_IFNAME's grammar (eth0, ib, ^docker,lo): becomes NCCL_ and GLOO_SOCKET_IFNAME
    address: str | None = None  # the rendezvous address when this host is rank 0; else its address on the interface
    port: int = 29500  # the rendezvous' TCP port on rank 0
    timeout: int = 60  # seconds the rendezvous, and each all-reduce, may take
    max_size_mb: int = 256  # the largest all-reduce measured (MB): 256 takes seconds per iteration on a 1 Gb/s link


@dataclass(frozen=True)
class DeliverySettings:
    """``gpurig_delivery``: this host's part in fleet delivery (gpurig.deploy.fanout), where hosts pass image layers to each other."""

    peer: bool = True  # false: never serves layers to another host (it still pulls from its parent or the build machine)
    address: str | None = None  # where the other hosts reach this host's sshd; None: its ansible_host
    port: int | None = None  # that sshd's port; None: its ansible_port, else 22


@dataclass(frozen=True)
class HostProfile:
    """Everything the inventory asks of one host, typed. Steps plan from this and the host's facts."""

    host: str
    become: bool = False
    gpus: GpuExpectation = GpuExpectation()
    shm_size: str | None = None
    container_runtime: str | None = None
    images: tuple[str, ...] = ()
    driver: DriverSettings = DriverSettings()
    docker: DockerSettings = DockerSettings()
    toolkit: ToolkitSettings = ToolkitSettings()
    daemon: Mapping[str, Any] = field(default_factory=dict)  # keys merged into /etc/docker/daemon.json
    containers: tuple[Mapping[str, Any], ...] = ()  # validated by deploy
    slurm: SlurmSettings = SlurmSettings()
    slurm_expect_drained: bool = False  # a Slurm node meant to stay drained: provision warns of its drain instead of failing
    fabric: FabricSettings = FabricSettings()
    delivery: DeliverySettings = DeliverySettings()


class _Reader:
    """Reads one host's vars; every failure names the file, host and key path."""

    def __init__(self, source: str, host: str) -> None:
        self.source, self.host = source, host

    def fail(self, path: str, problem: str, fix: str) -> InventoryError:
        return InventoryError(f"{self.source}: host {self.host}: {path} {problem}", fix)

    def mapping(self, path: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, not {_kind(value)}", f"write it as keys {', '.join(allowed)}")
        for key in value:
            if key not in allowed:
                raise self.fail(
                    f"{path}.{key}", f"is not a known key{did_you_mean(key, allowed)}", f"valid keys in {path}: {', '.join(allowed)}"
                )
        return value

    def boolean(self, path: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"must be true or false, not {excerpt(value)}", f"write {path.rsplit('.', 1)[-1]}: true")
        return value

    def count(self, path: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(path, f"must be a whole number >= 0, not {excerpt(value)}", "write e.g. 8 (unquoted)")
        return value

    def bounded(self, parent: str, m: Mapping[str, Any], key: str, limits: tuple[int, int], default: int) -> int:
        """``m[key]`` as a whole number within ``limits`` (inclusive), ``default`` when absent."""
        if key not in m:
            return default
        number, (low, high) = self.count(f"{parent}.{key}", m[key]), limits
        if not low <= number <= high:
            raise self.fail(f"{parent}.{key}", f"must be from {low} to {high}, not {number}", f"write e.g. {key}: {default}")
        return number

    def text(self, path: str, value: Any, pattern: re.Pattern | None = None, example: str = "") -> str:
        if not isinstance(value, str) or not value or (pattern and not pattern.fullmatch(value)):
            raise self.fail(path, f"must be a string like {example!r}, not {excerpt(value)}", f"write e.g. {example!r}")
        if len(value) > MAX_TEXT or free_text_problem(value):  # free text too: it reaches terminals, logs and labels
            raise self.fail(path, f"{excerpt(value)} {free_text_problem(value) or f'is over {MAX_TEXT} characters'}", f"write e.g. {example!r}")
        return value

    def choice(self, path: str, value: Any, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(path, f"is {excerpt(value)}{did_you_mean(value, choices)}", f"use one of: {', '.join(choices)}")
        return value

    def strings(self, path: str, value: Any, check, example: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(path, f"must be a list, not {_kind(value)}", f"write e.g. [{example}]")
        for i, item in enumerate(value):
            problem = check(item)
            if problem:
                raise self.fail(f"{path}[{i}]", f"{excerpt(item)} {problem}", f"write e.g. [{example}]")
        return tuple(value)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "empty"}.get(type(value), type(value).__name__)


def _gpus(r: _Reader, vars: Mapping[str, Any]) -> GpuExpectation:
    count = r.count("gpurig_gpu_count", vars["gpurig_gpu_count"]) if "gpurig_gpu_count" in vars else None
    model = r.text("gpurig_gpu_model", vars["gpurig_gpu_model"], None, "NVIDIA H100 80GB HBM3") if "gpurig_gpu_model" in vars else None
    if "gpurig_gpus" in vars:
        m = r.mapping("gpurig_gpus", vars["gpurig_gpus"], ("count", "model", "mig"))
        for key, flat, mine in (("count", "gpurig_gpu_count", count), ("model", "gpurig_gpu_model", model)):
            if key in m and mine is not None:
                raise r.fail(f"gpurig_gpus.{key}", f"and {flat} are both set", f"keep one of gpurig_gpus.{key} and {flat}")
        count = r.count("gpurig_gpus.count", m["count"]) if "count" in m else count
        model = r.text("gpurig_gpus.model", m["model"], None, "NVIDIA H100 80GB HBM3") if "model" in m else model
        mig = r.boolean("gpurig_gpus.mig", m["mig"]) if "mig" in m else None
        return GpuExpectation(count, model, mig)
    return GpuExpectation(count, model)


def _driver(r: _Reader, value: Any) -> DriverSettings:
    m = r.mapping("gpurig_driver", value, ("install", "branch", "source", "auto_upgrade"))
    branch = m.get("branch")
    if branch is not None:
        branch = str(r.count("gpurig_driver.branch", branch)) if isinstance(branch, int) else r.text("gpurig_driver.branch", branch, _BRANCH, "550")
    return DriverSettings(
        install=r.boolean("gpurig_driver.install", m["install"]) if "install" in m else False,
        branch=branch,
        source=r.choice("gpurig_driver.source", m["source"], DRIVER_SOURCES) if "source" in m else "distro",
        auto_upgrade=r.boolean("gpurig_driver.auto_upgrade", m["auto_upgrade"]) if "auto_upgrade" in m else False,
    )


def _docker(r: _Reader, value: Any) -> DockerSettings:
    m = r.mapping("gpurig_docker", value, ("source", "users"))
    return DockerSettings(
        source=r.choice("gpurig_docker.source", m["source"], DOCKER_SOURCES) if "source" in m else "distro",
        users=r.strings("gpurig_docker.users", m["users"], user_problem, "alice, bob") if "users" in m else (),
    )


def _toolkit(r: _Reader, value: Any) -> ToolkitSettings:
    m = r.mapping("gpurig_toolkit", value, ("version", "packages_dir"))
    return ToolkitSettings(
        version=r.text("gpurig_toolkit.version", m["version"], _TOOLKIT_VERSION, "1.17.8") if "version" in m else None,
        packages_dir=r.text("gpurig_toolkit.packages_dir", m["packages_dir"], None, "offline/toolkit") if "packages_dir" in m else None,
    )


def _json_value(r: _Reader, path: str, value: Any) -> Any:
    """A value daemon.json can hold: YAML dates, sets and the like are refused, not stringified; NaN and infinities too."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise r.fail(f"{path}.{key}", "has a key that is not a string", "quote the key")
            _json_value(r, f"{path}.{key}", item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _json_value(r, f"{path}[{i}]", item)
    elif isinstance(value, float) and not math.isfinite(value):
        # YAML's .nan/.inf: Python's json would write NaN/Infinity, which is not JSON and stops dockerd from starting
        raise r.fail(path, f"is {value}, which JSON cannot hold", "write a finite number")
    elif not isinstance(value, (str, int, float, bool, type(None))):
        raise r.fail(path, f"is a {type(value).__name__}, which JSON cannot hold", "quote the value")
    return value


_JSON_KINDS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _daemon(r: _Reader, value: Any) -> dict[str, Any]:
    """``gpurig_daemon``: keys dockerd reads (gpurig.inventory.daemonkeys), each with a JSON value of its kind."""
    if not isinstance(value, dict) or not value:
        raise r.fail("gpurig_daemon", f"must be a non-empty mapping of daemon.json keys, not {_kind(value)}",
                     'write e.g. gpurig_daemon: {"log-driver": "local"}')
    for key, item in value.items():
        path = f"gpurig_daemon.{key}"
        if key not in DAEMON_KEYS:
            # dockerd refuses to start on a key it does not know: caught here, before any host is contacted
            raise r.fail(path, f"is not a daemon.json key dockerd reads{did_you_mean(key, DAEMON_KEYS)}",
                         f"use a key from {DAEMON_KEYS_DOC}")
        _json_value(r, path, item)
        kind = DAEMON_KEYS[key]
        if not _JSON_KINDS[kind](item):
            article = "an" if kind[0] in "aeiou" else "a"
            raise r.fail(path, f"must be {article} {kind} in daemon.json, not {excerpt(item)}", f"see {key} in {DAEMON_KEYS_DOC}")
    return value


def _containers(r: _Reader, value: Any) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list):
        raise r.fail("gpurig_containers", f"must be a list of containers, not {_kind(value)}", "write each container as '- name: ...'")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise r.fail(f"gpurig_containers[{i}]", f"must be a mapping, not {_kind(item)}", "write each container as '- name: ...'")
    return tuple(value)


def _fabric(r: _Reader, value: Any) -> FabricSettings:
    m = r.mapping("gpurig_fabric", value, ("interface", "address", "port", "timeout", "max_size_mb"))

    return FabricSettings(
        interface=r.text("gpurig_fabric.interface", m["interface"], _INTERFACES, "eth0") if "interface" in m else None,
        address=r.text("gpurig_fabric.address", m["address"], _ADDRESS, "10.0.0.11") if "address" in m else None,
        port=r.bounded("gpurig_fabric", m, "port", (1024, 65535), 29500),
        timeout=r.bounded("gpurig_fabric", m, "timeout", (5, 3600), 60),
        max_size_mb=r.bounded("gpurig_fabric", m, "max_size_mb", (1, 256), 256),
    )


def _delivery(r: _Reader, value: Any) -> DeliverySettings:
    m = r.mapping("gpurig_delivery", value, ("peer", "address", "port"))
    return DeliverySettings(
        peer=r.boolean("gpurig_delivery.peer", m["peer"]) if "peer" in m else True,
        address=r.text("gpurig_delivery.address", m["address"], _ADDRESS, "10.0.0.11") if "address" in m else None,
        port=r.bounded("gpurig_delivery", m, "port", (1, 65535), 22) if "port" in m else None,
    )


def _slurm(r: _Reader, value: Any) -> SlurmSettings:
    m = r.mapping("gpurig_slurm", value, ("cluster", "def_mem_per_cpu", "health_interval", "min_job_age", "rest"))

    def bounded(key: str, low: int, high: int, default: int) -> int:
        return r.bounded("gpurig_slurm", m, key, (low, high), default)

    return SlurmSettings(
        cluster=r.text("gpurig_slurm.cluster", m["cluster"], _CLUSTER, "gpurig") if "cluster" in m else "gpurig",
        def_mem_per_cpu=bounded("def_mem_per_cpu", 1, 1 << 30, 1024), health_interval=bounded("health_interval", 1, 86400, 60),
        min_job_age=bounded("min_job_age", 2, 86400 * 30, 300),
        rest=r.boolean("gpurig_slurm.rest", m["rest"]) if "rest" in m else False,
    )


# key -> reader of its value; the order is the one users read in errors.
# Each reader returns its own HostProfile field's type; host_profile passes them by name.
_READERS: dict[str, Callable[[_Reader, Any], Any] | None] = {
    "gpurig_gpu_count": None,  # with gpurig_gpu_model and gpurig_gpus: read together by _gpus
    "gpurig_gpu_model": None,
    "gpurig_gpus": None,
    "gpurig_shm_size": lambda r, v: r.text("gpurig_shm_size", v, _SHM, "16g"),
    "gpurig_container_runtime": lambda r, v: r.text("gpurig_container_runtime", v, _RUNTIME, "nvidia"),
    "gpurig_images": lambda r, v: r.strings("gpurig_images", v, image_ref_problem, "2.14.1-cu130-slim"),
    "gpurig_driver": _driver,
    "gpurig_docker": _docker,
    "gpurig_toolkit": _toolkit,
    "gpurig_daemon": _daemon,
    "gpurig_containers": _containers,
    "gpurig_slurm": _slurm,
    "gpurig_fabric": _fabric,
    "gpurig_delivery": _delivery,
    "gpurig_slurm_expect_drained": lambda r, v: r.boolean("gpurig_slurm_expect_drained", v),
}
PROFILE_KEYS = tuple(_READERS)


def host_profile(host: Host, source: str | Path = "inventory") -> HostProfile:
    """The host's ``gpurig_*`` vars, validated; ``source`` (the inventory file) is named in errors."""
    r = _Reader(str(source), host.name)
    vars = host.vars
    for key in vars:
        if isinstance(key, str) and key.startswith("gpurig_") and key not in _READERS:
            raise r.fail(key, f"is not a gpurig setting{did_you_mean(key, PROFILE_KEYS)}", f"valid gpurig_* keys: {', '.join(PROFILE_KEYS)}")
    read = {k[len("gpurig_"):]: fn(r, vars[k]) for k, fn in _READERS.items() if fn and k in vars}
    return HostProfile(host=host.name, become=host.become, gpus=_gpus(r, vars), **read)
