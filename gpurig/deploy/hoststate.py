"""What deploy reads from a host beside its facts, in one command: listening sockets, volume sources, dockerd's limits.

Also the one thing deploy makes on the host outside Docker: the default
workspace folders (owned by the image's user), with every path quoted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpurig.connect.connection import Connection, quote
from gpurig.deploy.preflight import Refusal, parse_listening
from gpurig.facts.parsers import Disk, parse_df
from gpurig.facts.probes import Probe, Section, facts_script, read, split_sections
from gpurig.strict.validate import whole_number

if TYPE_CHECKING:
    from gpurig.deploy.apply import Target
    from gpurig.deploy.containers import ContainerSpec

CAP_SYS_RESOURCE = 24


def _exists(section: Section) -> list[bool]:
    return [line == "y" for line in section.text.splitlines()]


def _dockerd_limits(section: Section) -> tuple[int | None, bool | None]:
    """(dockerd's hard RLIMIT_MEMLOCK, whether it holds CAP_SYS_RESOURCE); None where unknown."""
    memlock, capable = None, None
    for line in section.text.splitlines():
        words = line.split()
        if line.lower().startswith("max locked memory") and len(words) >= 5:
            hard = words[4]
            memlock = -1 if hard == "unlimited" else whole_number(hard)
        elif line.startswith("CapEff:") and len(words) == 2:
            try:
                capable = bool(int(words[1], 16) >> CAP_SYS_RESOURCE & 1)
            except ValueError:
                pass
    return memlock, capable


# Declared like the host facts (gpurig/facts/probes.py) and sent as one script. "$@" are the volume sources:
# one y/n line each, in order (a path may hold anything but NUL, so no path is echoed).
PROBES = (
    Probe("tcp", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null", lambda s: parse_listening(s.text)),
    Probe("paths", 'for p in "$@"; do if [ -e "$p" ]; then echo y; else echo n; fi; done', _exists),
    Probe("dockerd", "pid=$(pidof dockerd 2>/dev/null | cut -d' ' -f1); "
                     "if [ -n \"$pid\" ]; then grep -i 'locked memory' /proc/$pid/limits; grep '^CapEff' /proc/$pid/status; fi",
          _dockerd_limits),
    # the login user's home (SUDO_USER: the login where this runs through sudo), where a host serving others keeps its layer cache
    Probe("home", 'h=$(getent passwd "${SUDO_USER:-$(id -un)}" | cut -d: -f6); df -Pk "${h:-$HOME}"', lambda s: next(iter(parse_df(s)), None)),
)
SCRIPT = facts_script(PROBES)


@dataclass(frozen=True)
class HostState:
    listening: set = field(default_factory=set)  # {(address, port)}
    exists: dict = field(default_factory=dict)  # volume source -> bool
    memlock_hard: int | None = None  # dockerd's hard RLIMIT_MEMLOCK in bytes; -1 unlimited; None unknown
    can_raise_limits: bool | None = None  # whether dockerd holds CAP_SYS_RESOURCE (so containers may exceed its limits)
    home: Disk | None = None  # the disk of the login user's home; None unknown


def read_host(conn: Connection, sources: list[str]) -> HostState:
    line = "sh -c " + quote(SCRIPT) + " sh " + " ".join(quote(s) for s in sources)
    return parse_host_state(conn.admin(line, warn=True, timeout=60).stdout, sources)


def parse_host_state(output: str, sources: list[str]) -> HostState:
    values = read(PROBES, split_sections(output))
    answers = values["paths"]
    exists = {s: answers[i] for i, s in enumerate(sources) if i < len(answers)}
    memlock, capable = values["dockerd"]
    return HostState(values["tcp"], exists, memlock, capable, values["home"])


def check_memlock(spec: ContainerSpec, state: HostState, by_flag: bool = False) -> list[Refusal]:
    """A memlock ulimit above dockerd's own hard limit fails at start ("error setting rlimit") unless dockerd may raise it.

    ``by_flag``: the container is a job's (``run``), whose ulimits are set with --ulimit, not in gpurig_containers.
    """
    if state.memlock_hard in (None, -1) or state.can_raise_limits is not False:
        return []
    for u in spec.ulimits:
        if u.name == "memlock" and (u.hard == -1 or u.hard > state.memlock_hard):
            asked = "unlimited" if u.hard == -1 else f"{u.hard} bytes"
            lower = f"pass --ulimit memlock={state.memlock_hard}" if by_flag else f"set ulimits: {{memlock: {state.memlock_hard}}} in gpurig_containers"
            return [Refusal(spec.name, f"memlock {asked} is above dockerd's hard limit of {state.memlock_hard} bytes, "
                                       "which it may not raise (no CAP_SYS_RESOURCE)",
                            f"{lower}, or give docker.service LimitMEMLOCK=infinity")]
    return []


def check_fits_host(spec: ContainerSpec, state: HostState, cpus: int | None, by_flag: bool = False) -> list[Refusal]:
    """What the host must have for the container: its volume sources (datasets are never made), dockerd's limits, the CPUs asked for.

    ``by_flag``: a job's container, whose limits ``run``'s flags set (check_memlock).
    """
    refusals = [Refusal(spec.name, f"the volume source {v.source!r} does not exist on the host",
                        "create it there (datasets are mounted read-only, never made), or fix the path")
                for v in spec.volumes if not v.create and not state.exists.get(v.source, True)]
    refusals += check_memlock(spec, state, by_flag)
    if spec.cpus and cpus and spec.cpus > cpus:
        refusals.append(Refusal(spec.name, f"cpus: {spec.cpus:g} but the host has {cpus}", f"set cpus to at most {cpus}"))
    return refusals


def make_workspaces(conn: Connection, target: Target) -> None:
    """The default workspace folders, made once and handed to the image's user (the user's own volumes must exist already)."""
    made = [v.source for v in target.spec.volumes if v.create]
    if not made:
        return
    uid = int(target.uid)
    script = "; ".join(f"[ -d {quote(p)} ] || {{ mkdir -p -- {quote(p)} && chown {uid}:{uid} -- {quote(p)}; }}" for p in made)
    conn.admin(script, timeout=60)
