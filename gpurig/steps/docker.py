"""The ``docker`` step: a Docker engine installed, enabled and running, and the profile's users in the docker group.

The engine comes from the distribution (``docker.io``) or from Docker's own
apt repository (``gpurig_docker.source: docker``: ``docker-ce``, added with a
signed-by keyring). An engine already installed from either is kept: the
step never swaps one for the other.
"""

from __future__ import annotations

import shlex

from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile
from gpurig.status import Status
from gpurig.steps.apt import download_command, dpkg_arch, install_command
from gpurig.steps.commands import Shell, Upload
from gpurig.steps.plan import Change, Plan, Step, StepResult

ENGINES = {"distro": ("docker.io",), "docker": ("docker-ce", "docker-ce-cli", "containerd.io")}
CLIENTS = {"distro": ("docker-cli",), "docker": ()}  # Debian 13 ships the client apart, only recommended by docker.io
DOCKER_KEYRING = "/etc/apt/keyrings/docker.asc"
DOCKER_LIST = "/etc/apt/sources.list.d/docker.list"
START_SYSTEMD = "systemctl enable --now docker"
START_SYSV = "service docker start"
JOINS_GROUP = " to the docker group"  # how a change that adds a user ends: a daemon that starts the user's processes restarts for it
REPO_FIX = ("the host cannot reach Docker's repository: use gpurig_docker.source: distro (Debian's and Ubuntu's "
            "docker.io), or mirror download.docker.com where the host can reach it")


def docker_repository_changes(facts: Facts) -> list[Change]:
    """Docker's apt repository for this OS release, its key kept in its own keyring (signed-by)."""
    os_id, codename = facts.os.id or "debian", facts.os.codename or ""
    source = (f"deb [arch={dpkg_arch(facts.arch)} signed-by={DOCKER_KEYRING}] "
              f"https://download.docker.com/linux/{os_id} {codename} stable\n")
    return [Change(
        f"add Docker's apt repository for {os_id} {codename} (key in {DOCKER_KEYRING})",
        (Shell(install_command("ca-certificates")),
         Shell(download_command(f"https://download.docker.com/linux/{os_id}/gpg", DOCKER_KEYRING)),
         Upload(DOCKER_LIST, content=source, backup=False)),
        fix=REPO_FIX,
    )]


class DockerStep(Step):
    """The Docker engine, from ``gpurig_docker``."""

    name = "docker"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        system = facts.system
        source = wanted.docker.source
        have = next((p for p in ("docker-ce", "docker.io") if p in system.installed), None)
        changes: list[Change] = []
        if have is None and facts.docker.installed:
            have = "a docker binary outside the package manager"
        if have is None:
            packages = ENGINES[source]
            if source == "docker" and "docker" not in system.repositories:
                changes += docker_repository_changes(facts)
            candidate = system.candidates.get(packages[0])
            version = f" {candidate}" if candidate else ""
            fix = REPO_FIX if source == "docker" else ""
            changes.append(Change(f"install {packages[0]}{version} from {'Docker' if source == 'docker' else 'the distribution'}'s "
                                  "repository", (Shell(install_command(*packages, optional=CLIENTS[source])),), fix=fix))
        service = system.service("docker")
        if system.systemd:
            if have is None or service.enabled != "enabled" or not service.running:
                changes.append(Change("enable and start the docker service", (Shell(START_SYSTEMD),)))
        elif have is None or not facts.docker.running and not facts.docker.denied:
            changes.append(Change("start the docker service", (Shell(START_SYSV),)))
        members = system.docker_members or ()
        for user in wanted.docker.users:
            if user not in members:
                changes.append(Change(f"add {user}{JOINS_GROUP}", (Shell(shlex.join(["usermod", "-aG", "docker", user])),)))
        if not changes:
            users = f"; {', '.join(wanted.docker.users)} in the docker group" if wanted.docker.users else ""
            version = facts.docker.server_version or system.installed.get(have or "", "")
            return Plan.ok(f"Docker {version} ({have}) installed, enabled and running{users}".replace("  ", " "))
        reason = "Docker is not installed" if have is None else f"Docker ({have}) is installed"
        return Plan.change(reason, *changes)


def added_group_members(result: StepResult) -> bool:
    """Whether the docker step added (or, in check mode, would add) a user to the docker group: running daemons keep the old groups."""
    return result.step == DockerStep.name and result.status == Status.CHANGED and any(c.summary.endswith(JOINS_GROUP) for c in result.changes)
