"""The facts behind the traps of a GPU host that already works: device links, NVSwitch fabric, held packages, MIG, persistence.

Each probe joins ``gpurig.facts.PROBES`` in the same one-round-trip script,
declared beside its pure parser and tested from recorded output. Every
parser fails closed: a probe whose output did not end as the probe ends it
(the ``end`` line its shell prints last), or whose command was missing or
failed, gives None ("not known"), never an empty answer that would read as
"nothing wrong here". The traps (issue 19):

- containers lose their GPUs on ``systemctl daemon-reload`` where Docker uses
  the systemd cgroup driver and /dev/char has no links to the /dev/nvidia*
  nodes (``DevChar``);
- NVSwitch systems need nvidia-fabricmanager of the driver's own version
  (``Fabric``; the package and its unit come from gpurig.facts.system);
- unattended-upgrades replaces the driver's libraries under a loaded module
  (``UpgradePolicy``, ``held``);
- MIG shifts what a GPU index means, persistence off re-initialises every GPU
  at each CUDA start (``GpuMode``, ``MigDevice``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpurig.facts.probes import Probe, Section
from gpurig.strict.validate import whole_number

END = "end"  # the last line every probe here prints: without it, the probe was cut short or never ran
DEV_CHAR_RULE = "71-nvidia-dev-char.rules"  # NVIDIA's udev rule that makes the links on every driver load


@dataclass(frozen=True)
class DevChar:
    """The /dev/nvidia* character devices and the /dev/char/MAJOR:MINOR links that point at them."""

    nodes: tuple[str, ...] = ()  # e.g. /dev/nvidia0, /dev/nvidiactl
    links: tuple[str, ...] = ()  # the node names the links resolve to (nvidia0, nvidiactl)
    rules: tuple[str, ...] = ()  # udev rule files that make them again at each driver load

    @property
    def unlinked(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n.rsplit("/", 1)[-1] not in self.links)


@dataclass(frozen=True)
class Fabric:
    """NVSwitch bridges on the PCI bus and the fabric state each GPU reports (nvidia-smi -q, Hopper and newer)."""

    nvswitches: tuple[str, ...] = ()  # PCI slots
    states: tuple[str, ...] = ()  # one per GPU: Completed, In Progress, Not Started, N/A


@dataclass(frozen=True)
class UpgradePolicy:
    """What unattended-upgrades is set to do (apt-config dump: every snippet of /etc/apt/apt.conf.d merged)."""

    enabled: bool = False  # APT::Periodic::Unattended-Upgrade is a number above 0
    origins: tuple[str, ...] = ()  # Allowed-Origins and Origins-Pattern
    blacklist: tuple[str, ...] = ()  # Package-Blacklist: regular expressions matched at the start of a package name

    def blacklisted(self, package: str) -> bool:
        for pattern in self.blacklist:
            try:
                if re.match(pattern, package):
                    return True
            except re.error:
                if package.startswith(pattern):
                    return True
        return False


@dataclass(frozen=True)
class GpuMode:
    """One GPU's persistence and MIG modes; None where the GPU does not have the mode ([N/A])."""

    index: int
    uuid: str
    persistence: bool | None
    mig: bool | None  # current
    mig_pending: bool | None  # after the next GPU reset or reboot


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance as ``nvidia-smi -L`` lists it under its GPU."""

    gpu: int
    profile: str  # e.g. 3g.40gb
    uuid: str  # MIG-...


@dataclass(frozen=True)
class GpuHostFacts:
    """The traps' facts; None: that probe's answer is not known (missing command, failed, cut short)."""

    dev_char: DevChar | None = None
    fabric: Fabric | None = None
    held: tuple[str, ...] | None = None  # packages on hold (dpkg selection state, as apt-mark showhold lists them)
    upgrades: UpgradePolicy | None = None
    gpu_modes: tuple[GpuMode, ...] | None = None
    mig_devices: tuple[MigDevice, ...] = ()

    def mig_on(self) -> tuple[int, ...]:
        """Indexes of the GPUs whose MIG mode is on now."""
        return tuple(g.index for g in self.gpu_modes or () if g.mig)


def _ended(s: Section) -> list[str] | None:
    """The section's lines before its ``end`` line; None when it has none (cut short, or the shell failed)."""
    lines = s.text.splitlines()
    if s.rc != 0 or END not in lines:
        return None
    return lines[:lines.index(END)]


def parse_dev_char(s: Section) -> DevChar | None:
    """``node PATH`` / ``link PATH TARGET`` / ``rule PATH`` lines, then ``end``."""
    lines = _ended(s)
    if lines is None:
        return None
    nodes, links, rules = [], [], []
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "node" and rest:
            nodes.append(rest.strip())
        elif kind == "link" and len(rest.split()) == 2:
            links.append(rest.split()[1].rsplit("/", 1)[-1])
        elif kind == "rule" and rest:
            rules.append(rest.strip())
    return DevChar(tuple(nodes), tuple(sorted(set(links))), tuple(rules))


DEV_CHAR = Probe("dev_char", "for n in /dev/nvidia*; do [ -c \"$n\" ] && echo \"node $n\"; done;"
                 " find /dev/char -maxdepth 1 -lname '*nvidia*' -printf 'link %p %l\\n' 2>/dev/null;"
                 f" for r in /etc/udev/rules.d/{DEV_CHAR_RULE} /lib/udev/rules.d/{DEV_CHAR_RULE} /usr/lib/udev/rules.d/{DEV_CHAR_RULE};"
                 f" do [ -e \"$r\" ] && echo \"rule $r\"; done; echo {END}", parse_dev_char)


def parse_fabric(s: Section) -> Fabric | None:
    """``nvswitch SLOT DEVICE`` lines from sysfs, then (only where there are some) nvidia-smi -q's Fabric blocks, then ``end``."""
    lines = _ended(s)
    if lines is None:
        return None
    switches = tuple(line.split()[1] for line in lines if line.startswith("nvswitch ") and len(line.split()) >= 2)
    states, inside = [], False
    for line in lines:
        if line.strip() == "Fabric":
            inside = True
        elif inside and line.strip().startswith("State"):
            states.append(line.split(":", 1)[1].strip())
            inside = False
    return Fabric(switches, tuple(states))


FABRIC = Probe("fabric", "n=0; for d in $(grep -lsx 0x068000 /sys/bus/pci/devices/*/class | sed 's,/class$,,'); do"
               " if grep -qsx 0x10de $d/vendor; then echo \"nvswitch ${d##*/} $(cat $d/device)\"; n=$((n+1)); fi; done;"
               " [ $n -eq 0 ] || nvidia-smi -q | grep -A2 -E '^ +Fabric$'; echo " + END, parse_fabric)


def parse_held(s: Section) -> tuple[str, ...] | None:
    """Names of the packages on hold (what ``apt-mark showhold`` lists); None when dpkg-query is missing or failed."""
    if not s.ok:
        return None
    return tuple(line.strip() for line in s.text.splitlines() if re.fullmatch(r"[a-z0-9][a-z0-9+.:-]*", line.strip()))


# dpkg's own selection state (db:Status-Abbrev 'h.' = hold), not apt-mark showhold: apt-mark builds apt's whole
# cache first, about 0.5 s of CPU per host as a non-root user, which took facts of 20 loopback hosts from 1.2 s to 7.8 s
HELD = Probe("held", "q=$(dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\t${Version}\\n') || exit $?; "
             "printf '%s\\n' \"$q\" | awk -F'\\t' '$2 ~ /^h/' | cut -f1", parse_held)

_APT_VALUE = re.compile(r'^(?P<key>[A-Za-z:-]+?)(?P<item>::)? "(?P<value>.*)";$')


def parse_upgrades(s: Section) -> UpgradePolicy | None:
    """unattended-upgrades' settings from apt-config dump's lines (``Key:: "value";``), then ``end``."""
    lines = _ended(s)
    if lines is None:
        return None
    enabled, origins, blacklist = False, [], []
    for line in lines:
        m = _APT_VALUE.match(line.strip())
        if not m:
            continue
        key, value = m.group("key"), m.group("value")
        if key == "APT::Periodic::Unattended-Upgrade":
            number = whole_number(value)
            enabled = value == "always" or (number is not None and number > 0)
        elif m.group("item") and key in ("Unattended-Upgrade::Allowed-Origins", "Unattended-Upgrade::Origins-Pattern") and value:
            origins.append(value)
        elif m.group("item") and key == "Unattended-Upgrade::Package-Blacklist" and value:
            blacklist.append(value)
    return UpgradePolicy(enabled, tuple(origins), tuple(blacklist))


UPGRADES = Probe("upgrades", "command -v apt-config >/dev/null || exit 127; apt-config dump | grep -E"
                 " '^(Unattended-Upgrade::(Package-Blacklist|Allowed-Origins|Origins-Pattern)|APT::Periodic::Unattended-Upgrade)(::)? ';"
                 " echo " + END, parse_upgrades)


def _mode(word: str) -> bool | None:
    return {"enabled": True, "disabled": False}.get(word.strip().lower())


def parse_gpu_modes(s: Section) -> tuple[GpuMode, ...] | None:
    """Rows of ``index, uuid, persistence_mode, mig.mode.current, mig.mode.pending``; None when nvidia-smi gave none."""
    modes = []
    for line in s.text.splitlines() if s.ok else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or whole_number(parts[0]) is None:
            continue
        modes.append(GpuMode(int(parts[0]), parts[1], _mode(parts[2]), _mode(parts[3]), _mode(parts[4])))
    return tuple(modes) or None


GPU_MODES = Probe("gpu_modes", "nvidia-smi --query-gpu=index,uuid,persistence_mode,mig.mode.current,mig.mode.pending --format=csv,noheader",
                  parse_gpu_modes)

_GPU_LINE = re.compile(r"^GPU (\d+): ")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9A-Za-z/-]+)\)")


def parse_mig_devices(s: Section) -> tuple[MigDevice, ...]:
    """The MIG lines of ``nvidia-smi -L``, each under its GPU's line."""
    found, gpu = [], None
    for line in s.text.splitlines() if s.ok else []:
        g, m = _GPU_LINE.match(line), _MIG_LINE.match(line)
        if g:
            gpu = int(g.group(1))
        elif m and gpu is not None:
            found.append(MigDevice(gpu, m.group(1), m.group(2)))
    return tuple(found)


GPU_LIST = Probe("gpu_list", "nvidia-smi -L", parse_mig_devices)

GPUHOST_PROBES: tuple[Probe, ...] = (DEV_CHAR, FABRIC, HELD, UPGRADES, GPU_MODES, GPU_LIST)


def gpuhost_facts(values: Mapping[str, Any]) -> GpuHostFacts:
    """GpuHostFacts from these probes' parsed values (``gpurig.facts.probes.read``)."""
    return GpuHostFacts(values["dev_char"], values["fabric"], values["held"], values["upgrades"], values["gpu_modes"],
                        values["gpu_list"])
