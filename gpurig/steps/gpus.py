"""The GPU-side steps that need no package choice: ``gpus`` (what the PCI bus holds), ``nouveau`` (kept off), ``persistence``.

Every GPU step is ``skipped`` with ``NO_GPU`` on a host whose PCI bus shows
no NVIDIA GPU, so a CPU host still gets Docker.
"""

from __future__ import annotations

from gpurig.errors import counted
from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile
from gpurig.steps.apt import install_command
from gpurig.steps.commands import Shell, Upload
from gpurig.steps.plan import Change, Plan, Step

NO_GPU = "no NVIDIA GPU on this host"
BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
BLACKLIST_TEXT = "# Written by gpurig: the NVIDIA driver needs nouveau kept off.\nblacklist nouveau\noptions nouveau modeset=0\n"
REBUILD_INITRAMFS = ("if command -v update-initramfs >/dev/null 2>&1; then update-initramfs -u; "
                     "elif command -v dracut >/dev/null 2>&1; then dracut -f; fi")


class GpusStep(Step):
    """NVIDIA GPUs on the PCI bus, and as many (of the model) as the inventory says, when it says."""

    name = "gpus"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        found = facts.pci_gpus
        expected = wanted.gpus
        if not found:
            if expected.count:
                return Plan.fail(f"the inventory expects {expected.count} NVIDIA GPUs, the PCI bus shows none",
                                 "check the hardware (lspci -nn -d 10de:) or correct gpurig_gpus.count")
            return Plan.skip(NO_GPU)
        if expected.count is not None and expected.count != len(found):
            return Plan.fail(f"the inventory expects {expected.count} NVIDIA GPUs, the PCI bus shows {len(found)}",
                             "check the hardware (a GPU fallen off the bus?) or correct gpurig_gpus.count")
        names = [g.name for g in facts.gpus] or [g.name for g in found]
        if expected.model and not any(_same_model(expected.model, n) for n in names):
            return Plan.fail(f"the inventory expects {expected.model}, the host has {names[0] or 'device ' + found[0].device_id}",
                             "correct gpurig_gpus.model")
        models = sorted(set(n for n in names if n)) or [f"device {found[0].device_id}"]
        return Plan.ok(f"{counted(len(found), 'NVIDIA GPU')}: {', '.join(models)}")


def _same_model(expected: str, name: str) -> bool:
    e, n = expected.lower().removeprefix("nvidia ").strip(), name.lower().removeprefix("nvidia ").strip()
    return e in n or n in e


class NouveauStep(Step):
    """nouveau blacklisted (and the initramfs rebuilt) where NVIDIA GPUs are; a reboot takes it out of a running kernel."""

    name = "nouveau"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        listed = facts.system.nouveau_blacklisted
        if listed:
            if facts.nouveau_loaded:
                return Plan.ok(f"blacklisted in {listed[0]}, still loaded: reboot required (the reboot step, with --reboot)")
            return Plan.ok(f"blacklisted in {listed[0]} and not loaded")
        loaded = "; nouveau is loaded: reboot required" if facts.nouveau_loaded else ""
        return Plan.change(
            f"nouveau is not blacklisted{loaded}",
            Change(f"blacklist nouveau in {BLACKLIST} and rebuild the initramfs",
                   (Upload(BLACKLIST, content=BLACKLIST_TEXT, backup=False), Shell(REBUILD_INITRAMFS))),
        )


class PersistenceStep(Step):
    """nvidia-persistenced enabled and running where a driver is loaded (GPUs stay initialised between jobs)."""

    name = "persistence"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        if not facts.driver_version:
            return Plan.skip("no NVIDIA driver loaded yet")
        system = facts.system
        if not system.systemd:
            if facts.gpus:
                return Plan.change("no systemd to run nvidia-persistenced",
                                   Change("turn persistence mode on (nvidia-smi -pm 1)", (Shell("nvidia-smi -pm 1"),)))
            return Plan.skip("no systemd, and nvidia-smi lists no GPU to set persistence mode on")
        service = system.service("nvidia-persistenced")
        if service.enabled == "enabled" and service.running:
            return Plan.ok("nvidia-persistenced enabled and running")
        changes = []
        if not service.enabled:  # no such unit
            changes.append(Change("install nvidia-persistenced", (Shell(install_command("nvidia-persistenced")),)))
        changes.append(Change("enable and start nvidia-persistenced", (Shell("systemctl enable --now nvidia-persistenced"),)))
        state = "not installed" if not service.enabled else f"{service.enabled}, {service.active or 'inactive'}"
        return Plan.change(f"nvidia-persistenced is {state}", *changes)
