"""The facts script: every probe in one exec, each one's output between marker lines, cut apart again."""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.facts.system import SYSTEM_PROBES

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


