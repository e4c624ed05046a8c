"""What a host is, gathered in one round trip: declared probes sent as one shell script, pure parsers.

Each fact is a ``Probe`` (gpurig/facts/probes.py): a name, the fixed shell
text that reads it, and a pure parser of its output, declared beside that
parser in parsers.py (hardware, driver, Docker) or system.py (packages,
services, identity). ``FACTS_SCRIPT`` runs every probe in a single exec,
each one's output between marker lines; ``parse_facts`` cuts it apart, lets
each probe parse its own section and joins the few facts that two probes
answer together (driver version, GPUs on the bus, a stopped Docker's
runtimes). Every parser is tested from recorded output with no host at all.
A command that is missing or fails gives an "absent" value (None, False,
empty tuple), never an exception.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.errors import HostError, last_line
from gpurig.facts import parsers as hw
from gpurig.facts.gpuhost import GPUHOST_PROBES, GpuHostFacts, gpuhost_facts
from gpurig.facts.parsers import (  # the parsers and their data classes are this package's API
    DaemonConfig,
    Disk,
    DockerInfo,
    Gpu,
    OsInfo,
    PciGpu,
    parse_cgroup,
    parse_daemon_json,
    parse_df,
    parse_docker,
    parse_int,
    parse_lspci,
    parse_meminfo,
    parse_modules,
    parse_nvidia_ctk,
    parse_nvidia_smi,
    parse_nvidia_version,
    parse_os_release,
    parse_pci_sysfs,
    parse_secure_boot,
    parse_uname,
    with_daemon_config,
)
from gpurig.facts.probes import ABSENT, MARK, RC_MARK, Probe, Section, facts_script, read, split_sections
from gpurig.facts.system import SYSTEM_PROBES, SystemFacts, system_facts
from gpurig.strict.validate import excerpt, strip_userinfo


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
    gpuhost: GpuHostFacts = field(default_factory=GpuHostFacts)  # the traps of a working GPU host (gpurig/facts/gpuhost.py)
    missing: tuple[str, ...] = field(default=())  # probes asked for whose output never arrived
    unasked: tuple[str, ...] = field(default=())  # probes not sent (a task that reads only SUMMARY_PROBES): their fields hold absent values

    @property
    def incomplete(self) -> str:
        """'' when every probe's output arrived, else the one line naming those that did not: such facts are not ``ok``."""
        if not self.missing:
            return ""
        return f"facts incomplete: no output for {', '.join(self.missing)} (the host stopped answering mid-probe?)"

    @property
    def cgroup_driver(self) -> str | None:
        """Docker's cgroup driver: the running engine's, else what it will use when it starts; None without Docker."""
        if not self.docker.installed:
            return None
        if self.docker.cgroup_driver:
            return self.docker.cgroup_driver
        for opt in (self.daemon_json.content or {}).get("exec-opts") or ():
            if isinstance(opt, str) and opt.replace(" ", "").startswith("native.cgroupdriver="):
                return opt.split("=", 1)[1].strip()
        if self.cgroup_version is None:
            return None
        return "systemd" if self.cgroup_version == 2 and self.system.systemd else "cgroupfs"  # dockerd's defaults since 20.10

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["daemon_json"].pop("text")  # the parsed content says it all; the raw text is for diffs
        # daemon.json is root-only for a reason: proxies there may carry user:password@
        data["daemon_json"]["content"] = _without_userinfo(data["daemon_json"]["content"])
        return data


def _without_userinfo(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_userinfo(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_userinfo(v) for v in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        return strip_userinfo(value)
    return value


# Every fact gathered, in the order the script asks for them.
PROBES: tuple[Probe, ...] = (
    hw.OS_RELEASE, hw.UNAME, hw.NPROC, hw.MEMINFO, hw.DF, hw.LSPCI, hw.PCI_SYSFS, hw.NVIDIA_VERSION, hw.NVIDIA_SMI,
    hw.MODULES, hw.SECURE_BOOT, hw.DOCKER_INFO, hw.DAEMON_JSON, hw.NVIDIA_CTK, hw.CGROUP,
    *SYSTEM_PROBES, *GPUHOST_PROBES,
)
FACTS_SCRIPT = facts_script(PROBES)
# What the facts table, its verdict and `outdated` read: the hardware, the driver, Docker and python3. The rest
# (packages, apt, services, host ids, the GPU-host traps) is what provision plans from and verify's traps judge,
# and costs about half the script's time on a host (dpkg-query twice, systemctl per unit, apt-config); a task
# that reads only these sends only them, still in one exec. `facts --full` asks for every probe.
SUMMARY_PROBES: tuple[Probe, ...] = tuple(p for p in PROBES if p not in SYSTEM_PROBES and p not in GPUHOST_PROBES) + tuple(
    p for p in SYSTEM_PROBES if p.name == "python3")
# Each script built once: every host of a fleet run sends the same text.
_SCRIPTS = {PROBES: FACTS_SCRIPT, SUMMARY_PROBES: facts_script(SUMMARY_PROBES)}


def parse_facts(output: str, probes: tuple[Probe, ...] = PROBES) -> Facts:
    """Facts from the output of ``probes``' script; asked sections that never arrived are listed in ``missing``."""
    asked = {probe.name for probe in probes}
    sections = {name: section for name, section in split_sections(output).items() if name in asked}
    v = read(PROBES, sections)
    kernel, arch = v["uname"]
    total, available = v["meminfo"]
    driver, flavour = v["nvidia_version"]
    gpus, smi_driver = v["nvidia_smi"]
    nouveau, nvidia = v["modules"]
    return Facts(
        os=v["os_release"],
        kernel=kernel,
        arch=arch,
        cpus=v["nproc"],
        mem_total_bytes=total,
        mem_available_bytes=available,
        disks=v["df"],
        pci_gpus=v["lspci"] if v["lspci"] is not None else v["pci_sysfs"],  # sysfs when lspci is not installed
        driver_version=driver or smi_driver,  # the loaded module's, else what nvidia-smi reports
        driver_flavour=flavour,
        gpus=gpus,
        nouveau_loaded=nouveau,
        nvidia_loaded=nvidia,
        secure_boot=v["secure_boot"],
        docker=with_daemon_config(v["docker_info"], v["daemon_json"]),
        daemon_json=v["daemon_json"],
        toolkit_version=v["nvidia_ctk"],
        cgroup_version=v["cgroup"],
        system=system_facts(v),
        gpuhost=gpuhost_facts(v),
        missing=tuple(probe.name for probe in probes if probe.name not in sections),
        unasked=tuple(probe.name for probe in PROBES if probe.name not in asked),
    )


def gather(conn: Connection, timeout: float | None = 60.0, probes: tuple[Probe, ...] = PROBES) -> Facts:
    """Facts of the host behind ``conn``: one exec of ``probes``' script (all of them unless told); no section back is an error.

    Facts with some sections missing are returned (``missing`` names them, ``incomplete`` says it in
    one line) for the caller to refuse: nothing may be planned or reported ``ok`` from them.
    """
    script = _SCRIPTS.get(probes) or facts_script(probes)
    result = conn.run(["sh", "-c", script], warn=True, timeout=timeout)
    facts = parse_facts(result.stdout, probes)
    if len(facts.missing) == len(probes):  # something else ran in the probe's place, or nothing did
        said = excerpt(last_line(result.stdout, result.stderr), 60) if last_line(result.stdout, result.stderr) else "nothing"
        raise HostError(
            f"the host ran something else than the probe (ForceCommand? broken login shell?): it printed {said} and exited {result.exited}",
            "run 'ssh HOST true' by hand and check the user's login shell and any ForceCommand in the host's sshd_config",
            host=conn.name,
        )
    return facts


def gather_complete(conn: Connection, timeout: float | None = 60.0, probes: tuple[Probe, ...] = PROBES) -> Facts:
    """``gather``, where facts with any probe's output missing are a HostError (the ``facts`` task's rule: never ``ok`` from half an answer)."""
    facts = gather(conn, timeout, probes)
    if facts.incomplete:
        raise HostError(facts.incomplete, "check the host (disk full? killed session? a login shell that exits early?) and run again", host=conn.name)
    return facts


__all__ = [
    "ABSENT",
    "DaemonConfig",
    "Disk",
    "DockerInfo",
    "FACTS_SCRIPT",
    "Facts",
    "GpuHostFacts",
    "Gpu",
    "MARK",
    "OsInfo",
    "PROBES",
    "PciGpu",
    "Probe",
    "RC_MARK",
    "SUMMARY_PROBES",
    "Section",
    "SystemFacts",
    "facts_script",
    "gather",
    "gather_complete",
    "parse_cgroup",
    "parse_daemon_json",
    "parse_df",
    "parse_docker",
    "parse_facts",
    "parse_int",
    "parse_lspci",
    "parse_meminfo",
    "parse_modules",
    "parse_nvidia_ctk",
    "parse_nvidia_smi",
    "parse_nvidia_version",
    "parse_os_release",
    "parse_pci_sysfs",
    "parse_secure_boot",
    "parse_uname",
    "read",
    "split_sections",
    "system_facts",
    "with_daemon_config",
]
