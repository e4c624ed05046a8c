"""What a Slurm host is (``SlurmFacts``, one probe script) and what it should be: the plans of the slurm steps, pure.

Four steps per host, planned from its facts and the cluster (``SlurmCluster``):

- ``slurm-packages``: munge, slurmctld or slurmd, slurm-client (and python3 on
  nodes, for the health program), installed with every service start held
  back (Debian 13's slurmd otherwise blocks apt for 90 s trying configless
  mode); the daemons step starts them once their files are there.
- ``slurm-munge``: one key for the cluster. The controller's is the cluster's
  once gpurig made it there (128 random bytes as hex, made on the host, never
  in a command line); a node whose key differs gets it by SFTP, 0400 munge's,
  with no backup of the old one. Reports show its sha256's first 12 digits.
- ``slurm-config``: slurm.conf, gres.conf, cgroup.conf on every host; the
  Prolog, Epilog, health program, gpurig's host probe and its settings on nodes.
- ``slurm-daemons``: munge and slurmctld/slurmd enabled and running; a
  change of the node set, a node's GPUs, gres.conf or cgroup.conf restarts
  the daemons, any other change is an ``scontrol reconfigure`` (Slurm
  applies those live; a node or GRES count change it refuses, or dies on).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import shlex
from dataclasses import dataclass, field

from gpurig.facts.probes import Probe, Section, facts_script, read, split_sections
from gpurig.slurm import conf
from gpurig.steps.apt import install_command
from gpurig.steps.commands import Shell, Upload
from gpurig.steps.hostfiles import unified_diff
from gpurig.steps.plan import Change, Plan

MUNGE_KEY = "/etc/munge/munge.key"
MUNGE_MARK = "/etc/munge/gpurig-key.sha256"  # the sha256 of the key gpurig made on the controller: it is the cluster's
CONTROLLER_PACKAGES = ("munge", "slurmctld", "slurm-client")
NODE_PACKAGES = ("munge", "slurmd", "slurm-client", "python3")
REST_PACKAGES = ("slurmrestd", "slurm-wlm-jwt-plugin")  # the controller's, with gpurig_slurm.rest; every host needs the plugin
UNITS = ("munge", "slurmctld", "slurmd", "slurmrestd")
SHIPPED = {conf.HEALTH: "checks/slurm_health.py", conf.HEALTH_PROBE: "checks/verify_host.py"}
MANAGED = (conf.SLURM_CONF, conf.GRES_CONF, conf.CGROUP_CONF, conf.PROLOG, conf.EPILOG, conf.HEALTH_SETTINGS, conf.REST_DROPIN, *SHIPPED)
# the files whose change Slurm does not take live (scontrol reconfigure): the daemons restart
RESTART_FILES = (conf.GRES_CONF, conf.CGROUP_CONF)
NVIDIA_MAJOR = 195


def _lines(section: Section) -> list[str]:
    return [line for line in section.text.splitlines() if line.strip()] if section.ok else []


def _packages(section: Section) -> dict[str, str]:
    found = {}
    for line in section.text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1].startswith("ii"):
            found[parts[0]] = parts[2]
    return found


def _munge(section: Section) -> tuple[str | None, str | None]:
    lines = [line.strip() for line in section.text.splitlines() if line.strip()]
    key = lines[0] if lines and re.fullmatch(r"[0-9a-f]{64}", lines[0]) else None
    mark = lines[1] if len(lines) > 1 and re.fullmatch(r"[0-9a-f]{64}", lines[1]) else None
    return key, mark


def _devices(section: Section) -> tuple[int, ...]:
    minors = []
    for line in section.text.splitlines():
        parts = line.split()
        if len(parts) == 3 and re.fullmatch(r"/dev/nvidia[0-9]+", parts[0]):
            try:
                major, minor = int(parts[1], 16), int(parts[2], 16)
            except ValueError:
                continue
            if major == NVIDIA_MAJOR and minor < 255:
                minors.append(minor)
    return tuple(sorted(set(minors)))


def _files(section: Section) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for line in section.text.splitlines():
        path, _, body = line.partition(" ")
        if path not in MANAGED:
            continue
        if body == "-":
            found[path] = None
            continue
        try:
            found[path] = base64.b64decode(body, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            found[path] = ""  # unreadable as text: different from anything gpurig writes
    return found


def _units(section: Section) -> dict[str, tuple[bool, bool]]:
    found = {}
    for line in section.text.splitlines():
        parts = line.split()
        if len(parts) >= 1 and parts[0] in UNITS:
            found[parts[0]] = (len(parts) > 1 and parts[1] == "active", len(parts) > 2 and parts[2] == "enabled")
    return found


def sinfo_nodes(section: Section) -> dict[str, tuple[str, str]]:
    """``sinfo -h -N -o '%N|%T|%E'``: NodeName -> (state, reason)."""
    found = {}
    for line in section.text.splitlines() if section.ok else ():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if name:
            found[name.strip()] = (state.strip(), reason.strip())
    return found


_FILES = " ".join(shlex.quote(p) for p in MANAGED)
PROBES = (
    Probe("hostname", "hostname -s 2>/dev/null || hostname", lambda s: (_lines(s) or [""])[0].strip()),
    Probe("packages", "dpkg-query -W -f '${Package}\\t${db:Status-Abbrev}\\t${Version}\\n' munge slurmctld slurmd slurm-client python3 "
                      "slurmrestd slurm-wlm-jwt-plugin 2>/dev/null; true", _packages),
    Probe("munge", f"[ -r {MUNGE_KEY} ] && sha256sum {MUNGE_KEY} | cut -d' ' -f1 && cat {MUNGE_MARK} 2>/dev/null; true", _munge),
    Probe("slurmd", "command -v slurmd >/dev/null && slurmd -C 2>/dev/null | head -n 1", lambda s: conf.parse_slurmd_c(s.text) if s.ok else None),
    Probe("devices", "for f in /dev/nvidia[0-9]*; do [ -c \"$f\" ] && stat -c '%n %t %T' \"$f\"; done; true", _devices),
    Probe("models", "nvidia-smi --query-gpu=name --format=csv,noheader", lambda s: tuple(_lines(s))),
    Probe("files", f"for f in {_FILES}; do if [ -f \"$f\" ]; then printf '%s ' \"$f\"; base64 -w0 \"$f\"; echo; "
                   "else echo \"$f -\"; fi; done", _files),
    Probe("rest", f"[ -s {conf.JWT_KEY} ] && echo key; id -u slurmrestd >/dev/null 2>&1 && echo user; true",
          lambda s: tuple(_lines(s))),
    Probe("units", "for u in munge slurmctld slurmd slurmrestd; do echo \"$u $(systemctl is-active $u 2>/dev/null) $(systemctl is-enabled $u 2>/dev/null)\"; "
                   "done", _units),
    Probe("sinfo", "command -v sinfo >/dev/null && systemctl is-active -q slurmctld && sinfo -h -N -o '%N|%T|%E'", sinfo_nodes),
)
SCRIPT = facts_script(PROBES)


@dataclass(frozen=True)
class SlurmFacts:
    host: str
    hostname: str
    packages: dict[str, str] = field(default_factory=dict)
    munge_key: str | None = None  # its sha256
    munge_mark: str | None = None  # the sha256 gpurig recorded when it made the key (the controller's)
    hardware: tuple[tuple[str, int], ...] | None = None
    devices: tuple[int, ...] = ()
    models: tuple[str, ...] = ()
    files: dict[str, str | None] = field(default_factory=dict)
    units: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # unit -> (active, enabled)
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)  # the controller's view: NodeName -> (state, reason)
    rest: tuple[str, ...] = ()  # "key": slurmctld's JWT key is there; "user": slurmrestd's user exists

    @property
    def version(self) -> tuple[int, int]:
        """The installed Slurm's release (22.05 -> (22, 5)), from its packages; (0, 0) when none is installed."""
        found = re.match(r"(\d+)\.(\d+)", self.packages.get("slurmctld") or self.packages.get("slurmd") or "")
        return (int(found.group(1)), int(found.group(2))) if found else (0, 0)

    def active(self, unit: str) -> bool:
        return self.units.get(unit, (False, False))[0]

    def enabled(self, unit: str) -> bool:
        return self.units.get(unit, (False, False))[1]


def parse(host: str, output: str) -> SlurmFacts:
    v = read(PROBES, split_sections(output))
    key, mark = v["munge"]
    return SlurmFacts(host, v["hostname"], v["packages"], key, mark, v["slurmd"], v["devices"], v["models"], v["files"], v["units"], v["sinfo"],
                      v["rest"])


def gather(conn) -> SlurmFacts:
    return parse(conn.name, conn.admin("sh -c " + shlex.quote(SCRIPT), warn=True, timeout=120).stdout)


# --- plans, per host ------------------------------------------------------------------------------------------


def plan_packages(facts: SlurmFacts, controller: bool, rest: bool = False) -> Plan:
    wanted = (CONTROLLER_PACKAGES if controller else NODE_PACKAGES) + ((REST_PACKAGES if controller else REST_PACKAGES[1:]) if rest else ())
    missing = [p for p in wanted if p not in facts.packages]
    if not missing:
        return Plan.ok(", ".join(f"{p} {facts.packages[p]}" for p in wanted if p != "python3"))
    return Plan.change(f"{', '.join(missing)} not installed", Change(f"install {' '.join(missing)}", (Shell(held_starts(install_command(*missing))),)))


def held_starts(line: str) -> str:
    """``line`` with every service start of a package's install held back (policy-rc.d), unless the host has its own policy."""
    policy = "/usr/sbin/policy-rc.d"
    return (f"made=; if [ ! -e {policy} ]; then printf '#!/bin/sh\\nexit 101\\n' > {policy} && chmod 0755 {policy} && made=1; fi; "
            f"( {line} ); rc=$?; [ -z \"$made\" ] || rm -f {policy}; exit $rc")


MAKE_KEY = (f"set -e; umask 077; k={MUNGE_KEY}; od -An -tx1 -N128 /dev/urandom | tr -d ' \\n' > $k.gpurig-new; echo >> $k.gpurig-new; "
            f"chown munge:munge $k.gpurig-new; chmod 0400 $k.gpurig-new; mv -f $k.gpurig-new $k; "
            f"sha256sum $k | cut -d' ' -f1 > {MUNGE_MARK}; chmod 0644 {MUNGE_MARK}; "
            "if systemctl is-active -q munge; then systemctl restart munge; fi")
KEY_STAGE = "/etc/gpurig/munge.key.new"  # root's 0400: /etc/munge is munge's, where gpurig's uploads refuse to write
PLACE_KEY = (f"set -e; umask 077; k={MUNGE_KEY}; cp {KEY_STAGE} $k.gpurig-new; rm -f {KEY_STAGE}; chown munge:munge $k.gpurig-new; "
             "chmod 0400 $k.gpurig-new; mv -f $k.gpurig-new $k; if systemctl is-active -q munge; then systemctl restart munge; fi")


MAKE_JWT_KEY = (f"set -e; umask 077; k={conf.JWT_KEY}; dd if=/dev/urandom of=$k.gpurig-new bs=32 count=1 status=none; "
                "chown slurm:slurm $k.gpurig-new; chmod 0600 $k.gpurig-new; mv -f $k.gpurig-new $k")
MAKE_REST_USER = "useradd --system --no-create-home --shell /usr/sbin/nologin slurmrestd"


def plan_rest(facts: SlurmFacts) -> Plan:
    """slurmrestd's prerequisites on the controller: slurmctld's JWT key (made there, slurm's 0600) and the daemon's own user."""
    commands, said = [], []
    if "key" not in facts.rest:
        commands.append(Shell(MAKE_JWT_KEY))
        said.append("make slurmctld's JWT key")
    if "user" not in facts.rest:
        commands.append(Shell(MAKE_REST_USER))
        said.append("add the slurmrestd user")
    if not commands:
        return Plan.ok("slurmctld's JWT key and slurmrestd's user are there")
    return Plan.change(", ".join(said), Change(", ".join(said), tuple(commands)))


def plan_controller_key(facts: SlurmFacts) -> Plan:
    if facts.munge_key and facts.munge_key == facts.munge_mark:
        return Plan.ok(f"the cluster's key (sha256 {facts.munge_key[:12]})")
    why = "no munge key" if not facts.munge_key else "the munge key is not one gpurig made for the cluster"
    return Plan.change(why, Change("make the cluster's munge key", (Shell(MAKE_KEY),)))


def plan_node_key(facts: SlurmFacts, key_sha: str | None, key_text: str | None) -> Plan:
    if key_sha and facts.munge_key == key_sha:
        return Plan.ok(f"the cluster's key (sha256 {key_sha[:12]})")
    if key_text is None:  # check mode on a new cluster: the controller has not made it yet
        return Plan.change("no key of the cluster's yet", Change("install the cluster's munge key once the controller made it"))
    upload = Upload(KEY_STAGE, content=key_text, mode=0o400, backup=False)  # no copy of an old key left behind
    return Plan.change("a munge key other than the cluster's" if facts.munge_key else "no munge key",
                       Change(f"install the cluster's munge key (sha256 {key_sha[:12] if key_sha else '?'})", (upload, Shell(PLACE_KEY))))


def key_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def plan_files(facts: SlurmFacts, wanted: dict[str, tuple[str, int]]) -> Plan:
    """One change per file that differs (with its diff; the health program and probe as their shipped text)."""
    changes = []
    for path, (text, mode) in wanted.items():
        old = facts.files.get(path)
        if old == text:
            continue
        shown = "" if path in SHIPPED else unified_diff(path, old, text)
        changes.append(Change(f"{'write' if old is None else 'update'} {path}", (Upload(path, content=text, mode=mode),), diff=shown))
    if not changes:
        return Plan.ok(f"{len(wanted)} files as gpurig writes them")
    return Plan.change(f"{len(changes)} of {len(wanted)} files differ", *changes)


def differs(facts: SlurmFacts, wanted: dict[str, tuple[str, int]], paths: tuple[str, ...]) -> bool:
    """Whether any of ``paths`` that gpurig writes on this host is not as it wants it."""
    return any(facts.files.get(p) != wanted[p][0] for p in paths if p in wanted)


def needs_restart(facts: SlurmFacts, wanted: dict[str, tuple[str, int]]) -> bool:
    """Whether the files' change is one Slurm does not take with a reconfigure: gres.conf, cgroup.conf, the node lines."""
    if differs(facts, wanted, RESTART_FILES):
        return True
    old = facts.files.get(conf.SLURM_CONF) or ""
    return _node_lines(old) != _node_lines(wanted[conf.SLURM_CONF][0])


def _node_lines(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith(("NodeName=", "SlurmctldHost=", "ClusterName=", "AuthAlt")))


def plan_daemons(facts: SlurmFacts, controller: bool, restart: bool, changed: bool, rest: bool = False, rest_changed: bool = False,
                 regroup: bool = False) -> Plan:
    """Start what is not running; restart after a change Slurm does not take live; else a reconfigure (the controller's).

    ``rest``: slurmrestd runs too (the controller's), restarted after its unit's drop-in changed. ``regroup``: a user
    joined the docker group on this host, and Slurm caches a user's groups (GroupUpdateTime, 10 minutes): the daemon
    restarts, so the user's next job gets the group. slurmctld's matters most: it looks the groups up on the
    controller and sends them with the job (seen on 22.05: a node's own membership did not count); slurmd's where
    that is turned off (LaunchParameters=disable_send_gids).
    """
    daemon = "slurmctld" if controller else "slurmd"
    commands: list[Shell] = [Shell("systemctl daemon-reload")] if rest_changed else []
    said = []
    units = ("munge", daemon, *(("slurmrestd",) if controller and rest else ()))
    for unit in units:
        if not facts.enabled(unit):
            commands.append(Shell(f"systemctl enable {unit}"))
        if not facts.active(unit):
            commands.append(Shell(f"systemctl start {unit}"))
            said.append(f"start {unit}")
        elif (unit == daemon and restart) or (unit == "slurmrestd" and (restart or rest_changed)):
            commands.append(Shell(f"systemctl restart {unit}"))
            said.append(f"restart {unit}")
        elif unit == daemon and regroup:
            commands.append(Shell(f"systemctl restart {unit}"))
            said.append(f"restart {unit} (a user joined the docker group: its jobs get the new group)")
    if controller and changed and not restart and not regroup and facts.active(daemon):
        commands.append(Shell("scontrol reconfigure"))
        said.append("scontrol reconfigure")
    if not commands:  # a daemon-reload comes only with slurmrestd's start or restart
        return Plan.ok(f"{', '.join(units[:-1])} and {units[-1]} running")
    return Plan.change(", ".join(said) or "enable at boot", Change(", ".join(said) or f"enable munge and {daemon}", tuple(commands)))
