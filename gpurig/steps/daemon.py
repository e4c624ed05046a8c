"""The ``daemon`` step: the profile's ``gpurig_daemon`` keys merged into /etc/docker/daemon.json.

Every key the user set stays; nested objects (``runtimes``, ``log-opts``) are
merged key by key, other values (strings, numbers, lists) are replaced by the
wanted ones. The old file is kept as ``daemon.json.gpurig-bak.<UTC time>``.
A file that is not valid JSON is never overwritten: the step fails with the
parser's message. Docker is restarted only when the file changed and only
when it is installed and running; a stopped engine reads the file when it
starts.

A working Docker is never left broken: the keys were checked against the ones
dockerd reads when the inventory was loaded; the host's own engine checks the
merged file (``dockerd --validate``, Docker 23 and later) before it replaces the
old one; and on every engine a restart that does not come back puts the old
file back, restarts again and fails the step with dockerd's own last line.
The file reaches the host over SFTP (``Upload``), never in a command line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

from gpurig.errors import counted
from gpurig.facts import DaemonConfig, Facts, with_daemon_config
from gpurig.inventory.profile import HostProfile
from gpurig.steps.commands import Shell, Upload
from gpurig.steps.hostfiles import BACKUP_SUFFIX, unified_diff
from gpurig.steps.plan import Change, Plan, Step

DAEMON_JSON = "/etc/docker/daemon.json"
VALIDATE = 'dockerd --validate --config-file "$1"'
VALIDATE_SINCE = 23  # dockerd --validate came with Docker Engine 23.0
# Restarts Docker on the new file; when it does not come back: the old file back ($2 = yes: there was one,
# kept as the newest $1.gpurig-bak.*), the refused one aside, a second restart, and dockerd's own last line.
_RESTART = r"""set -u
path=$1 had=$2 when=$3
systemd=no; [ -d /run/systemd/system ] && systemd=yes
unusable=""
running() { if [ $systemd = yes ]; then systemctl is-active --quiet docker; else service docker status >/dev/null 2>&1; fi; }
restart() {
  if [ $systemd = yes ]; then systemctl reset-failed docker >/dev/null 2>&1; systemctl restart docker >/dev/null 2>&1 || return 1
  else service docker restart >/dev/null 2>&1 || return 1; fi
  # sysvinit's script returns before dockerd has read its file: wait (bounded) for the engine to answer.
  command -v docker >/dev/null 2>&1 || { running; return; }
  i=0; while ! docker version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 30 ] || return 1; sleep 1; done
  # dockerd 20.10 starts with a default log driver it does not have, then fails every container: not back.
  set -- $(docker info --format '{{.LoggingDriver}} {{range .Plugins.Log}}{{.}} {{end}}' 2>/dev/null)
  [ $# -gt 1 ] || return 0
  driver=$1; shift
  for known in "$@"; do [ "$known" = "$driver" ] && return 0; done
  unusable="dockerd started, but has no log driver named '$driver' (it has: $*), so no container would start"
  return 1
}
why() {  # dockerd's own last words since $1 (epoch seconds)
  line=""
  [ -z "$unusable" ] || { echo "$unusable"; unusable=""; return; }
  if [ $systemd = yes ] && command -v journalctl >/dev/null 2>&1; then
    line=$(journalctl _SYSTEMD_UNIT=docker.service --since "@$1" -o cat --no-pager 2>/dev/null | grep . | tail -n 1)
    [ -n "$line" ] || line=$(systemctl status docker --no-pager -l -n 5 2>&1 | grep . | tail -n 1)
  else
    [ -r /var/log/docker.log ] && line=$(grep . /var/log/docker.log | tail -n 1)
    [ -n "$line" ] || line=$(service docker status 2>&1 | grep . | tail -n 1)
  fi
  echo "${line:-no word from dockerd}" | cut -c1-300
}
[ "$when" = if-running ] && ! running && exit 0
start=$(date +%s)
restart && exit 0
reason=$(why "$start")
stamp=$(date -u +%Y%m%dT%H%M%SZ)
backup=$(ls -1d -- "$path".gpurig-bak.* 2>/dev/null | sort | tail -n 1)
mv -f -- "$path" "$path.gpurig-rejected.$stamp"
if [ "$had" = yes ] && [ -n "$backup" ]; then cp -p -- "$backup" "$path.gpurig-tmp" && mv -f -- "$path.gpurig-tmp" "$path"; fi
start=$(date +%s)
if restart; then
  echo "Docker did not start with the new daemon.json, so the old one is back and Docker runs on it again" \
    "(the refused file: $path.gpurig-rejected.$stamp); dockerd said: $reason" >&2
else
  echo "Docker did not start with the new daemon.json, nor with the old one put back; dockerd said: $reason; then: $(why "$start")" >&2
fi
exit 1
"""


def restart_command(had_file: bool, only_if_running: bool = False, path: str = DAEMON_JSON) -> str:
    """The shell line that restarts Docker on the new daemon.json, and puts the old one back when it does not come back.

    ``had_file``: there was a daemon.json before (its newest ``.gpurig-bak.*`` copy is the one put back);
    without one, the new file is moved aside and Docker restarts on its defaults.
    """
    return shlex.join(["sh", "-c", _RESTART, "gpurig-restart-docker", path, "yes" if had_file else "no",
                       "if-running" if only_if_running else "always"])


def engine_version(facts: Facts) -> tuple[int, int] | None:
    """dockerd's (major, minor): the running engine's, else the installed package's ("5:26.1.4-1~..." -> (26, 1))."""
    system = facts.system
    text = facts.docker.server_version or next(
        (system.installed[p] for p in ("docker-ce", "docker.io", "moby-engine") if p in system.installed), None)
    m = re.match(r"(?:\d+:)?(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def as_written(facts: Facts, path: str | None, content: str | None) -> Facts:
    """The facts once ``content`` is at ``path``: a check-mode run plans each later step from what the earlier ones
    would write (daemon.json gets the nvidia runtime from one step and gpurig_daemon's keys from another)."""
    if path != DAEMON_JSON or content is None:
        return facts
    daemon = DaemonConfig("present", json.loads(content), content.rstrip("\n"))
    return dataclasses.replace(facts, daemon_json=daemon, docker=with_daemon_config(facts.docker, daemon))


def text_before(facts: Facts, path: str | None) -> tuple[bool, str | None]:
    """(known, text) of a file a step writes, as the facts hold it (None: absent); daemon.json is the one they hold."""
    if path != DAEMON_JSON or facts.daemon_json.state not in ("present", "absent"):
        return False, None
    return True, facts.daemon_json.text if facts.daemon_json.state == "present" else None


def merge(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` with ``wanted`` laid over it: objects merged recursively, anything else replaced."""
    merged = dict(current)
    for key, value in wanted.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render(config: Mapping[str, Any], like: str = "") -> str:
    """daemon.json as gpurig writes it: indented as the host's file was (``like``), else 4 spaces as nvidia-ctk does."""
    return json.dumps(config, indent=_indent(like), ensure_ascii=False, allow_nan=False) + "\n"


def _indent(text: str) -> int | str:
    m = re.search(r'^([ \t]+)"', text, re.M)
    if not m:
        return 4
    return "\t" if "\t" in m.group(1) else len(m.group(1))


def differences(current: Mapping[str, Any], wanted: Mapping[str, Any], prefix: str = "") -> tuple[list[str], list[str]]:
    """(key paths the merge adds, key paths whose value it changes), e.g. ``log-opts.max-file``."""
    added: list[str] = []
    changed: list[str] = []
    for key, value in wanted.items():
        path = f"{prefix}{key}"
        if key not in current:
            added.append(path)
        elif isinstance(value, Mapping) and isinstance(current[key], Mapping):
            more_added, more_changed = differences(current[key], value, path + ".")
            added += more_added
            changed += more_changed
        elif current[key] != value:
            changed.append(path)
    return added, changed


class DaemonStep(Step):
    """Docker daemon settings from ``gpurig_daemon``."""

    name = "daemon"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not wanted.daemon:
            return Plan.skip("gpurig_daemon is not set for this host")
        found = facts.daemon_json
        failed = daemon_json_problem(facts)
        if failed:
            return failed
        current = found.content or {}
        merged = merge(current, wanted.daemon)
        keys = ", ".join(wanted.daemon)
        if found.state == "present" and merged == current:
            return Plan.ok(f"{DAEMON_JSON} already has {keys}")
        old = None if found.state == "absent" else found.text
        content = render(merged, found.text)
        added, altered = differences(current, wanted.daemon)
        what = "; ".join(p for p in (_listed("add", added), _listed("change", altered)) if p)
        docker = facts.docker
        version = engine_version(facts) if docker.installed else None
        check = VALIDATE if version and version >= (VALIDATE_SINCE, 0) else ""
        checked = "checked by dockerd --validate first" if check else ""
        kept = f"old file kept as daemon.json{BACKUP_SUFFIX}.<time>" if found.state == "present" else ""
        aside = f" ({'; '.join(p for p in (checked, kept) if p)})" if checked or kept else ""
        verb = "create" if found.state == "absent" else "merge into"
        write = Upload(DAEMON_JSON, content=content, check=check)
        fix = "correct gpurig_daemon in the inventory as dockerd's reason says, and run again"
        changes = [Change(f"{verb} {DAEMON_JSON}: {what}{aside}", (write,), unified_diff(DAEMON_JSON, old, content),
                          fix=fix if check else "")]
        if docker.running or (docker.installed and docker.denied):
            only_if_running = not docker.running
            summary = ("restart Docker if it is running, so that it loads the new daemon.json" if only_if_running
                       else "restart Docker so that it loads the new daemon.json")
            changes.append(Change(f"{summary} (the old file is put back if Docker does not come back)",
                                  (Shell(restart_command(found.state == "present", only_if_running)),), fix=fix))
            note = ""
        elif docker.installed:
            note = "; Docker is stopped and reads the file when it starts"
        else:
            note = "; Docker is not installed yet and reads the file when it starts"
        if docker.installed and not check:
            engine = f"Docker {version[0]}.{version[1]}" if version else "this Docker (version unknown)"
            note += f"; {engine} cannot check the file before it is used (dockerd --validate came with {VALIDATE_SINCE}.0)"
        count = len(added) + len(altered)
        return Plan.change(f"{counted(count, 'key')} to set{note}", *changes)


def _listed(verb: str, keys: list[str]) -> str:
    return f"{verb} {', '.join(keys)}" if keys else ""


def daemon_json_problem(facts: Facts) -> Plan | None:
    """The failed plan of a step that must merge into a daemon.json it cannot read or parse; None when it can."""
    found = facts.daemon_json
    if found.state == "invalid":
        return Plan.fail(f"{DAEMON_JSON} is not valid JSON: {found.problem}; gpurig never overwrites a file it cannot parse",
                         "correct it (or move it away) by hand and run again")
    if found.state == "unreadable":
        return Plan.fail(f"{DAEMON_JSON} cannot be read by the login user, nor through passwordless sudo ({found.problem})",
                         f"chmod 0644 {DAEMON_JSON}, or allow the login user sudo without a password")
    if found.state not in ("present", "absent"):
        return Plan.fail(f"{DAEMON_JSON}: the facts do not say what it holds ({found.problem})", "run again")
    return None


def daemon_json_changes(facts: Facts, content: str, summary: str, fix: str) -> list[Change]:
    """Write ``content`` as daemon.json (checked by dockerd --validate where the engine has it), then restart a running Docker."""
    found, docker = facts.daemon_json, facts.docker
    version = engine_version(facts) if docker.installed else None
    check = VALIDATE if version and version >= (VALIDATE_SINCE, 0) else ""
    old = None if found.state == "absent" else found.text
    changes = [Change(summary, (Upload(DAEMON_JSON, content=content, check=check),), unified_diff(DAEMON_JSON, old, content), fix=fix)]
    if docker.running or (docker.installed and docker.denied):
        changes.append(Change("restart Docker so that it loads the new daemon.json (running containers stop unless live-restore is on; "
                              "the old file is put back if Docker does not come back)",
                              (Shell(restart_command(found.state == "present", not docker.running)),), fix=fix))
    return changes
