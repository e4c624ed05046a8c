"""What a host is, gathered in one round trip: one shell script, sections between markers, pure parsers.

``FACTS_SCRIPT`` runs every probe in a single exec and prints each one's
output between ``@@gpurig-fact NAME`` and ``@@gpurig-rc CODE`` lines.
``split_sections`` cuts that output apart and one pure ``parse_*`` function
per section turns it into data, so every parser is tested from recorded
output with no host at all. A command that is missing or fails gives an
"absent" value (None, False, empty tuple), never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from gpurig.connection import Connection, last_line
from gpurig.errors import HostError
from gpurig.facts_system import SYSTEM_PROBES, SystemFacts, parse_system
from gpurig.validate import excerpt

# Each probe: (section name, shell line). Lines are fixed text, never built from host data.
PROBES: tuple[tuple[str, str], ...] = (
    ("os_release", "cat /etc/os-release"),
    ("uname", "uname -srm"),
    ("nproc", "getconf _NPROCESSORS_ONLN"),
    ("meminfo", "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo"),
    ("df", "df -Pk / /var/lib/docker"),
    ("lspci", "lspci -nn -d 10de:"),
    # Fallback when pciutils is absent: vendor/class/device ids straight from sysfs.
    ("pci_sysfs", "for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/vendor)\" = 0x10de ] && echo \"${d##*/} $(cat $d/class) $(cat $d/device)\"; done; true"),
    ("nvidia_version", "cat /proc/driver/nvidia/version"),
    ("nvidia_smi", "nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id --format=csv,noheader,nounits"),
    ("modules", "grep -E '^(nouveau|nvidia) ' /proc/modules"),
    ("secure_boot", "if [ -d /sys/firmware/efi ]; then od -An -t u1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c; else echo legacy-bios; fi"),
    ("docker_info", "timeout -k 5 15 docker info --format '{{json .}}'"),
    # Root-only daemon.json (0600/0640): read through passwordless sudo when it is there, else cat's own error.
    ("daemon_json", "f=/etc/docker/daemon.json; if [ -e $f ] && [ ! -r $f ]; then sudo -n cat $f 2>/dev/null || cat $f; else cat $f; fi"),
    ("nvidia_ctk", "nvidia-ctk --version"),
    ("cgroup", "stat -fc %T /sys/fs/cgroup"),
    *SYSTEM_PROBES,
)

MARK = "@@gpurig-fact"
RC_MARK = "@@gpurig-rc"


def facts_script() -> str:
    """The whole probe as one POSIX sh script (stdin closed, C locale, stderr folded into each section)."""
    lines = ["export LC_ALL=C PATH=\"$PATH:/usr/sbin:/sbin:/usr/local/bin\"", "exec </dev/null"]
    for name, cmd in PROBES:
        lines.append(f"printf '\\n{MARK} {name}\\n'; ( {cmd} ) 2>&1; printf '\\n{RC_MARK} %s\\n' \"$?\"")
    return "\n".join(lines) + "\n"


FACTS_SCRIPT = facts_script()


@dataclass(frozen=True)
class Section:
    """One probe's output and exit code. 127 means the command does not exist."""

    rc: int
    text: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


ABSENT = Section(127, "")


def split_sections(output: str) -> dict[str, Section]:
    """Cut the script's output into sections by marker; a section cut short (host died) is left out."""
    sections: dict[str, Section] = {}
    name: str | None = None
    body: list[str] = []
    for line in output.splitlines():
        if line.startswith(MARK + " "):
            name, body = line[len(MARK) + 1:].strip(), []
        elif line.startswith(RC_MARK + " ") and name is not None:
            try:
                rc = int(line[len(RC_MARK) + 1:].strip())
            except ValueError:
                rc = 1
            # The script prints a newline before the rc marker; a command whose output
            # ended with its own newline leaves one empty line, which is not output.
            sections[name] = Section(rc, "\n".join(body[:-1] if body and body[-1] == "" else body))
            name = None
        elif name is not None:
            body.append(line)
    return sections


# --- data -------------------------------------------------------------------------------------


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



@dataclass(frozen=True)
class Facts:
    """Everything gpurig needs to know about a host before changing it."""

    os: OsInfo
    kernel: str | None
    arch: str | None
    cpus: int | None
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    disks: tuple[Disk, ...]
    pci_gpus: tuple[PciGpu, ...]
    driver_version: str | None
    driver_flavour: str | None  # "proprietary" | "open" kernel module
    gpus: tuple[Gpu, ...]
    nouveau_loaded: bool
    nvidia_loaded: bool
    secure_boot: str  # enabled | disabled | not-efi | unknown
    docker: DockerInfo
    daemon_json: DaemonConfig
    toolkit_version: str | None
    cgroup_version: int | None
    system: SystemFacts = field(default_factory=SystemFacts)  # packages, apt candidates, services, identity
    missing: tuple[str, ...] = field(default=())  # probes whose output never arrived

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["daemon_json"].pop("text")  # the parsed content says it all; the raw text is for diffs
        return data


# --- parsers (pure) ---------------------------------------------------------------------------


def parse_os_release(s: Section) -> OsInfo:
    values: dict[str, str] = {}
    if s.ok:
        for line in s.text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"').strip("'")
    return OsInfo(values.get("ID"), values.get("VERSION_ID"), values.get("PRETTY_NAME"), values.get("VERSION_CODENAME"))


def parse_uname(s: Section) -> tuple[str | None, str | None]:
    """(kernel release, machine) from ``uname -srm``."""
    parts = s.text.split() if s.ok else []
    if len(parts) >= 3:
        return parts[1], parts[-1]
    return None, None


def parse_int(s: Section) -> int | None:
    try:
        return int(s.text.strip()) if s.ok else None
    except ValueError:
        return None


def parse_meminfo(s: Section) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes."""
    found: dict[str, int] = {}
    if s.ok:
        for line in s.text.splitlines():
            m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
            if m:
                found[m.group(1)] = int(m.group(2)) * 1024
    return found.get("MemTotal"), found.get("MemAvailable")


def parse_df(s: Section) -> tuple[Disk, ...]:
    """``df -Pk`` rows; df exits 1 when one path is missing but still prints the others."""
    disks = []
    for line in s.text.splitlines()[1:] if s.rc in (0, 1) else []:
        parts = line.split()
        if len(parts) >= 6 and parts[1].isdigit() and parts[3].isdigit():
            disks.append(Disk(mount=parts[5], size_bytes=int(parts[1]) * 1024, free_bytes=int(parts[3]) * 1024))
    return tuple(disks)


_LSPCI = re.compile(r"^(?P<slot>\S+)\s+(?P<cls>[^\[]+)\[(?P<code>[0-9a-f]{4})\]:\s+(?P<name>.*?)\s*\[10de:(?P<dev>[0-9a-f]{4})\]", re.I)
_GPU_CLASSES = ("0300", "0302")  # VGA and 3D controllers; bridges such as NVSwitch are not GPUs


def parse_lspci(s: Section) -> tuple[PciGpu, ...]:
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


def parse_nvidia_smi(s: Section) -> tuple[tuple[Gpu, ...], str | None]:
    """GPUs and driver version from the csv,noheader,nounits query; ([], None) if nvidia-smi fails."""
    gpus = []
    driver = None
    for line in s.text.splitlines() if s.ok else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        index, name, uuid, memory, driver_version, bus = parts
        gpus.append(Gpu(int(index), name, uuid, int(memory) if memory.isdigit() else None, bus))
        driver = driver or driver_version
    return tuple(gpus), driver


def parse_modules(s: Section) -> tuple[bool, bool]:
    """(nouveau loaded, nvidia loaded) from the /proc/modules lines; grep exits 1 when neither is."""
    names = {line.split()[0] for line in s.text.splitlines() if line.strip()} if s.rc == 0 else set()
    return "nouveau" in names, "nvidia" in names


def parse_secure_boot(s: Section) -> str:
    text = s.text.strip()
    if text == "legacy-bios":
        return "not-efi"
    numbers = text.split()
    # efivarfs files start with 4 attribute bytes; the fifth is the SecureBoot value.
    if s.ok and len(numbers) >= 5 and numbers[4].isdigit():
        return "enabled" if numbers[4] == "1" else "disabled"
    return "unknown"


def parse_docker(info: Section, daemon_json: Section) -> DockerInfo:
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
    runtimes = tuple(sorted((data.get("Runtimes") or {}).keys()))
    default = data.get("DefaultRuntime") or None
    if installed and not server:
        # Daemon down: what daemon.json asks for is what it will use once started.
        conf = parse_daemon_json(daemon_json).content or {}
        runtimes = tuple(sorted({"runc", *(conf.get("runtimes") or {}).keys()}))
        default = conf.get("default-runtime", "runc")
    return DockerInfo(
        installed=installed,
        client_version=client,
        running=bool(server),
        server_version=server,
        runtimes=runtimes if installed else (),
        default_runtime=default if installed else None,
        problem=problem,
    )


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
    if "permission denied" in text.lower():
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
    if "Permission denied" in s.text:
        return DaemonConfig("unreadable", problem="permission denied")
    last = (s.text.strip().splitlines() or ["no output (the facts script was cut short)"])[-1]
    return DaemonConfig("unknown", problem=last[:200])


def parse_nvidia_ctk(s: Section) -> str | None:
    m = re.search(r"version\s+v?(\d+\.\d+\.\d+\S*)", s.text) if s.ok else None
    return m.group(1) if m else None


def parse_cgroup(s: Section) -> int | None:
    fs = s.text.strip() if s.ok else ""
    return {"cgroup2fs": 2, "tmpfs": 1}.get(fs)


def parse_facts(output: str) -> Facts:
    """Facts from the whole script output; sections that never arrived are listed in ``missing``."""
    sec = split_sections(output)
    get = lambda name: sec.get(name, ABSENT)  # noqa: E731
    kernel, arch = parse_uname(get("uname"))
    total, available = parse_meminfo(get("meminfo"))
    driver, flavour = parse_nvidia_version(get("nvidia_version"))
    gpus, smi_driver = parse_nvidia_smi(get("nvidia_smi"))
    nouveau, nvidia = parse_modules(get("modules"))
    pci = parse_lspci(get("lspci")) if get("lspci").rc != 127 else parse_pci_sysfs(get("pci_sysfs"))
    return Facts(
        os=parse_os_release(get("os_release")),
        kernel=kernel,
        arch=arch,
        cpus=parse_int(get("nproc")),
        mem_total_bytes=total,
        mem_available_bytes=available,
        disks=parse_df(get("df")),
        pci_gpus=pci,
        driver_version=driver or smi_driver,
        driver_flavour=flavour,
        gpus=gpus,
        nouveau_loaded=nouveau,
        nvidia_loaded=nvidia,
        secure_boot=parse_secure_boot(get("secure_boot")),
        docker=parse_docker(get("docker_info"), get("daemon_json")),
        daemon_json=parse_daemon_json(get("daemon_json")),
        toolkit_version=parse_nvidia_ctk(get("nvidia_ctk")),
        cgroup_version=parse_cgroup(get("cgroup")),
        system=parse_system({name: (s.rc, s.text) for name, s in sec.items()}),
        missing=tuple(name for name, _ in PROBES if name not in sec),
    )


def gather(conn: Connection, timeout: float | None = 60.0) -> Facts:
    """Facts of the host behind ``conn``: one exec of ``FACTS_SCRIPT``; no probe section back is an error."""
    result = conn.run(["sh", "-c", FACTS_SCRIPT], warn=True, timeout=timeout)
    facts = parse_facts(result.stdout)
    if len(facts.missing) == len(PROBES):  # something else ran in the probe's place
        said = excerpt(last_line(result.stdout, result.stderr), 60) if last_line(result.stdout, result.stderr) else "nothing"
        raise HostError(
            f"{conn.name}: the host ran something else than the probe (ForceCommand? broken login shell?): it printed {said} and exited {result.exited}",
            "run 'ssh HOST true' by hand and check the user's login shell and any ForceCommand in the host's sshd_config",
        )
    return facts
