"""The host's hardware, driver and Docker as declared probes: each parser beside the probe whose output it reads.

Every parser is pure and tested from recorded output with no host
(tests/fixtures/facts/). A command that is missing or fails gives an
"absent" value (None, False, empty tuple), never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from gpurig.errors import last_line, permission_denied
from gpurig.facts.probes import Probe, Section
from gpurig.strict.validate import whole_number


@dataclass(frozen=True)
class OsInfo:
    id: str | None
    version_id: str | None
    pretty_name: str | None
    codename: str | None


@dataclass(frozen=True)
class Disk:
    mount: str
    size_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA display/3D controller seen on the PCI bus (present whether or not a driver is loaded)."""

    slot: str
    device_id: str
    name: str


@dataclass(frozen=True)
class Gpu:
    """A GPU as the driver reports it (nvidia-smi)."""

    index: int
    name: str
    uuid: str
    memory_mib: int | None
    bus_id: str


@dataclass(frozen=True)
class DockerInfo:
    installed: bool
    client_version: str | None
    running: bool
    server_version: str | None
    runtimes: tuple[str, ...]
    default_runtime: str | None
    problem: str | None  # why the daemon could not be asked, when it could not
    denied: bool = False  # the socket refused the login user (not in the docker group): not a stopped daemon
    cgroup_driver: str | None = None  # systemd | cgroupfs, as the running daemon reports it


@dataclass(frozen=True)
class DaemonConfig:
    """/etc/docker/daemon.json as the host has it: parsed, absent, invalid (with the parser's message) or unreadable.

    ``text`` is the file as ``cat`` printed it (its final newline not kept),
    so steps can diff against it; ``content`` is the parsed object when
    ``state`` is ``present``.
    """

    state: str  # present | absent | invalid | unreadable | unknown
    content: dict[str, Any] | None = None
    text: str = ""
    problem: str | None = None



def parse_os_release(s: Section) -> OsInfo:
    values: dict[str, str] = {}
    if s.ok:
        for line in s.text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"').strip("'")
    return OsInfo(values.get("ID"), values.get("VERSION_ID"), values.get("PRETTY_NAME"), values.get("VERSION_CODENAME"))


OS_RELEASE = Probe("os_release", "cat /etc/os-release", parse_os_release)


def parse_uname(s: Section) -> tuple[str | None, str | None]:
    """(kernel release, machine) from ``uname -srm``."""
    parts = s.text.split() if s.ok else []
    if len(parts) >= 3:
        return parts[1], parts[-1]
    return None, None


UNAME = Probe("uname", "uname -srm", parse_uname)


def parse_int(s: Section) -> int | None:
    try:
        return int(s.text.strip()) if s.ok else None
    except ValueError:
        return None


NPROC = Probe("nproc", "getconf _NPROCESSORS_ONLN", parse_int)


def parse_meminfo(s: Section) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes."""
    found: dict[str, int] = {}
    if s.ok:
        for line in s.text.splitlines():
            m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
            if m:
                found[m.group(1)] = int(m.group(2)) * 1024
    return found.get("MemTotal"), found.get("MemAvailable")


MEMINFO = Probe("meminfo", "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo", parse_meminfo)


def parse_df(s: Section) -> tuple[Disk, ...]:
    """``df -Pk`` rows; df exits 1 when one path is missing but still prints the others."""
    disks = []
    for line in s.text.splitlines()[1:] if s.rc in (0, 1) else []:
        parts = line.split()
        size, free = (whole_number(parts[1]), whole_number(parts[3])) if len(parts) >= 6 else (None, None)
        if size is not None and free is not None:
            disks.append(Disk(mount=parts[5], size_bytes=size * 1024, free_bytes=free * 1024))
    return tuple(disks)


DF = Probe("df", "df -Pk / /var/lib/docker", parse_df)


_LSPCI = re.compile(r"^(?P<slot>\S+)\s+(?P<cls>[^\[]+)\[(?P<code>[0-9a-f]{4})\]:\s+(?P<name>.*?)\s*\[10de:(?P<dev>[0-9a-f]{4})\]", re.I)
_GPU_CLASSES = ("0300", "0302")  # VGA and 3D controllers; bridges such as NVSwitch are not GPUs


def parse_lspci(s: Section) -> tuple[PciGpu, ...] | None:
    """NVIDIA GPUs from ``lspci -nn -d 10de:``; None when lspci is not installed (then the sysfs fallback says)."""
    if s.rc == 127:
        return None
    gpus = []
    for line in s.text.splitlines() if s.ok else []:
        m = _LSPCI.match(line.strip())
        if m and m.group("code") in _GPU_CLASSES:
            name = re.sub(r"^NVIDIA Corporation\s+", "", m.group("name"))
            gpus.append(PciGpu(slot=m.group("slot"), device_id=m.group("dev").lower(), name=name))
    return tuple(gpus)


def parse_pci_sysfs(s: Section) -> tuple[PciGpu, ...]:
    """``SLOT 0xCLASS 0xDEVICE`` lines written by the sysfs fallback."""
    gpus = []
    for line in s.text.splitlines() if s.ok else []:
        parts = line.split()
        if len(parts) == 3 and parts[1][2:6] in _GPU_CLASSES:
            gpus.append(PciGpu(slot=parts[0], device_id=parts[2].removeprefix("0x").lower(), name=""))
    return tuple(gpus)


LSPCI = Probe("lspci", "lspci -nn -d 10de:", parse_lspci)
# Fallback when pciutils is absent: vendor/class/device ids straight from sysfs.
PCI_SYSFS = Probe("pci_sysfs", "for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/vendor)\" = 0x10de ]"
                  " && echo \"${d##*/} $(cat $d/class) $(cat $d/device)\"; done; true", parse_pci_sysfs)


def parse_nvidia_version(s: Section) -> tuple[str | None, str | None]:
    """(driver version, "open" | "proprietary") from /proc/driver/nvidia/version."""
    if not s.ok:
        return None, None
    for line in s.text.splitlines():
        if line.startswith("NVRM version:"):
            m = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            flavour = "open" if "Open Kernel Module" in line else "proprietary"
            return (m.group(1) if m else None), flavour
    return None, None


NVIDIA_VERSION = Probe("nvidia_version", "cat /proc/driver/nvidia/version", parse_nvidia_version)


def parse_nvidia_smi(s: Section) -> tuple[tuple[Gpu, ...], str | None]:
    """GPUs and driver version from the csv,noheader,nounits query; ([], None) if nvidia-smi fails."""
    gpus = []
    driver = None
    for line in s.text.splitlines() if s.ok else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6 or whole_number(parts[0]) is None:
            continue
        index, name, uuid, memory, driver_version, bus = parts
        gpus.append(Gpu(int(index), name, uuid, whole_number(memory), bus))
        driver = driver or driver_version
    return tuple(gpus), driver


NVIDIA_SMI = Probe("nvidia_smi", "nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id --format=csv,noheader,nounits",
                   parse_nvidia_smi)


def parse_modules(s: Section) -> tuple[bool, bool]:
    """(nouveau loaded, nvidia loaded) from the /proc/modules lines; grep exits 1 when neither is."""
    names = {line.split()[0] for line in s.text.splitlines() if line.strip()} if s.rc == 0 else set()
    return "nouveau" in names, "nvidia" in names


MODULES = Probe("modules", "grep -E '^(nouveau|nvidia) ' /proc/modules", parse_modules)


def parse_secure_boot(s: Section) -> str:
    text = s.text.strip()
    if text == "legacy-bios":
        return "not-efi"
    numbers = text.split()
    # efivarfs files start with 4 attribute bytes; the fifth is the SecureBoot value.
    if s.ok and len(numbers) >= 5 and whole_number(numbers[4]) is not None:
        return "enabled" if numbers[4] == "1" else "disabled"
    return "unknown"


SECURE_BOOT = Probe("secure_boot", "if [ -d /sys/firmware/efi ]; then od -An -t u1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c;"
                    " else echo legacy-bios; fi", parse_secure_boot)


def parse_docker(info: Section) -> DockerInfo:
    """Docker from one ``docker info --format '{{json .}}'``: it reports the client even when the daemon is down."""
    installed = info.rc != 127
    data = _last_json_line(info.text) if installed else {}
    client = (data.get("ClientInfo") or {}).get("Version") or None
    server = data.get("ServerVersion") or None
    problem = None
    if installed and not server:
        problem = _docker_problem(info)
    # docker info may exit 0 with ServerErrors when the client cannot reach the daemon.
    if data.get("ServerErrors"):
        problem = "; ".join(str(e) for e in data["ServerErrors"])
    return DockerInfo(
        installed=installed,
        client_version=client,
        running=bool(server),
        server_version=server,
        runtimes=tuple(sorted((data.get("Runtimes") or {}).keys())) if installed else (),
        default_runtime=(data.get("DefaultRuntime") or None) if installed else None,
        problem=problem,
        denied=bool(problem) and permission_denied(problem or ""),
        cgroup_driver=(data.get("CgroupDriver") or None) if server else None,
    )


DOCKER_INFO = Probe("docker_info", "timeout -k 5 15 docker info --format '{{json .}}'", parse_docker)


def with_daemon_config(docker: DockerInfo, daemon: DaemonConfig) -> DockerInfo:
    """A stopped daemon's runtimes as daemon.json asks for them: what it will use once started."""
    if not docker.installed or docker.running:
        return docker
    conf = daemon.content or {}
    return replace(docker, runtimes=tuple(sorted({"runc", *(conf.get("runtimes") or {}).keys()})),
                   default_runtime=conf.get("default-runtime", "runc"))


def _last_json_line(text: str) -> dict[str, Any]:
    """The JSON document in output that may also hold error lines (stderr is folded in)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    return {}


def _docker_problem(info: Section) -> str:
    text = info.text.strip()
    if info.rc == 124:  # killed by timeout(1)
        return "docker info timed out (daemon hung?)"
    if permission_denied(text):
        return "permission denied on the docker socket (user not in the docker group)"
    if "Cannot connect" in text or "Is the docker daemon running" in text:
        return "daemon not running"
    return last_line(text, default="docker info failed")[:200]


def parse_daemon_json(s: Section) -> DaemonConfig:
    """The ``cat /etc/docker/daemon.json`` section: a JSON object, or why there is none."""
    if s.ok:
        if not s.text.strip():
            return DaemonConfig("present", {}, s.text)  # an empty file: dockerd starts with its defaults
        try:
            data = json.loads(s.text)
        except ValueError as err:
            where = f" (line {err.lineno}, column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""
            msg = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
            return DaemonConfig("invalid", None, s.text, f"{msg}{where}")
        if not isinstance(data, dict):
            return DaemonConfig("invalid", None, s.text, f"the top level is a JSON {type(data).__name__}, not an object")
        return DaemonConfig("present", data, s.text)
    if "No such file or directory" in s.text:
        return DaemonConfig("absent")
    if permission_denied(s.text):
        return DaemonConfig("unreadable", problem="permission denied")
    last = (s.text.strip().splitlines() or ["no output (the facts script was cut short)"])[-1]
    return DaemonConfig("unknown", problem=last[:200])


# Root-only daemon.json (0600/0640): read through passwordless sudo when it is there, else cat's own error.
DAEMON_JSON = Probe("daemon_json", "f=/etc/docker/daemon.json; if [ -e $f ] && [ ! -r $f ]; then sudo -n cat $f 2>/dev/null || cat $f; else cat $f; fi",
                    parse_daemon_json)


def parse_nvidia_ctk(s: Section) -> str | None:
    m = re.search(r"version\s+v?(\d+\.\d+\.\d+\S*)", s.text) if s.ok else None
    return m.group(1) if m else None


NVIDIA_CTK = Probe("nvidia_ctk", "nvidia-ctk --version", parse_nvidia_ctk)


def parse_cgroup(s: Section) -> int | None:
    fs = s.text.strip() if s.ok else ""
    return {"cgroup2fs": 2, "tmpfs": 1}.get(fs)


CGROUP = Probe("cgroup", "stat -fc %T /sys/fs/cgroup", parse_cgroup)


