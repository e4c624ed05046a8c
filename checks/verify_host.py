#!/usr/bin/env python3
"""Is this GPU host ready? Driver, GPUs, ECC, throttling, PCIe, temperature, Xid: one record per check.

Standalone on purpose (stdlib, plus nvidia-ml-py's ``pynvml`` when present): it
is piped to hosts and run as ``python3 verify_host.py --json``; it imports
nothing of gpurig. Data comes from NVML when pynvml imports and finds the
library, else from ``nvidia-smi -q -x``; two small adapters turn either into
one dict per GPU and one rules layer turns those into records
    {"id", "status": pass|warn|fail|skip, "measured", "expected", "unit", "detail", "fix"}.
The verdict is in the records: the exit status is 0 unless the probe itself crashes.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

NOT_AVAILABLE = {"", "n/a", "[n/a]", "[not supported]", "not supported", "unknown error", "[unknown error]",
                 "requested functionality has been deprecated"}
TEMP_WARN_C = 85
MISMATCH_FIX = ("reboot, or reload the nvidia kernel modules (stop what uses the GPUs, then "
                "`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`)")
NO_DRIVER_FIX = ("install the NVIDIA driver (`invoke provision` with gpurig_driver.install: true); "
                 "if it is installed, load it: `sudo modprobe nvidia` (Secure Boot may block an unsigned module)")
# What provision does on a host with no NVIDIA GPU on its PCI bus: its driver step skips it (there is nothing to drive).
NO_GPU_FIX = ("nothing to install: gpurig provision skips the driver on a host without an NVIDIA GPU; verify GPU hosts "
              "only (-l PATTERN), or if this one should have a GPU, check it is seated and passed through (`lspci -d 10de:`)")
RESET_FIX = "drain the GPU and reset it (`nvidia-smi -r -i {i}`) or reboot"

# Clock throttle ("event") reasons: (name, NVML bit, status when active, what it means, fix).
HW_FIX = "check cooling (airflow, fans, inlet temperature) and the power supplies"
THROTTLE = (
    ("gpu_idle", 0x1, "pass", "idle", None),
    ("applications_clocks_setting", 0x2, "pass", "application clocks set", None),
    ("sw_power_cap", 0x4, "pass", "at its power limit (normal under full load)", None),
    ("hw_slowdown", 0x8, "fail", "HW slowdown (clocks cut by half or more)", HW_FIX),
    ("sync_boost", 0x10, "pass", "sync boost", None),
    ("sw_thermal_slowdown", 0x20, "warn", "SW thermal slowdown", "check cooling: airflow, fans, inlet temperature"),
    ("hw_thermal_slowdown", 0x40, "fail", "HW thermal slowdown", "check cooling: airflow, fans, inlet temperature"),
    ("hw_power_brake_slowdown", 0x80, "fail", "HW power brake", "check the power supplies and the BMC event log"),
    ("display_clocks_setting", 0x100, "pass", "display clock setting", None),
)

# Xid -> (meaning, status, fix); the catalogue is NVIDIA's "Xid Errors" document.
APP_FIX = "usually the application's fault: check its CUDA errors; the entry stays in the log until reboot"
ECC_FIX = "drain the GPU and reset it or reboot; if it repeats, RMA the GPU"
XID = {
    13: ("graphics engine exception", "warn", APP_FIX),
    31: ("GPU memory page fault", "warn", APP_FIX),
    43: ("GPU stopped processing", "warn", APP_FIX),
    45: ("preemptive cleanup after earlier errors", "warn", APP_FIX),
    48: ("double-bit ECC error", "fail", ECC_FIX),
    63: ("ECC page retirement / row remap recorded", "fail", ECC_FIX),
    64: ("ECC page retirement / row remap failed", "fail", "drain the GPU and RMA it"),
    74: ("NVLink error", "fail", "check NVLink (`nvidia-smi nvlink -s`), reset the GPU; if it repeats, RMA"),
    79: ("GPU has fallen off the bus", "fail", "reboot; reseat the GPU and check its power and PCIe slot; if it repeats, RMA"),
    92: ("high single-bit ECC error rate", "fail", ECC_FIX),
    94: ("contained ECC error", "fail", ECC_FIX),
    95: ("uncontained ECC error", "fail", ECC_FIX),
    119: ("GSP RPC timeout", "fail", "reboot; update the driver (GSP firmware issue)"),
    120: ("GSP error", "fail", "reboot; update the driver (GSP firmware issue)"),
}
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")


def record(rid, status, measured=None, expected=None, unit=None, detail="", fix=None):
    return {"id": rid, "status": status, "measured": measured, "expected": expected, "unit": unit,
            "detail": detail, "fix": fix}


class Snapshot:
    """What the probe learnt: the kernel module's version, the data source, and one dict per GPU."""

    def __init__(self, module=None, source=None, driver=None, gpus=None, problem=None, kind=None, notes=""):
        self.module, self.source, self.driver = module, source, driver
        self.gpus = gpus if gpus is not None else []
        self.problem, self.kind, self.notes = problem, kind, notes  # kind: no_driver | mismatch | no_tool | error


# ---------------------------------------------------------------- adapter: nvidia-smi -q -x

def _text(el, path):
    node = el.find(path) if el is not None else None
    if node is None or node.text is None:
        return None
    value = node.text.strip()
    return None if value.lower() in NOT_AVAILABLE else value


def _int(el, path):
    value = _text(el, path)
    match = re.match(r"-?\d+", value or "")
    return int(match.group()) if match else None


def _flag(el, path):
    value = (_text(el, path) or "").lower()
    return {"yes": True, "enabled": True, "active": True, "no": False, "disabled": False, "not active": False}.get(value)


def _uncorrected(volatile):
    if volatile is None:
        return None
    counts = [_int(volatile, child.tag) for child in volatile if "uncorrectable" in child.tag]
    if not counts:  # the schema before v12: volatile/double_bit/total
        counts = [_int(volatile, "double_bit/total")]
    counts = [c for c in counts if c is not None]
    return sum(counts) if counts else None


def _throttle_xml(gpu):
    parent = gpu.find("clocks_event_reasons")  # schema v12 and newer; "throttle" before
    parent = gpu.find("clocks_throttle_reasons") if parent is None else parent
    if parent is None or len(parent) == 0:  # absent, or <clocks_throttle_reasons>N/A</...>
        return None
    return {re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag) for child in parent if _flag(parent, child.tag)}


def gpu_from_xml(index, gpu):
    link = gpu.find("pci/pci_gpu_link_info")
    retired = gpu.find("retired_pages")
    rows = gpu.find("remapped_rows")
    processes = []
    for proc in gpu.findall("processes/process_info"):
        if "C" in (_text(proc, "type") or ""):
            processes.append({"pid": _int(proc, "pid"), "name": _text(proc, "process_name") or "?",
                              "used_mib": _int(proc, "used_memory")})
    return {
        "index": index, "name": _text(gpu, "product_name") or "?", "uuid": _text(gpu, "uuid"),
        "bus_id": gpu.get("id"), "pstate": _text(gpu, "performance_state"),
        "persistence": _flag(gpu, "persistence_mode"),
        "ecc_enabled": _flag(gpu, "ecc_mode/current_ecc"),
        "ecc_uncorrected": _uncorrected(gpu.find("ecc_errors/volatile")),
        "retired_sbe": _int(retired, "multiple_single_bit_retirement/retired_count"),
        "retired_dbe": _int(retired, "double_bit_retirement/retired_count"),
        "retired_pending": _flag(retired, "pending_retirement") if _flag(retired, "pending_retirement") is not None
        else _flag(retired, "pending_blacklist"),  # the older name
        "remap_unc": _int(rows, "remapped_row_unc"),
        "remap_pending": _flag(rows, "remapped_row_pending"),
        "remap_failure": _flag(rows, "remapped_row_failure"),
        "throttle": _throttle_xml(gpu),
        "pcie_gen": _int(link, "pcie_gen/current_link_gen"), "pcie_gen_max": _int(link, "pcie_gen/max_link_gen"),
        "pcie_width": _int(link, "link_widths/current_link_width"),
        "pcie_width_max": _int(link, "link_widths/max_link_width"),
        "temp": _int(gpu, "temperature/gpu_temp"), "temp_slowdown": _int(gpu, "temperature/gpu_temp_slow_threshold"),
        "processes": processes,
    }


def from_smi(text, module, notes=""):
    """nvidia-smi's output (XML, or its failure message) -> Snapshot."""
    if not text.lstrip().startswith("<"):
        message = " ".join(text.split()) or "nvidia-smi printed nothing"
        if "version mismatch" in message.lower():
            return Snapshot(module, "nvidia-smi", problem=message, kind="mismatch")
        kind = "no_driver" if "couldn't communicate with the nvidia driver" in message.lower() else "error"
        return Snapshot(module, "nvidia-smi", problem=message, kind=kind)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        return Snapshot(module, "nvidia-smi", problem=f"nvidia-smi -q -x printed XML that does not parse: {err}",
                        kind="error")
    gpus = [gpu_from_xml(i, gpu) for i, gpu in enumerate(root.findall("gpu"))]
    return Snapshot(module, "nvidia-smi", _text(root, "driver_version"), gpus, notes=notes)


# ---------------------------------------------------------------- adapter: NVML (nvidia-ml-py)

def _s(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def gpu_from_nvml(nv, index):
    handle = nv.nvmlDeviceGetHandleByIndex(index)

    def ask(fn, *args):
        try:
            return getattr(nv, fn)(handle, *args)
        except (nv.NVMLError, AttributeError):  # NotSupported, NoPermission, or a binding without the call
            return None

    ecc = ask("nvmlDeviceGetEccMode")
    retired = [ask("nvmlDeviceGetRetiredPages", cause) for cause in (0, 1)]  # multiple single-bit, double-bit
    pending = ask("nvmlDeviceGetRetiredPagesPendingStatus")
    rows = ask("nvmlDeviceGetRemappedRows")  # (corrected, uncorrected, pending, failure)
    mask = ask("nvmlDeviceGetCurrentClocksEventReasons")
    if mask is None:
        mask = ask("nvmlDeviceGetCurrentClocksThrottleReasons")
    persistence, pstate = ask("nvmlDeviceGetPersistenceMode"), ask("nvmlDeviceGetPerformanceState")
    processes = []
    for proc in ask("nvmlDeviceGetComputeRunningProcesses") or []:
        try:
            name = _s(nv.nvmlSystemGetProcessName(proc.pid)) or "?"
        except nv.NVMLError:
            name = "?"
        used = getattr(proc, "usedGpuMemory", None)
        processes.append({"pid": proc.pid, "name": name, "used_mib": used // (1 << 20) if used is not None else None})
    return {
        "index": index, "name": _s(ask("nvmlDeviceGetName")) or "?", "uuid": _s(ask("nvmlDeviceGetUUID")),
        "bus_id": _s(getattr(ask("nvmlDeviceGetPciInfo"), "busId", None)),
        "pstate": f"P{pstate}" if pstate is not None and pstate < 32 else None,
        "persistence": None if persistence is None else persistence == 1,
        "ecc_enabled": None if ecc is None else ecc[0] == 1,
        "ecc_uncorrected": ask("nvmlDeviceGetTotalEccErrors", 1, 0),  # uncorrected, volatile
        "retired_sbe": None if retired[0] is None else len(retired[0]),
        "retired_dbe": None if retired[1] is None else len(retired[1]),
        "retired_pending": None if pending is None else pending == 1,
        "remap_unc": None if rows is None else rows[1],
        "remap_pending": None if rows is None else bool(rows[2]),
        "remap_failure": None if rows is None else bool(rows[3]),
        "throttle": None if mask is None else {name for name, bit, *_ in THROTTLE if mask & bit},
        "pcie_gen": ask("nvmlDeviceGetCurrPcieLinkGeneration"), "pcie_gen_max": ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width": ask("nvmlDeviceGetCurrPcieLinkWidth"), "pcie_width_max": ask("nvmlDeviceGetMaxPcieLinkWidth"),
        "temp": ask("nvmlDeviceGetTemperature", 0),  # NVML_TEMPERATURE_GPU
        "temp_slowdown": ask("nvmlDeviceGetTemperatureThreshold", 1),  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        "processes": processes,
    }


def from_nvml(nv, module):
    """NVML -> Snapshot; None when the NVML library itself is missing (the caller falls back to nvidia-smi)."""
    try:
        nv.nvmlInit()
    except nv.NVMLError as err:
        code = getattr(err, "value", None)
        if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            return None
        if code == getattr(nv, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18):
            return Snapshot(module, "NVML", problem=f"NVML_ERROR_LIB_RM_VERSION_MISMATCH: {err}", kind="mismatch")
        kind = "no_driver" if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9) else "error"
        return Snapshot(module, "NVML", problem=f"NVML init failed: {err}", kind=kind)
    gpus, lost = [], []
    try:
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                gpus.append(gpu_from_nvml(nv, index))
            except nv.NVMLError as err:  # e.g. GPU is lost: nvidia-smi prints "Unable to determine the device handle"
                lost.append(f"GPU {index}: {err}")
        return Snapshot(module, "NVML", _s(nv.nvmlSystemGetDriverVersion()), gpus, notes="; ".join(lost))
    except nv.NVMLError as err:
        return Snapshot(module, "NVML", problem=f"NVML failed: {err}", kind="error")
    finally:
        nv.nvmlShutdown()


# ---------------------------------------------------------------- gathering

def kernel_module(path):
    """The loaded kernel module's version from /proc/driver/nvidia/version, or None when no driver is loaded."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else "unknown version"


def run(argv, timeout=20):
    """(stdout, stderr) of a command, or None when it is not installed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired:
        return "", f"{argv[0]} did not answer in {timeout} s"
    return done.stdout, done.stderr


def gather(args):
    module = kernel_module(args.proc_version)
    if args.smi_xml:
        with open(args.smi_xml, errors="replace") as fh:
            return from_smi(fh.read(), module)
    if args.source in ("auto", "nvml"):
        try:
            import pynvml
        except ImportError:
            pynvml = None
        snap = from_nvml(pynvml, module) if pynvml else None
        if snap is not None or args.source == "nvml":
            return snap or Snapshot(module, "NVML", kind="no_tool",
                                    problem="NVML is not usable here (nvidia-ml-py not importable, or no libnvidia-ml)")
    out = run(["nvidia-smi", "-q", "-x"])
    if out is None:
        return Snapshot(module, None, kind="no_driver" if module is None else "no_tool",
                        problem="neither NVML (nvidia-ml-py) nor nvidia-smi is available")
    stdout, stderr = out
    notes = " ".join(line.strip() for line in stderr.splitlines() if "Unable to determine" in line)
    return from_smi(stdout if stdout.strip() else stderr, module, notes)


def kernel_log(args):
    """(text, None) of the kernel log, or (None, why it could not be read)."""
    if args.dmesg:
        with open(args.dmesg, errors="replace") as fh:
            text = fh.read()
        if "Operation not permitted" in text and "NVRM" not in text:
            return None, text.strip()
        return text, None
    out = run(["dmesg"], timeout=10)
    if out and out[0].strip():
        return out[0], None
    why = (out[1].strip() if out else "dmesg not installed") or "dmesg printed nothing"
    journal = run(["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short"], timeout=10)
    if journal and journal[0].strip() and "insufficient permissions" not in journal[1]:
        return journal[0], None
    return None, why


# ---------------------------------------------------------------- rules

def nvidia_gpus_on_pci(devices):
    """How many NVIDIA GPUs (vendor 0x10de; VGA or 3D controller, as gpurig's facts count them) sysfs lists; None: unreadable."""
    try:
        names = os.listdir(devices)
    except OSError:
        return None
    found = 0
    for name in names:
        try:
            with open(os.path.join(devices, name, "vendor")) as v, open(os.path.join(devices, name, "class")) as c:
                found += v.read().strip() == "0x10de" and c.read().strip()[2:6] in ("0300", "0302")
        except OSError:
            continue
    return found


def driver_record(snap, on_pci=None):
    """host.driver; ``on_pci`` (NVIDIA GPUs on the PCI bus, None: unknown) tells a host without a GPU from one without a driver."""
    if snap.kind == "mismatch":
        library = re.search(r"NVML library version: (\S+)", snap.problem)
        return record("host.driver", "fail", snap.module, "module and library of one version", None,
                      f"Driver/library version mismatch: kernel module {snap.module or '(version unknown)'}, userspace "
                      f"library {library.group(1) if library else 'of another version'} ({snap.problem})", MISMATCH_FIX)
    if snap.kind == "no_driver" or (snap.module is None and not snap.gpus and snap.problem):
        if on_pci == 0 and snap.module is None:
            return record("host.driver", "fail", None, "loaded", None,
                          f"no NVIDIA GPU on this host: none on its PCI bus, so no driver to load ({snap.problem})", NO_GPU_FIX)
        where = "/proc/driver/nvidia/version is absent" if snap.module is None else f"kernel module {snap.module}"
        return record("host.driver", "fail", snap.module, "loaded", None,
                      f"no NVIDIA driver loaded: {where} ({snap.problem})", NO_DRIVER_FIX)
    if snap.kind == "no_tool":
        return record("host.driver", "fail", snap.module, "loaded and queryable", None,
                      f"kernel module {snap.module} is loaded but {snap.problem}", "install the driver's utilities "
                      "(nvidia-utils-<branch>, which has nvidia-smi) or `pip install nvidia-ml-py`")
    if snap.problem:
        return record("host.driver", "fail", snap.module, "loaded", None, f"{snap.source}: {snap.problem}",
                      "check `nvidia-smi` and `dmesg | grep NVRM` on the host")
    module = f"kernel module {snap.module}" if snap.module else "kernel module version not readable"
    return record("host.driver", "pass", snap.driver, None, None, f"{module}; read through {snap.source}")


def user():
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry, as in some containers
        return f"uid {os.getuid()}"


def why_skipped(snap):
    return {"mismatch": "driver/library version mismatch", "no_tool": "no NVML or nvidia-smi to query the GPUs"}.get(
        snap.kind, "driver not loaded" if snap.kind == "no_driver" or snap.module is None else "the driver did not answer")


def same_model(expected, name):
    """Every word of the expectation is a word of the GPU's name ("A100" fits "NVIDIA A100-SXM4-80GB"; not "NVIDIA A10")."""
    def words(text):
        return set(w for w in re.split(r"[\s_-]+", re.sub(r"^nvidia ", "", text.lower().strip())) if w)
    e = words(expected)
    return bool(e) and e <= words(name)


def fleet_records(snap, args):
    count, names = len(snap.gpus), sorted({g["name"] for g in snap.gpus})
    uuids = "UUIDs: " + ", ".join(g["uuid"] or "?" for g in snap.gpus) if snap.gpus else ""
    notes = "; ".join(x for x in (snap.notes, uuids) if x)
    if args.expect_gpus is None or count == args.expect_gpus:
        unset = "" if args.expect_gpus is not None else "no expectation given (gpurig_gpus.count); "
        out = [record("host.gpu_count", "pass", count, args.expect_gpus, None, unset + notes)]
    else:
        out = [record("host.gpu_count", "fail", count, args.expect_gpus, None,
                      f"the driver sees {count} GPU(s), the inventory expects {args.expect_gpus}; {notes}",
                      "check the hardware (`nvidia-smi -L`, `lspci -d 10de:`; a GPU fallen off the bus logs Xid 79) "
                      "or correct gpurig_gpus.count")]
    if not args.expect_model:
        return out + [record("host.gpu_model", "pass", names, None, None, "no expectation given (gpurig_gpus.model)")]
    wrong = [f"GPU {g['index']} is {g['name']}" for g in snap.gpus if not same_model(args.expect_model, g["name"])]
    if wrong or not names:
        return out + [record("host.gpu_model", "fail", names, args.expect_model, None,
                             f"{'; '.join(wrong) or 'no GPU'}: the inventory expects {args.expect_model}",
                             "correct gpurig_gpus.model, or check this is the host you meant")]
    return out + [record("host.gpu_model", "pass", names, args.expect_model)]


# Each per-GPU rule: (gpu dict, "GPU i (name)") -> (status, measured, expected, unit, detail, fix).

def persistence(g, name):
    if g["persistence"] is None:
        return "skip", None, "on", None, f"{name}: persistence mode not supported here", None
    if g["persistence"]:
        return "pass", "on", "on", None, "", None
    return ("warn", "off", "on", None, f"{name}: persistence mode is off: every CUDA start re-initialises the GPU "
            "(seconds) and settings are lost when it idles", "`sudo nvidia-smi -pm 1`, or `invoke provision` "
            "(enables nvidia-persistenced)")


def ecc_uncorrected(g, name):
    errors = g["ecc_uncorrected"]
    if g["ecc_enabled"] is False or errors is None:
        why = "ECC is disabled on this GPU" if g["ecc_enabled"] is False else "ECC counters not supported here"
        return "skip", None, 0, "errors", f"{name}: {why}", None
    if errors:
        return ("fail", errors, 0, "errors", f"{name}: {errors} volatile uncorrected ECC error(s) since the driver "
                "loaded", RESET_FIX.format(i=g["index"]) + "; if errors come back, RMA the GPU")
    return "pass", 0, 0, "errors", "", None


def retired_pages(g, name):
    sbe, dbe, pending = g["retired_sbe"], g["retired_dbe"], g["retired_pending"]
    if sbe is None and dbe is None and pending is None:
        return ("skip", None, None, "pages", f"{name}: page retirement not reported "
                "(Ampere and newer remap rows instead)", None)
    total = (sbe or 0) + (dbe or 0)
    detail = f"{name}: {total} page(s) retired ({sbe or 0} multiple single-bit, {dbe or 0} double-bit)"
    if pending:
        return ("fail", total, "none pending", "pages", detail + "; a retirement is pending until the GPU is reset",
                RESET_FIX.format(i=g["index"]))
    if total >= 60:
        return "fail", total, "< 60", "pages", detail + ": NVIDIA's replacement threshold", "drain the GPU and RMA it"
    return "pass", total, "none pending", "pages", detail, None


def remapped_rows(g, name):
    if g["remap_pending"] is None and g["remap_failure"] is None:
        return ("skip", None, None, "rows", f"{name}: row remapping not reported "
                "(older than Ampere, MIG mode, or a vGPU)", None)
    if g["remap_failure"]:
        return ("fail", g["remap_unc"], "no failure", "rows", f"{name}: row remapping failed: the memory cannot be "
                "repaired", "drain the GPU and RMA it")
    if g["remap_pending"]:
        return ("fail", g["remap_unc"], "none pending", "rows", f"{name}: a row remap is pending until the GPU is "
                "reset", RESET_FIX.format(i=g["index"]))
    return "pass", g["remap_unc"], "none pending", "rows", f"{name}: {g['remap_unc'] or 0} row(s) remapped", None


def throttle(g, name):
    if g["throttle"] is None:
        return "skip", None, None, None, f"{name}: clock throttle reasons not supported here", None
    hits = [(status, meaning, fix) for reason, _, status, meaning, fix in THROTTLE if reason in g["throttle"]]
    worst = "fail" if any(h[0] == "fail" for h in hits) else "warn" if any(h[0] == "warn" for h in hits) else "pass"
    fixes = "; ".join(dict.fromkeys(h[2] for h in hits if h[0] == worst and h[2])) or None
    return (worst, sorted(g["throttle"]), [], None, f"{name}: " + ("; ".join(h[1] for h in hits) or "not throttled"),
            fixes)


def pcie(g, name):
    gen, gmax, width, wmax = g["pcie_gen"], g["pcie_gen_max"], g["pcie_width"], g["pcie_width_max"]
    if None in (gen, gmax, width, wmax):
        return "skip", None, None, None, f"{name}: PCIe link not reported (a vGPU or a virtual link)", None
    measured, expected = f"gen{gen} x{width}", f"gen{gmax} x{wmax}"
    if gen >= gmax and width >= wmax:
        return "pass", measured, expected, None, f"{name}: link at its maximum", None
    if "gpu_idle" in (g["throttle"] or ()) or (g["pstate"] or "P0") not in ("P0", "P1", "P2"):
        return ("pass", measured, expected, None, f"{name}: below its maximum while idle ({g['pstate']}): idle "
                "GPUs downshift the link, so judge it under load", None)
    state = g["pstate"] or "P-state unknown"
    return ("warn", measured, expected, None, f"{name}: below its maximum while not idle ({state}); idle GPUs "
            "downshift, so recheck under load: a lasting shortfall is a slot, riser or BIOS limit",
            "check the slot and riser (`lspci -vv`: LnkSta vs LnkCap) and the BIOS PCIe settings")


def temperature(g, name):
    temp, slow = g["temp"], g["temp_slowdown"]
    if temp is None:
        return "skip", None, None, "C", f"{name}: temperature not reported", None
    limit = min(TEMP_WARN_C, slow - 5) if slow else TEMP_WARN_C
    where = f"slowdown at {slow} C" if slow else "slowdown threshold not reported"
    fix = "check cooling: airflow, fans, inlet temperature"
    if slow and temp >= slow:
        return "fail", temp, f"< {limit}", "C", f"{name}: at its slowdown threshold ({where})", fix
    if temp >= limit:
        return "warn", temp, f"< {limit}", "C", f"{name}: running hot ({where})", fix
    return "pass", temp, f"< {limit}", "C", f"{name}: {where}", None


def processes(g, name):
    procs = g["processes"]
    if not procs:
        return "pass", [], [], None, f"{name}: no compute processes", None
    listed = ", ".join(f"pid {q['pid']} {q['name']} ({'?' if q['used_mib'] is None else q['used_mib']} MiB)"
                       for q in procs[:5]) + (f" and {len(procs) - 5} more" if len(procs) > 5 else "")
    return ("warn", procs, [], None, f"{name}: {len(procs)} compute process(es) already on this GPU: {listed}",
            "stop them, or expect to share its memory and speed (`nvidia-smi` lists them)")


GPU_RULES = (persistence, ecc_uncorrected, retired_pages, remapped_rows, throttle, pcie, temperature, processes)


def _slot(bus):
    return ":".join(bus.lower().split(":")[-2:]).split(".")[0]  # "00000000:3B:00.0" and "0000:3b:00" -> "3b:00"


def xid_record(args, snap):
    if snap.module is None and not snap.gpus:
        return record("host.xid", "skip", None, None, None, f"skipped: {why_skipped(snap)}")
    text, why = kernel_log(args)
    if text is None:
        return record("host.xid", "skip", None, None, None, f"kernel log not readable as "
                      f"{user()} ({why}): Xid errors are visible to root only",
                      "run the host probe as root (`sudo python3 verify_host.py`), or set kernel.dmesg_restrict=0")
    index = {_slot(g["bus_id"]): g["index"] for g in snap.gpus if g["bus_id"]}
    seen = {}
    for bus, xid in XID_LINE.findall(text):
        where = f"GPU {index[_slot(bus)]} ({bus.lower()})" if _slot(bus) in index else bus.lower()
        seen.setdefault(int(xid), set()).add(where)
    if not seen:
        return record("host.xid", "pass", {}, {}, None, "no Xid errors in the kernel log since boot")
    found = [(xid, *XID.get(xid, ("see NVIDIA's Xid catalogue", "fail", "look it up in NVIDIA's Xid catalogue")))
             for xid in sorted(seen)]
    worst = "fail" if any(f[2] == "fail" for f in found) else "warn"
    return record("host.xid", worst, {str(x): sorted(b) for x, b in seen.items()}, {}, None, "kernel log since boot: "
                  + "; ".join(f"Xid {x} ({meaning}) on {', '.join(sorted(seen[x]))}" for x, meaning, _, _ in found),
                  "; ".join(dict.fromkeys(fix for _, _, status, fix in found if status == worst)))


def probe(args, on_pci):
    snap = gather(args)
    records = [driver_record(snap, on_pci)]
    if records[0]["status"] == "fail":
        why = f"skipped: {why_skipped(snap)}"
        records += [record("host.gpu_count", "skip", None, args.expect_gpus, "GPUs", why),
                    record("host.gpu_model", "skip", None, args.expect_model, None, why)]
    else:
        records += fleet_records(snap, args)
        for g in snap.gpus:
            records += [record(f"host.gpu{g['index']}.{rule.__name__}", *rule(g, f"GPU {g['index']} ({g['name']})"))
                        for rule in GPU_RULES]
    records.append(xid_record(args, snap))
    return records


# ---------------------------------------------------------------- output

def _cell(value, width):
    text = "-" if value is None or value == [] else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "~"


def text_table(records):
    lines = [f"{'STATUS':6} {'CHECK':28} {'MEASURED':16} {'EXPECTED':14} DETAIL"]
    for r in records:
        measured = _cell(r["measured"], 16) + (f" {r['unit']}" if r["unit"] and r["measured"] is not None else "")
        lines.append(f"{r['status'].upper():6} {r['id']:28} {_cell(measured, 16):16} {_cell(r['expected'], 14):14} {r['detail']}")
        if r["fix"]:
            lines.append(f"{'':6} fix: {r['fix']}")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="verify_host.py",
        description="Check an NVIDIA GPU host from driver to Xid log; prints one record per check. "
                    "The verdict is in the records; the exit status is 0 unless the probe crashes.",
        epilog="record ids: host.driver, host.gpu_count, host.gpu_model, host.gpuN.{persistence, ecc_uncorrected, "
               "retired_pages, remapped_rows, throttle, pcie, temperature, processes}, host.xid")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help='print {"probe": "host", "version": 1, "records": [...], "nvidia_gpus_on_pci": N} (default)')
    out.add_argument("--text", action="store_true", help="print an aligned table for people")
    parser.add_argument("--expect-gpus", type=int, metavar="N", help="GPUs the inventory expects (gpurig_gpus.count)")
    parser.add_argument("--expect-model", metavar="SUBSTRING", help="GPU model the inventory expects (gpurig_gpus.model)")
    parser.add_argument("--source", choices=("auto", "nvml", "smi"), default="auto",
                        help="NVML through nvidia-ml-py, nvidia-smi -q -x, or NVML falling back to nvidia-smi (default)")
    parser.add_argument("--smi-xml", metavar="FILE", help="replay: what `nvidia-smi -q -x` printed (XML or its error)")
    parser.add_argument("--proc-version", metavar="FILE", default="/proc/driver/nvidia/version",
                        help="replay: /proc/driver/nvidia/version (a missing FILE stands for no driver loaded)")
    parser.add_argument("--dmesg", metavar="FILE", help="replay: what `dmesg` printed")
    parser.add_argument("--pci-devices", metavar="DIR", default="/sys/bus/pci/devices",
                        help="replay: sysfs's PCI devices (each a folder with vendor and class files)")
    args = parser.parse_args(argv)
    for path in (args.smi_xml, args.dmesg):
        if path and not os.path.exists(path):
            parser.error(f"no such file: {path}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    on_pci = nvidia_gpus_on_pci(args.pci_devices)
    records = probe(args, on_pci)
    if args.text:
        print(text_table(records))
    else:  # the PCI count lets gpurig skip what only a GPU host needs (the traps' facts); null: sysfs unreadable
        print(json.dumps({"probe": "host", "version": 1, "records": records, "nvidia_gpus_on_pci": on_pci}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
