"""The ``daemon`` step: the profile's ``gpurig_daemon`` keys merged into /etc/docker/daemon.json.

Every key the user set stays; nested objects (``runtimes``, ``log-opts``) are
merged key by key, other values (strings, numbers, lists) are replaced by the
wanted ones. The old file is kept as ``daemon.json.gpurig-bak.<UTC time>``.
A file that is not valid JSON is never overwritten: the step fails with the
parser's message. Docker is restarted only when the file changed and only
when it is installed and running; a stopped engine reads the file when it
starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile
from gpurig.steps.commands import Shell, Upload
from gpurig.steps.hostfiles import BACKUP_SUFFIX, unified_diff
from gpurig.steps.plan import Change, Plan, Step

DAEMON_JSON = "/etc/docker/daemon.json"
RESTART_DOCKER = "if [ -d /run/systemd/system ]; then systemctl restart docker; else service docker restart; fi"
# When the login user may not ask the engine whether it runs: restart it only if it does.
RESTART_DOCKER_IF_RUNNING = (
    "if [ -d /run/systemd/system ]; then systemctl try-restart docker; "
    "elif service docker status >/dev/null 2>&1; then service docker restart; fi"
)


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
    return json.dumps(config, indent=_indent(like), ensure_ascii=False) + "\n"


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
        if found.state == "invalid":
            return Plan.fail(
                f"{DAEMON_JSON} is not valid JSON: {found.problem}; gpurig never overwrites a file it cannot parse",
                "correct it (or move it away) by hand and run again",
            )
        if found.state == "unreadable":
            return Plan.fail(
                f"{DAEMON_JSON} cannot be read by the login user, nor through passwordless sudo ({found.problem})",
                f"chmod 0644 {DAEMON_JSON}, or allow the login user sudo without a password",
            )
        if found.state not in ("present", "absent"):
            return Plan.fail(f"{DAEMON_JSON}: the facts do not say what it holds ({found.problem})", "run again")
        current = found.content or {}
        merged = merge(current, wanted.daemon)
        keys = ", ".join(wanted.daemon)
        if found.state == "present" and merged == current:
            return Plan.ok(f"{DAEMON_JSON} already has {keys}")
        old = None if found.state == "absent" else found.text
        content = render(merged, found.text)
        added, altered = differences(current, wanted.daemon)
        what = "; ".join(p for p in (_listed("add", added), _listed("change", altered)) if p)
        if found.state == "absent":
            summary = f"create {DAEMON_JSON}: {what}"
        else:
            summary = f"merge into {DAEMON_JSON}: {what} (old file kept as daemon.json{BACKUP_SUFFIX}.<time>)"
        changes = [Change(summary, (Upload(DAEMON_JSON, content=content),), unified_diff(DAEMON_JSON, old, content))]
        docker = facts.docker
        if docker.running:
            changes.append(Change("restart Docker so that it loads the new daemon.json", (Shell(RESTART_DOCKER),)))
            note = ""
        elif docker.installed and docker.denied:
            changes.append(Change("restart Docker if it is running, so that it loads the new daemon.json", (Shell(RESTART_DOCKER_IF_RUNNING),)))
            note = ""
        elif docker.installed:
            note = "; Docker is stopped and reads the file when it starts"
        else:
            note = "; Docker is not installed yet and reads the file when it starts"
        count = len(added) + len(altered)
        return Plan.change(f"{count} key{'s' if count != 1 else ''} to set{note}", *changes)


def _listed(verb: str, keys: list[str]) -> str:
    return f"{verb} {', '.join(keys)}" if keys else ""
