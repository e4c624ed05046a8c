"""Verify records for the traps of a GPU host that works today (issue 19), read from one facts round trip.

Pure: ``trap_records(facts, mig_wanted)`` turns gpurig.facts into records
with a fix each; ``TRAPS`` is the fault catalogue of these traps (what goes
wrong, the words users see, the fix), one entry per record id, so the
records and the documentation say the same fix. Each record fails closed: a
fact that is not known is a ``fail`` saying so, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.errors import counted
from gpurig.facts import Facts
from gpurig.steps.apt import upstream
from gpurig.steps.safeguards import driver_packages, installed_fabric_manager
from gpurig.verify.records import Record


@dataclass(frozen=True)
class Trap:
    """One entry of the fault catalogue: what users see, and the fix a record gives."""

    id: str
    symptom: str
    fix: str


TRAPS: dict[str, Trap] = {t.id: t for t in (
    Trap("host.daemon_reload", "containers lose their GPUs after systemctl daemon-reload ('Failed to initialize NVML: Unknown Error')",
         "gpurig provision -l HOST (gpu-devices step: nvidia-ctk system create-dev-char-symlinks --create-all and its udev rule "
         "/lib/udev/rules.d/71-nvidia-dev-char.rules, or Docker on the cgroupfs driver)"),
    Trap("host.fabric_manager", "on an NVSwitch host CUDA says 'system not yet initialized' and burn-in tools find no GPU",
         "gpurig provision -l HOST (fabric-manager step: nvidia-fabricmanager-BRANCH of the loaded driver's exact version, enabled)"),
    Trap("host.driver_libraries", "'Failed to initialize NVML: Driver/library version mismatch' after a driver upgrade without reboot",
         "reboot the host (gpurig provision --reboot) so the module of the installed libraries loads"),
    Trap("host.driver_hold", "unattended-upgrades replaces the driver's libraries under running jobs (then the mismatch above)",
         "gpurig provision -l HOST (driver-hold step: apt-mark hold and a Package-Blacklist for unattended-upgrades), "
         "or gpurig_driver.auto_upgrade: true to accept it"),
    Trap("host.mig", "MIG on: GPU indexes mean other devices, whole-GPU utilisation metrics vanish",
         "set gpurig_gpus.mig for the host and run gpurig provision (mig step), or nvidia-smi -i N -mig 0 and a GPU reset"),
    Trap("host.gpuN.persistence", "persistence off: every CUDA start re-initialises the GPU, monitoring sees GPUs 'waking up'",
         "sudo nvidia-smi -pm 1, or gpurig provision (persistence step: nvidia-persistenced); checked by checks/verify_host.py"),
)}


def _record(rid: str, status: str, detail: str, measured=None, expected=None) -> Record:
    return Record("host", rid, status, measured, expected, detail=detail, fix=TRAPS[rid].fix if status in ("warn", "fail") else "")


def trap_records(facts: Facts, mig_wanted: bool | None = None) -> list[Record]:
    """One record per trap (persistence is checked per GPU by checks/verify_host.py); all ``skip`` on a host without NVIDIA GPUs."""
    if not facts.pci_gpus and not facts.gpus:
        return trap_records_without_gpu()
    return [daemon_reload(facts), fabric_manager(facts), driver_libraries(facts), driver_hold(facts), mig(facts, mig_wanted)]


def trap_records_without_gpu() -> list[Record]:
    """The traps' records of a host without an NVIDIA GPU: each ``skip``, none of them applies."""
    return [Record("host", rid, "skip", detail="no NVIDIA GPU on this host") for rid in TRAPS if rid != "host.gpuN.persistence"]


def daemon_reload(facts: Facts) -> Record:
    rid = "host.daemon_reload"
    if not facts.docker.installed:
        return Record("host", rid, "skip", detail="Docker is not installed")
    driver = facts.cgroup_driver
    if driver is None:
        return _record(rid, "fail", "Docker's cgroup driver is not known: the trap cannot be ruled out")
    if driver != "systemd":
        return _record(rid, "pass", f"Docker uses the {driver} cgroup driver", driver, "cgroupfs, or systemd with /dev/char links")
    dev = facts.gpuhost.dev_char
    if dev is None:
        return _record(rid, "fail", "Docker uses the systemd cgroup driver and the /dev/char links could not be read")
    if not dev.nodes:
        return _record(rid, "fail", "Docker uses the systemd cgroup driver and no /dev/nvidia* node exists to check its /dev/char link "
                                    "(driver not loaded, or nodes not made yet)", 0, "every node linked")
    if dev.unlinked:
        return _record(rid, "fail", f"Docker uses the systemd cgroup driver and {len(dev.unlinked)} of {len(dev.nodes)} /dev/nvidia* nodes "
                                    f"have no /dev/char link ({', '.join(dev.unlinked[:4])}{'...' if len(dev.unlinked) > 4 else ''}): "
                                    "a systemctl daemon-reload takes the GPUs from running containers",
                       len(dev.nodes) - len(dev.unlinked), len(dev.nodes))
    if not dev.rules:
        return _record(rid, "warn", "every /dev/nvidia* node has its /dev/char link, but no udev rule makes them again after a reboot "
                                    "or driver reload", len(dev.nodes), len(dev.nodes))
    return _record(rid, "pass", f"systemd cgroup driver; all {len(dev.nodes)} /dev/nvidia* nodes linked, {dev.rules[0]} remakes them",
                   len(dev.nodes), len(dev.nodes))


def fabric_manager(facts: Facts) -> Record:
    rid = "host.fabric_manager"
    fabric = facts.gpuhost.fabric
    if fabric is None:
        return _record(rid, "fail", "the PCI bus could not be read for NVSwitches")
    if not fabric.nvswitches:
        return Record("host", rid, "skip", detail="no NVSwitch on the PCI bus: no fabric manager needed")
    module = facts.driver_version
    have = installed_fabric_manager(facts)
    switches = counted(len(fabric.nvswitches), "NVSwitch", "NVSwitches")
    states = sorted(set(fabric.states))
    said = f"; fabric state: {', '.join(states)}" if states else ""
    if have is None:
        return _record(rid, "fail", f"{switches} on the PCI bus and no nvidia-fabricmanager installed{said}", None, module)
    if module and upstream(have[1]) != upstream(module):
        return _record(rid, "fail", f"{have[0]} {have[1]} installed, driver {module} loaded: they must be the same version{said}",
                       have[1], module)
    service = facts.system.service("nvidia-fabricmanager")
    if not service.running:
        return _record(rid, "fail", f"{have[0]} {have[1]} installed but its unit is {service.enabled or 'missing'}, "
                                    f"{service.active or 'inactive'}{said}", have[1], module)
    if states and states != ["Completed"]:
        return _record(rid, "warn", f"{have[0]} runs, but the GPUs' fabric state is {', '.join(states)}", have[1], module)
    return _record(rid, "pass", f"{have[0]} {have[1]} running for {switches}{said}", have[1], module)


def driver_libraries(facts: Facts) -> Record:
    rid = "host.driver_libraries"
    module, library = facts.driver_version, facts.system.nvml_version
    reboot = "; a reboot is pending (/var/run/reboot-required)" if facts.system.reboot_required else ""
    if not module or not library:
        missing = "kernel module" if not module else "user-space library (libnvidia-ml.so.*)"
        return _record(rid, "fail", f"the driver's {missing} version could not be read: a mismatch cannot be ruled out{reboot}",
                       module, library)
    if module != library:
        newer = "newer than" if upstream(library) > upstream(module) else "other than"
        return _record(rid, "fail", f"user-space library {library} is {newer} the loaded kernel module {module}: NVML refuses "
                                    f"('Driver/library version mismatch'){reboot}", module, library)
    if reboot:
        return _record(rid, "warn", f"module and library are both {module}{reboot}: what a reboot changes is not checked", module, library)
    return _record(rid, "pass", f"kernel module and user-space library are both {module}", module, library)


def driver_hold(facts: Facts) -> Record:
    rid = "host.driver_hold"
    packages = driver_packages(facts)
    if not packages:
        return Record("host", rid, "skip", detail="no NVIDIA driver package installed through dpkg")
    held, policy = facts.gpuhost.held, facts.gpuhost.upgrades
    if held is None or policy is None:
        return _record(rid, "fail", "dpkg-query (held packages) or apt-config gave no answer: what apt may upgrade is not known")
    unheld = [p for p in packages if p not in held]
    exposed = [p for p in unheld if not policy.blacklisted(p)]
    if exposed and policy.enabled and "unattended-upgrades" in facts.system.installed:
        return _record(rid, "warn", f"unattended-upgrades is on and may upgrade {', '.join(exposed)} under the loaded module",
                       len(packages) - len(exposed), len(packages))
    if unheld:
        return _record(rid, "warn", f"{', '.join(unheld)} not held: an apt upgrade replaces the libraries under the loaded module",
                       len(packages) - len(unheld), len(packages))
    return _record(rid, "pass", f"{len(packages)} driver packages held", len(packages), len(packages))


def mig(facts: Facts, wanted: bool | None) -> Record:
    rid = "host.mig"
    modes = facts.gpuhost.gpu_modes
    if modes is None:
        return _record(rid, "fail", "MIG mode could not be read (nvidia-smi gave no answer)")
    on = [g.index for g in modes if g.mig]
    pending = [g.index for g in modes if g.mig_pending is not None and g.mig_pending != g.mig]
    later = f"; a change is pending on GPU {', '.join(map(str, pending))} until a GPU reset or reboot" if pending else ""
    if wanted is True:
        off = [g.index for g in modes if g.mig is False]
        if off:
            return _record(rid, "fail", f"gpurig_gpus.mig is true, MIG is off on GPU {', '.join(map(str, off))}{later}", len(on), len(modes))
        return _record(rid, "pass", f"MIG on as asked on {len(on)} GPUs", len(on), len(modes))
    if on:
        devices = [d.uuid for d in facts.gpuhost.mig_devices]
        asked = "gpurig_gpus.mig is false" if wanted is False else "the inventory does not ask for MIG (gpurig_gpus.mig)"
        return _record(rid, "fail" if wanted is False else "warn",
                       f"MIG is on for GPU {', '.join(map(str, on))} and {asked}: a container asking for those GPU indexes gets "
                       f"{counted(len(devices), 'MIG device')} instead, and whole-GPU utilisation is absent{later}",
                       len(on), 0)
    return _record(rid, "pass", f"MIG off on all {len(modes)} GPUs{later}", 0, 0)
