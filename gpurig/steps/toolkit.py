"""The ``container-toolkit`` step: nvidia-container-toolkit installed (optionally pinned) and Docker's ``nvidia`` runtime set.

Online, the package comes from NVIDIA's libnvidia-container apt repository,
its key kept in its own keyring named by ``signed-by``. Air-gapped
(``gpurig_toolkit.packages_dir``), the ``.deb`` files of that directory on
this machine are pushed over SSH and installed with apt from the host's own
disk. The runtime is merged into /etc/docker/daemon.json (as ``nvidia-ctk
runtime configure`` writes it) only when Docker's config lacks it; every
other key stays.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from gpurig.connect.engineinfo import has_nvidia_runtime
from gpurig.errors import InventoryError
from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile
from gpurig.steps.apt import download_command, install_command
from gpurig.steps.commands import Shell, Upload
from gpurig.steps.daemon import DAEMON_JSON, merge, render, restart_command
from gpurig.steps.gpus import NO_GPU
from gpurig.steps.hostfiles import unified_diff
from gpurig.steps.plan import Change, Plan, Step

PACKAGE = "nvidia-container-toolkit"
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.asc"
SOURCE_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
GPGKEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
# apt replaces $(ARCH) itself; this is the line NVIDIA's own list file holds.
SOURCE_LINE = f"deb [signed-by={KEYRING}] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
NVIDIA_RUNTIME = {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
AIR_GAPPED_FIX = (
    "the host cannot reach NVIDIA's repository (nvidia.github.io): for an air-gapped host set "
    "gpurig_toolkit.packages_dir to a directory on this machine holding the toolkit's .deb files "
    "(nvidia-container-toolkit, nvidia-container-toolkit-base, libnvidia-container-tools, libnvidia-container1); "
    "gpurig pushes them over SSH and installs them"
)


class ToolkitStep(Step):
    """NVIDIA's container toolkit, from ``gpurig_toolkit``."""

    name = "container-toolkit"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        system = facts.system
        pin = wanted.toolkit.version
        have = system.installed.get(PACKAGE)
        changes: list[Change] = []
        if have is None or (pin and not _pinned(have, pin)):
            changes += self._install(facts, wanted, have)
        if not has_nvidia_runtime(facts.docker.runtimes) and not has_nvidia_runtime((facts.daemon_json.content or {}).get("runtimes") or {}):
            if facts.daemon_json.state not in ("present", "absent"):
                return Plan.fail(f"{DAEMON_JSON} is {facts.daemon_json.state} ({facts.daemon_json.problem}): the nvidia runtime "
                                 "cannot be merged into it", "correct the file by hand and run again")
            current = facts.daemon_json.content or {}
            content = render(merge(current, NVIDIA_RUNTIME), facts.daemon_json.text)
            old = facts.daemon_json.text if facts.daemon_json.state == "present" else None
            changes.append(Change(f"add the nvidia runtime to {DAEMON_JSON}", (Upload(DAEMON_JSON, content=content),),
                                  unified_diff(DAEMON_JSON, old, content)))
            if facts.docker.running:
                changes.append(Change("restart Docker so that it knows the nvidia runtime",
                                      (Shell(restart_command(facts.daemon_json.state == "present")),)))
        if not changes:
            return Plan.ok(f"{PACKAGE} {have} installed; Docker knows the nvidia runtime")
        state = "not installed" if have is None else f"{have} installed" + (f", {pin} wanted" if pin and not _pinned(have, pin) else "")
        return Plan.change(f"{PACKAGE} {state}", *changes)

    def _install(self, facts: Facts, wanted: HostProfile, have: str | None) -> list[Change]:
        pin = wanted.toolkit.version
        if wanted.toolkit.packages_dir:
            debs = _local_debs(wanted.toolkit.packages_dir, wanted.host)
            digest = hashlib.sha256("".join(str(p) for p in debs).encode()).hexdigest()[:12]
            remote = f"/tmp/gpurig-toolkit-{digest}"
            uploads = tuple(Upload(f"{remote}/{p.name}", local=str(p), backup=False) for p in debs)
            command = install_command(*[f"./{p.name}" for p in debs], update=False)
            return [Change(f"install {PACKAGE} from {len(debs)} .deb files in {wanted.toolkit.packages_dir} (pushed over SSH)",
                           (*uploads, Shell(f"cd {shlex.quote(remote)} && {command}"), Shell(shlex.join(["rm", "-rf", "--", remote]))))]
        changes = []
        if "nvidia-container-toolkit" not in facts.system.repositories:
            changes.append(Change(
                f"add NVIDIA's libnvidia-container apt repository (key in {KEYRING})",
                (Shell(install_command("ca-certificates")), Shell(download_command(GPGKEY_URL, KEYRING)),
                 Upload(SOURCE_LIST, content=SOURCE_LINE, backup=False)),
                fix=AIR_GAPPED_FIX,
            ))
        packages = [f"{PACKAGE}={pin}*", f"nvidia-container-toolkit-base={pin}*"] if pin else [PACKAGE]
        changes.append(Change(f"install {PACKAGE}{' ' + pin if pin else ''} from NVIDIA's repository",
                              (Shell(install_command(*packages)),), fix=AIR_GAPPED_FIX))
        return changes


def _pinned(have: str, pin: str) -> bool:
    """The installed version is the pinned one: equal, or the pin plus a Debian revision (1.17.8 -> 1.17.8-1, not 1.17.80)."""
    return have == pin or any(have.startswith(pin + sep) for sep in "-~+")


def _local_debs(directory: str, host: str) -> list[Path]:
    folder = Path(directory).expanduser()
    debs = sorted(folder.glob("*.deb")) if folder.is_dir() else []
    if not debs:
        raise InventoryError(
            f"host {host}: gpurig_toolkit.packages_dir {directory} holds no .deb files" if folder.is_dir()
            else f"host {host}: gpurig_toolkit.packages_dir {directory} is not a directory on this machine",
            "download nvidia-container-toolkit and its dependencies (apt-get download on a connected machine) into it",
        )
    return debs
