"""The ``driver`` step: an NVIDIA driver loaded and new enough for the newest CUDA among the images this host runs.

The minimum comes from ``gpurig.image.compat`` for that CUDA (the host's
``gpurig_images``, else the spec's default entry). With
``gpurig_driver.install: true`` a missing or old driver is installed from the
OS (Debian's non-free ``nvidia-driver``, Ubuntu's ``nvidia-driver-NNN-server``)
or NVIDIA's CUDA repository (``cuda-drivers``), with the headers of the
running kernel; what apt would install is compared with the minimum first,
from the facts' ``apt-cache policy`` and again on the host after
``apt-get update``, so a too-old candidate is refused, not installed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpurig.facts import Facts
from gpurig.image.compat import CUDA_RELEASES, driver_at_least, min_driver
from gpurig.inventory.profile import HostProfile
from gpurig.steps.apt import candidate_guard, download_command, dpkg_arch, install_command, upstream
from gpurig.steps.commands import Shell
from gpurig.steps.gpus import NO_GPU
from gpurig.steps.plan import Change, Plan, Step

_CUDA_TAG = re.compile(r"(?:^|[-_.:])cu(\d{2,3})(?=$|[-_.])")
CUDA_KEYRING = "/var/cache/gpurig/cuda-keyring.deb"
SECURE_BOOT = ("Secure Boot is on: the kernel refuses the unsigned module the driver package builds (DKMS), so the "
               "driver would install and never load")
SECURE_BOOT_FIX = ("enroll a Machine Owner Key (mokutil --import) and sign the module with it, use signed precompiled "
                   "modules (Ubuntu's linux-modules-nvidia-*), or turn Secure Boot off in the firmware")


def image_cuda(ref: str) -> str | None:
    """'...:2.14.1-cu130-slim' -> '13.0'; None for a CPU image or a tag that names no CUDA."""
    m = _CUDA_TAG.search(ref.rsplit("/", 1)[-1])
    return f"{m.group(1)[:-1]}.{m.group(1)[-1]}" if m else None


def newest_cuda(images: Sequence[str], default: str | None) -> tuple[str | None, str]:
    """(the newest CUDA among the images, which image asks for it); the spec's default when no image names one."""
    found = [(c, ref) for ref in images if (c := image_cuda(ref))]
    if found:
        cuda, ref = max(found, key=lambda f: upstream(f[0]))
        return cuda, f"image {ref}"
    return default, "the spec's default image"


def newest_cuda_for(driver: str) -> str | None:
    """The newest CUDA (from gpurig.image.compat) whose images this driver version runs with their full feature set."""
    served = [r.cuda for r in CUDA_RELEASES if driver_at_least(driver, r.min_driver)]
    return max(served, key=upstream) if served else None


def mismatch(facts: Facts) -> str:
    """'' or why the loaded kernel module and the installed userspace library differ (NVML refuses to work)."""
    module, library = facts.driver_version, facts.system.nvml_version
    if module and library and module != library:
        return f"driver/library version mismatch: kernel module {module} loaded, userspace library {library} installed"
    return ""


class DriverStep(Step):
    """The NVIDIA driver, from ``gpurig_driver`` and the images' CUDA."""

    name = "driver"

    def __init__(self, default_cuda: str | None = None, reboot: bool = False) -> None:
        self.default_cuda = default_cuda
        self.reboot = reboot

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        cuda, source = newest_cuda(wanted.images, self.default_cuda)
        minimum = min_driver(cuda) if cuda else None
        need = f"CUDA {cuda} ({source}) needs >= {minimum}" if minimum else "no image sets a minimum"
        loaded = facts.driver_version
        differ = mismatch(facts)
        if differ:
            if self.reboot:
                return Plan.ok(f"{differ}: the reboot step reboots the host")
            return Plan.fail(differ, "reboot the host (gpurig provision --reboot) so the new module loads")
        if loaded and (not minimum or driver_at_least(loaded, minimum)):
            return Plan.ok(f"driver {loaded} loaded ({facts.driver_flavour or 'unknown'} module); {need}")
        installed = installed_driver(facts)
        if installed and (not minimum or driver_at_least(installed[1], minimum)) and not loaded:
            return Plan.ok(f"{installed[0]} {installed[1]} installed, not loaded yet: reboot required (the reboot step, with --reboot)")
        what = f"driver {loaded} is too old: {need}" if loaded else f"no NVIDIA driver loaded; {need}"
        if not wanted.driver.install:
            return Plan.fail(what, "set gpurig_driver.install: true for this host (gpurig checks what apt offers, "
                             f"then installs it), or install a driver >= {minimum or 'the newest'} by hand")
        if facts.secure_boot == "enabled":
            return Plan.fail(f"{what}; {SECURE_BOOT}", SECURE_BOOT_FIX)
        package = _package(facts, wanted)
        changes: list[Change] = []
        if wanted.driver.source == "nvidia" and "cuda" not in facts.system.repositories:
            changes.append(_cuda_repository(facts))
        elif package not in facts.system.candidates and wanted.driver.source == "distro":
            return Plan.fail(f"{what}; apt knows no package {package}",
                             ("enable the non-free component in the host's apt sources (Debian ships the driver there)"
                                if facts.os.id == "debian" else "run apt-get update on the host, or set gpurig_driver.branch")
                             + ", or set gpurig_driver.source: nvidia (NVIDIA's CUDA repository)")
        candidate = facts.system.candidates.get(package)
        if package in facts.system.candidates and candidate is None:
            return Plan.fail(f"{what}; apt has no installable {package} (Candidate: (none))",
                             "enable the repository that carries it (Debian: non-free), or set gpurig_driver.source: nvidia")
        if candidate and minimum and not driver_at_least(candidate, minimum):
            served = newest_cuda_for(candidate)
            images = f"images built for CUDA {served} or older (a cu{served.replace('.', '')} tag in gpurig_images)" if served else "CPU images"
            return Plan.fail(
                f"{what}; apt would install {package} {candidate}, older than {minimum}",
                f"install from NVIDIA's CUDA repository (gpurig_driver.source: nvidia), or run {images}, which that driver serves")
        headers = f"linux-headers-{facts.kernel}" if facts.kernel else "linux-headers-amd64"
        guard = candidate_guard(package, minimum, f"CUDA {cuda}") if minimum else ""
        version = f" {candidate}" if candidate else ""
        changes.append(Change(f"install {package}{version} with {headers} (DKMS builds the module for the running kernel)",
                              (Shell(install_command(package, headers, guard=guard)),),
                              fix="install from NVIDIA's CUDA repository (gpurig_driver.source: nvidia), or run images "
                                  "built for CUDA 12.x"))
        return Plan.change(f"{what}; reboot required afterwards (the reboot step, with --reboot)", *changes)


def installed_driver(facts: Facts) -> tuple[str, str] | None:
    for name, version in facts.system.installed.items():
        if name == "nvidia-driver" or name == "cuda-drivers" or re.fullmatch(r"nvidia-driver-\d+(-server|-open)?", name):
            return name, version
    return None


def _package(facts: Facts, wanted: HostProfile) -> str:
    branch = wanted.driver.branch
    if wanted.driver.source == "nvidia":
        return f"cuda-drivers-{branch}" if branch else "cuda-drivers"
    if facts.os.id == "ubuntu":
        if branch:
            return f"nvidia-driver-{branch}-server"
        offered = sorted((n for n in facts.system.candidates if re.fullmatch(r"nvidia-driver-\d+-server", n)), key=_branch_number)
        return offered[-1] if offered else "nvidia-driver-580-server"
    return "nvidia-driver"


def _branch_number(name: str) -> int:
    found = re.search(r"\d+", name)
    return int(found.group()) if found else 0


def _cuda_repository(facts: Facts) -> Change:
    """NVIDIA's CUDA repository through its cuda-keyring package (the signed-by keyring and the source list)."""
    release = f"{facts.os.id}{(facts.os.version_id or '').replace('.', '')}"
    arch = {"amd64": "x86_64", "arm64": "sbsa"}.get(dpkg_arch(facts.arch), "x86_64")
    url = f"https://developer.download.nvidia.com/compute/cuda/repos/{release}/{arch}/cuda-keyring_1.1-1_all.deb"
    return Change(f"add NVIDIA's CUDA repository for {release} (cuda-keyring)",
                  (Shell(download_command(url, CUDA_KEYRING)), Shell(f"dpkg -i {CUDA_KEYRING}")),
                  fix="the host cannot reach NVIDIA's CUDA repository: mirror it where the host can reach it, or use "
                      "gpurig_driver.source: distro")
