"""The facts provisioning steps need beyond hardware: packages, apt candidates, services, groups, host identity, python3.

The probes here join ``gpurig.facts.PROBES`` in the same one-round-trip
script, each declared beside its parser; each parser is pure and tested from
recorded output. A probe that is absent (no dpkg, no systemd) gives empty
values, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpurig.facts.probes import Probe, Section

# Packages whose dpkg state steps read; 'nvidia-driver-[0-9]*' catches Ubuntu's per-branch names.
PACKAGES = ("docker.io", "docker-ce", "nvidia-container-toolkit", "nvidia-driver", "nvidia-driver-[0-9]*",
            "cuda-drivers", "nvidia-persistenced", "unattended-upgrades", "nvidia-fabricmanager", "nvidia-fabricmanager-[0-9]*",
            # the driver's user-space and kernel packages, which a hold must cover (an upgrade of any one breaks NVML)
            "libnvidia-compute-[0-9]*", "nvidia-utils-[0-9]*", "nvidia-kernel-*", "nvidia-dkms-[0-9]*", "libcuda1",
            "nvidia-driver-libs", "libnvidia-ml1", "cuda-drivers-[0-9]*")
# Packages whose apt candidate steps compare before installing (Ubuntu's branches listed from the cache).
POLICY_PACKAGES = ("nvidia-driver", "cuda-drivers", "docker.io", "docker-ce", "nvidia-container-toolkit")
SERVICES = ("docker", "nvidia-persistenced", "nvidia-fabricmanager")
REPOSITORIES = {
    "nvidia-container-toolkit": "nvidia.github.io/libnvidia-container",
    "docker": "download.docker.com/linux",
    "cuda": "developer.download.nvidia.com/compute/cuda",
}

_QUOTED = " ".join(f"'{p}'" for p in PACKAGES)


@dataclass(frozen=True)
class Service:
    """A systemd unit: ``enabled`` is is-enabled's word (enabled, disabled, masked, '' when unknown), ``active`` is-active's."""

    enabled: str = ""  # '' also when the unit does not exist
    active: str = ""

    @property
    def running(self) -> bool:
        return self.active == "active"


@dataclass(frozen=True)
class SystemFacts:
    """What package manager, init system and identity files say about a host."""

    installed: Mapping[str, str] = field(default_factory=dict)  # package -> version, fully installed ("ii", held: "hi") only
    broken: tuple[str, ...] = ()  # packages dpkg left half-installed / half-configured
    candidates: Mapping[str, str | None] = field(default_factory=dict)  # package -> apt candidate (None: "(none)")
    services: Mapping[str, Service] = field(default_factory=dict)
    systemd: bool = False
    docker_members: tuple[str, ...] | None = None  # None: no docker group
    nouveau_blacklisted: tuple[str, ...] = ()  # files that blacklist it
    nvml_version: str | None = None  # the userspace library (libnvidia-ml.so.VERSION)
    repositories: tuple[str, ...] = ()  # keys of REPOSITORIES configured in apt's sources
    machine_id: str | None = None
    boot_id: str | None = None
    reboot_required: bool = False  # /var/run/reboot-required (Debian/Ubuntu packages ask for one)
    python3: str | None = None  # the version of the python3 on the login user's PATH: gpurig's own probes run with it

    def service(self, name: str) -> Service:
        return self.services.get(name, Service())


def parse_packages(s: Section) -> tuple[dict[str, str], tuple[str, ...]]:
    """(installed package -> version, packages in a broken state) from dpkg-query's tab-separated lines."""
    installed: dict[str, str] = {}
    broken: list[str] = []
    for line in s.text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue  # "dpkg-query: no packages found matching X" (stderr folded in)
        name, status, version = parts[0], parts[1].strip(), parts[2].strip()
        if status in ("ii", "hi"):  # "hi": installed and held (apt-mark hold), still installed
            installed[name] = version
        elif len(status) >= 2 and status[1] in "HUFWt" or status.endswith("R"):
            broken.append(name)
    return installed, tuple(broken)


def parse_apt_policy(s: Section) -> dict[str, str | None]:
    """package -> Candidate from ``apt-cache policy A B ...`` (None for "(none)"); packages apt does not know are left out."""
    candidates: dict[str, str | None] = {}
    name = None
    for line in s.text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            name = line[:-1]
        elif name and line.strip().startswith("Candidate:"):
            value = line.split(":", 1)[1].strip()
            candidates[name] = None if value == "(none)" else value
    return candidates


def parse_services(s: Section) -> tuple[dict[str, Service], bool]:
    services: dict[str, Service] = {}
    systemd = False
    for line in s.text.splitlines():
        parts = line.split()
        if parts[:1] == ["systemd"]:
            systemd = parts[1:] == ["yes"]
        elif parts and parts[0] in SERVICES:
            # "docker enabled=enabled active=active"; is-enabled prints nothing for a unit that does not exist.
            words = dict(p.partition("=")[::2] for p in parts[1:])
            enabled = words.get("enabled", "")
            # systemd 252 (Debian 12) prints nothing for a unit that does not exist, 257 (Debian 13) "not-found".
            services[parts[0]] = Service("" if enabled == "not-found" else enabled, words.get("active", ""))
    return services, systemd


def parse_group(s: Section) -> tuple[str, ...] | None:
    """Members from ``getent group docker`` (name:x:gid:a,b); None when the group does not exist."""
    line = s.text.strip().splitlines()[-1] if s.ok and s.text.strip() else ""
    parts = line.split(":")
    if len(parts) != 4:
        return None
    return tuple(m for m in parts[3].split(",") if m)


def parse_blacklist(s: Section) -> tuple[str, ...]:
    """The modprobe files that blacklist nouveau (grep -l's file names)."""
    return tuple(line.strip() for line in s.text.splitlines() if line.startswith("/"))


def parse_nvml_library(s: Section) -> str | None:
    versions = re.findall(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", s.text, re.M)
    return max(versions, key=lambda v: tuple(int(x) for x in v.split("."))) if versions else None


def parse_repositories(s: Section) -> tuple[str, ...]:
    return tuple(key for key, url in REPOSITORIES.items() if url in s.text)


def parse_host_ids(s: Section) -> tuple[str | None, str | None, bool]:
    """(machine id, boot id, reboot required)."""
    text = s.text
    ids = [w for w in text.split() if re.fullmatch(r"[0-9a-f-]{32,36}", w)]
    machine = next((w for w in ids if "-" not in w), None)
    boot = next((w for w in ids if "-" in w), None)
    return machine, boot, "reboot-required" in text.split()


def parse_python3(s: Section) -> str | None:
    """The version ``python3 --version`` printed (``Python 3.11.2``); None where there is none (``sh: N: python3: not found``, rc 127)."""
    m = re.fullmatch(r"Python (\d+\.\d+\.\d+)\S*", s.text.strip()) if s.ok else None
    return m.group(1) if m else None


SYSTEM_PROBES: tuple[Probe, ...] = (
    Probe("packages", f"dpkg-query -W -f='${{Package}}\\t${{db:Status-Abbrev}}\\t${{Version}}\\n' {_QUOTED} \"linux-headers-$(uname -r)\"",
          parse_packages),
    # apt-cache costs ~1 s of CPU as a non-root user (it rebuilds its cache in memory), so only hosts with an
    # NVIDIA device on the PCI bus pay it: the driver step is the one that must know apt's candidates.
    Probe("apt_policy", "if grep -qs 0x10de /sys/bus/pci/devices/*/vendor; then apt-cache policy " + " ".join(POLICY_PACKAGES)
          + " $(apt-cache pkgnames nvidia-driver- 2>/dev/null | grep -E '^nvidia-driver-[0-9]+(-server|-open)?$' | sort | tail -n 6);"
          " else echo no NVIDIA device on the PCI bus; fi", parse_apt_policy),
    Probe("services", "for u in " + " ".join(SERVICES) + "; do echo \"$u enabled=$(systemctl is-enabled $u 2>/dev/null)"
          " active=$(systemctl is-active $u 2>/dev/null)\"; done; [ -d /run/systemd/system ] && echo systemd yes || echo systemd no",
          parse_services),
    Probe("docker_group", "getent group docker", parse_group),
    Probe("nouveau_blacklist", "grep -lsE '^[[:space:]]*blacklist[[:space:]]+nouveau' /etc/modprobe.d/*.conf /lib/modprobe.d/*.conf"
          " /usr/lib/modprobe.d/*.conf", parse_blacklist),
    Probe("nvml_library", "ls /usr/lib/*/libnvidia-ml.so.*.* /usr/lib64/libnvidia-ml.so.*.* 2>/dev/null", parse_nvml_library),
    Probe("apt_sources", "grep -rhsE '^[^#]*(" + "|".join(re.escape(r) for r in REPOSITORIES.values())
          + ")' /etc/apt/sources.list /etc/apt/sources.list.d/", parse_repositories),
    Probe("host_ids", "cat /etc/machine-id /proc/sys/kernel/random/boot_id; [ -e /var/run/reboot-required ] && echo reboot-required; true",
          parse_host_ids),
    # verify's host probe and monitor's sampler are Python files handed to this python3 (gpurig/connect/launcher.py);
    # --version answers without starting the interpreter's runtime (1 ms, against 30 ms for -c 'import sys')
    Probe("python3", "python3 --version", parse_python3),
)


def system_facts(values: Mapping[str, Any]) -> SystemFacts:
    """SystemFacts from the system probes' parsed values (``gpurig.facts.probes.read``)."""
    installed, broken = values["packages"]
    services, systemd = values["services"]
    machine, boot, reboot = values["host_ids"]
    return SystemFacts(
        installed=installed,
        broken=broken,
        candidates=values["apt_policy"],
        services=services,
        systemd=systemd,
        docker_members=values["docker_group"],
        nouveau_blacklisted=values["nouveau_blacklist"],
        nvml_version=values["nvml_library"],
        repositories=values["apt_sources"],
        machine_id=machine,
        boot_id=boot,
        reboot_required=reboot,
        python3=values["python3"],
    )
