"""The steps against the traps of a GPU host that already works (issue 19), each planned from gpurig/facts/gpuhost.py.

- ``gpu-devices``: containers keep their GPUs across ``systemctl
  daemon-reload`` where Docker uses the systemd cgroup driver: NVIDIA's own
  fix where nvidia-ctk is installed (/dev/char links and the udev rule that
  makes them at each driver load), else Docker on the cgroupfs driver.
- ``driver-hold``: the driver's packages held (apt-mark) and blacklisted for
  unattended-upgrades, unless ``gpurig_driver.auto_upgrade: true``.
- ``fabric-manager``: nvidia-fabricmanager of the loaded driver's exact
  version, enabled, on hosts with NVSwitches; another version is refused.
- ``mig``: MIG mode as ``gpurig_gpus.mig`` asks; unset, never touched.
"""

from __future__ import annotations

import re
import shlex

from gpurig.errors import counted
from gpurig.facts import Facts
from gpurig.facts.gpuhost import DEV_CHAR_RULE, GpuMode
from gpurig.inventory.profile import HostProfile
from gpurig.steps.apt import install_command, upstream
from gpurig.steps.commands import Shell, Upload
from gpurig.steps.daemon import DAEMON_JSON, daemon_json_changes, daemon_json_problem, merge, render
from gpurig.steps.gpus import NO_GPU
from gpurig.steps.plan import Change, Plan, Step

NO_DRIVER = "no NVIDIA driver loaded yet"
RULE_PATH = f"/lib/udev/rules.d/{DEV_CHAR_RULE}"
CREATE_LINKS = "nvidia-ctk system create-dev-char-symlinks --create-all"
# NVIDIA Container Toolkit's documented rule (troubleshooting: "Failed to initialize NVML: Unknown Error").
RULE_TEXT = ("# Written by gpurig: /dev/char links to the NVIDIA device nodes, made again each time the driver binds,\n"
             "# so that containers keep their GPUs across systemctl daemon-reload (systemd cgroup driver).\n"
             f'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="/usr/bin/{CREATE_LINKS}"\n')
CGROUPFS = "native.cgroupdriver=cgroupfs"
TRAP = ("a systemctl daemon-reload takes the GPUs from running containers "
        "('Failed to initialize NVML: Unknown Error' inside them)")


class GpuDevicesStep(Step):
    """GPUs that survive ``systemctl daemon-reload`` in running containers."""

    name = "gpu-devices"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        if not facts.driver_version:
            return Plan.skip(NO_DRIVER)
        if not facts.docker.installed:
            return Plan.skip("Docker is not installed")
        driver = facts.cgroup_driver
        if driver is None:
            return Plan.fail("Docker's cgroup driver is not known (docker info did not say, nor did daemon.json)",
                             "run docker info on the host and run again")
        if driver != "systemd":
            return Plan.ok(f"Docker uses the {driver} cgroup driver: systemctl daemon-reload leaves running containers their GPUs")
        dev = facts.gpuhost.dev_char
        if dev is None:
            return Plan.fail("the /dev/char links to the NVIDIA devices could not be read (the probe gave no answer)", "run again")
        if facts.toolkit_version:
            return _toolkit_fix(facts)
        asked = [o for o in (wanted.daemon.get("exec-opts") or []) if isinstance(o, str) and o.startswith("native.cgroupdriver=")]
        if asked and asked[-1] != CGROUPFS:
            return Plan.fail(f"Docker uses the systemd cgroup driver as gpurig_daemon.exec-opts asks ({asked[-1]}), no nvidia-ctk is "
                             f"installed to make the /dev/char links, so {TRAP}",
                             "install the NVIDIA Container Toolkit (the container-toolkit step) or drop native.cgroupdriver=systemd "
                             "from gpurig_daemon.exec-opts")
        failed = daemon_json_problem(facts)
        if failed:
            return failed
        current = facts.daemon_json.content or {}
        opts = [o for o in (current.get("exec-opts") or []) if not (isinstance(o, str) and o.replace(" ", "").startswith("native.cgroupdriver="))]
        content = render(merge(current, {"exec-opts": [*opts, CGROUPFS]}), facts.daemon_json.text)
        verb = "create" if facts.daemon_json.state == "absent" else "merge into"
        changes = daemon_json_changes(facts, content, f"{verb} {DAEMON_JSON}: exec-opts {CGROUPFS}",
                                      "correct daemon.json by hand as dockerd's reason says, and run again")
        return Plan.change(f"Docker uses the systemd cgroup driver, so {TRAP}; nvidia-ctk is not installed to make the /dev/char "
                           "links, so Docker is set to the cgroupfs driver instead", *changes)


def _toolkit_fix(facts: Facts) -> Plan:
    dev = facts.gpuhost.dev_char
    assert dev is not None
    missing = dev.unlinked
    if dev.nodes and not missing and dev.rules:
        return Plan.ok(f"Docker uses the systemd cgroup driver; all {len(dev.nodes)} /dev/nvidia* nodes have their /dev/char "
                       f"links and {dev.rules[0]} makes them at each driver load")
    changes = []
    if not dev.rules:
        changes.append(Change(f"install NVIDIA's udev rule {RULE_PATH} (makes the links at each driver load)",
                              (Upload(RULE_PATH, content=RULE_TEXT, backup=False),)))
    if missing or not dev.nodes:
        what = f"{len(missing)} /dev/nvidia* nodes" if missing else "the /dev/nvidia* nodes"
        changes.append(Change(f"create the /dev/char links of {what} ({CREATE_LINKS})", (Shell(CREATE_LINKS),)))
    lacking = f"{len(missing)} of {len(dev.nodes)} /dev/nvidia* nodes have no /dev/char link" if missing else "no udev rule remakes the links"
    return Plan.change(f"Docker uses the systemd cgroup driver and {lacking}, so {TRAP}; nvidia-ctk {facts.toolkit_version} is "
                       "installed, so its own fix is used (links and udev rule; Docker keeps its cgroup driver)", *changes)


# The packages of an NVIDIA driver (Debian's, Ubuntu's per-branch ones, NVIDIA's CUDA repository's): held together,
# since an upgrade of any one of them puts new libraries beside the loaded module.
DRIVER_PACKAGE = re.compile(r"nvidia-driver(-\d+(-server|-open|-server-open)?|-libs)?|cuda-drivers(-\d+)?|libnvidia-compute-\d+.*"
                            r"|nvidia-utils-\d+.*|nvidia-kernel-.+|nvidia-dkms-\d+.*|libcuda1|libnvidia-ml1|nvidia-fabricmanager(-\d+)?")
SNIPPET = "/etc/apt/apt.conf.d/51gpurig-nvidia-driver"
BLACKLIST = ("nvidia-", "libnvidia-", "libcuda", "cuda-drivers")
SNIPPET_TEXT = ("// Written by gpurig: unattended-upgrades leaves the NVIDIA driver alone. New user-space libraries under\n"
                "// the loaded kernel module stop NVML (\"Driver/library version mismatch\") until a reboot.\n"
                "// Remove with gpurig_driver.auto_upgrade: true, or upgrade by hand: apt-mark unhold, upgrade, reboot.\n"
                "Unattended-Upgrade::Package-Blacklist {\n" + "".join(f'    "{p}";\n' for p in BLACKLIST) + "};\n")


def driver_packages(facts: Facts) -> list[str]:
    return sorted(p for p in facts.system.installed if DRIVER_PACKAGE.fullmatch(p))


class DriverHoldStep(Step):
    """The driver's packages held and kept out of unattended upgrades, unless ``gpurig_driver.auto_upgrade: true``."""

    name = "driver-hold"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        if wanted.driver.auto_upgrade:
            return Plan.skip("gpurig_driver.auto_upgrade: true: apt may upgrade the driver under the loaded module "
                             "(verify reports the mismatch until a reboot)")
        packages = driver_packages(facts)
        if not packages:
            return Plan.skip("no NVIDIA driver package installed: nothing to hold")
        held, policy = facts.gpuhost.held, facts.gpuhost.upgrades
        if held is None or policy is None:
            return Plan.fail("dpkg-query (held packages) or apt-config gave no answer: what apt may upgrade is not known",
                             "run apt-mark showhold and apt-config dump on the host to see why, and run again")
        unheld = [p for p in packages if p not in held]
        exposed = [p for p in packages if not policy.blacklisted(p)]
        changes = []
        if unheld:
            changes.append(Change(f"hold {', '.join(unheld)} (apt-mark hold)", (Shell(shlex.join(["apt-mark", "hold", *unheld])),)))
        if exposed:
            changes.append(Change(f"keep the driver out of unattended-upgrades ({SNIPPET}: Package-Blacklist {', '.join(BLACKLIST)})",
                                  (Upload(SNIPPET, content=SNIPPET_TEXT, backup=False),)))
        if not changes:
            return Plan.ok(f"{', '.join(packages)} held and blacklisted for unattended-upgrades")
        why = [f"{len(unheld)} of {len(packages)} driver packages not held" if unheld else "",
               "unattended-upgrades " + ("is on and " if policy.enabled else "") + "does not leave them alone" if exposed else ""]
        return Plan.change("; ".join(w for w in why if w) + ": an upgrade would replace the libraries under the loaded module "
                           "(NVML: Driver/library version mismatch until a reboot)", *changes)


FABRIC_PACKAGE = re.compile(r"nvidia-fabricmanager(-\d+)?")


def installed_fabric_manager(facts: Facts) -> tuple[str, str] | None:
    """(package, version) of the installed nvidia-fabricmanager, whatever its branch suffix; None where none is."""
    return next(((p, v) for p, v in sorted(facts.system.installed.items()) if FABRIC_PACKAGE.fullmatch(p)), None)


class FabricManagerStep(Step):
    """nvidia-fabricmanager of the loaded driver's own version, enabled and running, where NVSwitches are."""

    name = "fabric-manager"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        fabric = facts.gpuhost.fabric
        if fabric is None:
            return Plan.fail("the PCI bus could not be read for NVSwitches (the probe gave no answer)", "run again")
        if not fabric.nvswitches:
            return Plan.skip("no NVSwitch on the PCI bus: no fabric manager needed")
        module = facts.driver_version
        if not module:
            return Plan.skip(f"{NO_DRIVER}: the fabric manager must match its version")
        branch = module.split(".")[0]
        have = installed_fabric_manager(facts)
        if have and upstream(have[1]) != upstream(module):
            return Plan.fail(f"{have[0]} {have[1]} is installed, the loaded driver is {module}: the fabric manager must be the driver's "
                             "own version (else CUDA says 'system not yet initialized')",
                             f"install nvidia-fabricmanager-{branch}={module}-* (or the driver of {have[1]}), then reboot")
        package = f"nvidia-fabricmanager-{branch}"
        changes = []
        if not have:
            changes.append(Change(f"install {package} {module} (the loaded driver's version)",
                                  (Shell(install_command(f"{package}={module}-*")),),
                                  fix=f"apt has no {package} {module}: enable the repository the driver came from (Ubuntu: restricted "
                                      "and multiverse; NVIDIA's CUDA repository), or upgrade driver and fabric manager together"))
        service = facts.system.service("nvidia-fabricmanager")
        if not have or service.enabled != "enabled" or not service.running:
            changes.append(Change("enable and start nvidia-fabricmanager", (Shell("systemctl enable --now nvidia-fabricmanager"),)))
        switches = counted(len(fabric.nvswitches), "NVSwitch", "NVSwitches")
        if not changes:
            return Plan.ok(f"{have[0] if have else package} {module} enabled and running for {switches}")
        state = "not installed" if not have else f"{service.enabled or 'no unit'}, {service.active or 'inactive'}"
        return Plan.change(f"{switches} on the PCI bus and the fabric manager is {state}: without it CUDA says "
                           "'system not yet initialized'", *changes)


class MigStep(Step):
    """MIG mode as ``gpurig_gpus.mig`` asks, on every GPU that has it; unset, MIG is left as it is."""

    name = "mig"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        if not facts.pci_gpus:
            return Plan.skip(NO_GPU)
        want = wanted.gpus.mig
        modes = facts.gpuhost.gpu_modes
        on = facts.gpuhost.mig_on()
        if want is None:
            now = f"on for GPU {', '.join(map(str, on))}" if on else "off" if modes else "not known"
            return Plan.skip(f"gpurig_gpus.mig is not set: MIG mode left as it is ({now})")
        if not facts.driver_version:
            return Plan.skip(NO_DRIVER)
        if modes is None:
            return Plan.fail("MIG mode could not be read (nvidia-smi gave no answer)", "run nvidia-smi on the host, then again")
        capable = [g for g in modes if g.mig is not None]
        if not capable:
            if want:
                return Plan.fail("gpurig_gpus.mig is true, but no GPU of this host has MIG mode (A100, A30, H100 and newer do)",
                                 "set gpurig_gpus.mig: false or leave it out")
            return Plan.ok("no GPU of this host has MIG mode")
        word = "on" if want else "off"
        to_set = [g for g in capable if g.mig_pending is not want]
        pending = [g.index for g in capable if g.mig_pending is want and g.mig is not want]
        after = "takes effect after a GPU reset (nvidia-smi -r -i N, with no process on it) or a reboot"
        if not to_set:
            if pending:
                return Plan.ok(f"MIG {word} pending on GPU {', '.join(map(str, pending))}: {after}")
            return Plan.ok(f"MIG {word} on all {len(capable)} GPUs that have it")
        changes = [Change(f"turn MIG {word} on GPU {g.index} ({after})", (Shell(_mig_command(g, want)),)) for g in to_set]
        return Plan.change(f"gpurig_gpus.mig is {str(want).lower()}: MIG is {'off' if want else 'on'} on GPU "
                           f"{', '.join(str(g.index) for g in to_set)}; {after}", *changes)


def _mig_command(gpu: GpuMode, want: bool) -> str:
    i = str(gpu.index)
    if want:
        return shlex.join(["nvidia-smi", "-i", i, "-mig", "1"])
    # Off: its compute and GPU instances go first (none may be in use), then the mode.
    return (f"nvidia-smi mig -i {i} -dci >/dev/null 2>&1; nvidia-smi mig -i {i} -dgi >/dev/null 2>&1; "
            + shlex.join(["nvidia-smi", "-i", i, "-mig", "0"]))
