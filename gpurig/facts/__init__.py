"""What a host is, gathered in one round trip: one shell script, sections between markers, pure parsers.

``FACTS_SCRIPT`` runs every probe in a single exec and prints each one's
output between ``@@gpurig-fact NAME`` and ``@@gpurig-rc CODE`` lines.
``split_sections`` cuts that output apart and one pure ``parse_*`` function
per section turns it into data, so every parser is tested from recorded
output with no host at all. A command that is missing or fails gives an
"absent" value (None, False, empty tuple), never an exception.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.errors import HostError, last_line
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
)
from gpurig.facts.probes import ABSENT, FACTS_SCRIPT, MARK, PROBES, RC_MARK, Section, facts_script, split_sections
from gpurig.facts.system import SystemFacts, parse_system
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
    missing: tuple[str, ...] = field(default=())  # probes whose output never arrived

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


# --- parsers (pure) ---------------------------------------------------------------------------


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


__all__ = [
    "ABSENT",
    "DaemonConfig",
    "Disk",
    "DockerInfo",
    "FACTS_SCRIPT",
    "Facts",
    "Gpu",
    "MARK",
    "OsInfo",
    "PROBES",
    "PciGpu",
    "RC_MARK",
    "Section",
    "SystemFacts",
    "facts_script",
    "gather",
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
    "split_sections",
]
