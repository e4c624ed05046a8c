#!/usr/bin/env python3
"""Samples a host's GPUs, CPUs, memory, disk and network and streams one JSON record per line.

Standalone on purpose (stdlib, plus nvidia-ml-py and psutil when present): gpurig
sends it to hosts over SSH, so it depends on nothing of gpurig. Records:
    {"type": "hello", "hostname", "user", "source": nvml|nvidia-smi|none, ...}   first
    {"type": "note", "message"}                                              at most once each
    {"type": "sample", "t", "cpu", "mem", "disk", "net", "gpus": [...]}       every interval
    {"type": "end", "samples"}                                               when --duration ends
GPU sources, best first: NVML through pynvml; `nvidia-smi --query-gpu ...
--format=csv,noheader,nounits -lms N`; none (CPU and memory only, said once).
A GPU in MIG mode is followed by one record per MIG device ("mig": its index under
the GPU, as in NVIDIA_VISIBLE_DEVICES=0:1), and a note says what stands in for the
utilisation NVML does not report under MIG. A GPU that gives no metric at all ends
the agent with exit status 3 and one line on stderr, never an empty record.
On a Slurm node, a GPU record also names the jobs holding that GPU and their users
("hpc_jobs", "hpc_users"), read from the mapping the Prolog writes (SLURM_GPUS_DIR);
a GPU no job holds, or a host without the mapping, has neither key.
A GPU process that runs in a container carries that container's id ("container": 64 hex digits, read from
/proc/PID/cgroup); a process in none has no such key, as in the records of an agent older than this one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time

try:
    import psutil
except ImportError:  # the /proc readers below do the same on Linux
    psutil = None

# nvidia-smi's own names, in the order the fallback asks for them.
SMI_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "utilization.gpu", "utilization.memory",
    "memory.used", "memory.total", "temperature.gpu", "power.draw", "power.limit",
    "clocks.sm", "clocks.mem", "clocks_throttle_reasons.active",
)  # fmt: skip
# The same fields under the names this script's records use.
SMI_KEYS = (
    "index", "name", "uuid", "pci_bus_id", "util_gpu", "util_mem", "mem_used_mib", "mem_total_mib",
    "temp_c", "power_w", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz", "throttle",
)  # fmt: skip
SMI_MISSING = ("[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[GPU requires reset]", "")
CPU_MODES = ("user", "system", "idle", "iowait")
PCIE_EVERY_S = 1.0  # NVML measures PCIe throughput over 20 ms per call: not more often than this
NVML_SUCCESS = 0
# A GPU record's keys that say which GPU it is; every other key is a metric.
IDENTITY = frozenset(
    {"index", "name", "uuid", "pci_bus_id", "mig", "parent_uuid", "gpu_instance", "compute_instance", "mig_mode", "gpm", "processes", "hpc_jobs", "hpc_users"}
)
# GPM metrics (NVML names, values 0..100) as (record key, metric): a whole GPU reads SM activity and occupancy beside
# its utilisation; a MIG device, which has no utilisation, also reads its engine activity (GRAPHICS_UTIL, what DCGM
# calls DCGM_FI_PROF_GR_ENGINE_ACTIVE) and DRAM bandwidth (DRAM_BW_UTIL, DCGM_FI_PROF_DRAM_ACTIVE) in their place.
GPM_WHOLE = (("sm_active", "NVML_GPM_METRIC_SM_UTIL"), ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"))
GPM_MIG = (("gr_active", "NVML_GPM_METRIC_GRAPHICS_UTIL"), *GPM_WHOLE, ("dram_active", "NVML_GPM_METRIC_DRAM_BW_UTIL"))
# Which Slurm job holds which GPU, as the node's Prolog writes it and its Epilog removes it. SLURM_GPUS_DIR is
# dcgm-exporter's HPC job mapping (its --hpc-job-mapping-dir): a file per GPU index, or <index>.<GPU instance id> for a
# MIG device, one job id a line. SLURM_JOBS_DIR has a file per job id with user=<name> and uid=<number> lines.
SLURM_GPUS_DIR = "/run/gpurig/slurm-gpus"  # GPURIG_SLURM_GPUS_DIR overrides
SLURM_JOBS_DIR = "/run/gpurig/slurm-jobs"  # GPURIG_SLURM_JOBS_DIR overrides
MAPPING_BYTES = 4096  # a mapping file is a few short lines: no more is read, whatever the file holds
MAX_JOBS = 16  # jobs kept per GPU (a shared GPU); the rest of a longer list is not reported
# A job id as Slurm writes it: digits, an array task's _N, a step's .N. A user name in POSIX's portable set, not
# starting with '-'. Anything else in a mapping file is skipped: its content is never trusted into a label.
JOB_ID = re.compile(rb"[0-9]{1,20}(?:_[0-9]{1,10})?(?:\.[0-9]{1,10})?")
USER_NAME = re.compile(rb"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")
UID = re.compile(rb"[0-9]{1,10}")
# A container's cgroup, as its engine names it, ending in the container's 64-hex id: Docker on cgroup v2 or with systemd
# (.../docker-<id>.scope), Docker with cgroupfs (/docker/<id>), containerd's CRI (cri-containerd-<id>.scope), CRI-O
# (crio-<id>.scope), podman (libpod-<id>.scope, /libpod_parent/libpod-<id>). The id must end the path or a path element.
CONTAINER_CGROUP = re.compile(rb"(?:^|/)(?:docker-|cri-containerd-|crio-|libpod-|docker/)([0-9a-f]{64})(?:\.scope)?(?=/|$)")
CGROUP_BYTES = 65536  # /proc/PID/cgroup is a line per hierarchy (13 or so under cgroup v1): no more is read


# --- host: CPU, memory, disk, network ---------------------------------------------------------


def _proc_cpu_times():
    """Per core (user, system, idle, iowait) seconds from /proc/stat."""
    hz = os.sysconf("SC_CLK_TCK")
    out = []
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("cpu") and line[3].isdigit():
                v = [int(x) for x in line.split()[1:]]
                # user+nice, system+irq+softirq, idle, iowait
                out.append(((v[0] + v[1]) / hz, (v[2] + v[5] + v[6]) / hz, v[3] / hz, v[4] / hz))
    return out


def _proc_meminfo():
    info = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
    total = info["MemTotal"]
    available = info.get("MemAvailable", info.get("MemFree", 0))
    return total, available


def _proc_disk_bytes():
    try:
        disks = set(os.listdir("/sys/block"))  # whole disks: partitions would count twice
    except OSError:
        disks = None
    read = written = 0
    with open("/proc/diskstats") as fh:
        for line in fh:
            f = line.split()
            if f[2].startswith(("loop", "ram")) or (disks is not None and f[2] not in disks):
                continue
            read += int(f[5]) * 512
            written += int(f[9]) * 512
    return read, written


def _proc_net_bytes():
    rx = tx = 0
    with open("/proc/net/dev") as fh:
        for line in fh.readlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                continue
            f = rest.split()
            rx += int(f[0])
            tx += int(f[8])
    return rx, tx


class HostSampler:
    """CPU per core and total, RAM, disk and network counters; psutil when present, else /proc."""

    def __init__(self):
        self._last = self._cpu_times()

    @staticmethod
    def _cpu_times():
        if psutil is not None:
            return [
                (t.user + t.nice, t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0), t.idle, getattr(t, "iowait", 0.0))
                for t in psutil.cpu_times(percpu=True)
            ]
        return _proc_cpu_times()

    def sample(self):
        now = self._cpu_times()
        per_core = []
        for (u0, s0, i0, w0), (u1, s1, i1, w1) in zip(self._last, now):
            busy = (u1 - u0) + (s1 - s0)
            total = busy + (i1 - i0) + (w1 - w0)
            per_core.append(round(100.0 * busy / total, 1) if total > 0 else 0.0)
        self._last = now
        if psutil is not None:
            vm = psutil.virtual_memory()
            total, available = vm.total, vm.available
            d = psutil.disk_io_counters()
            disk = (d.read_bytes, d.write_bytes) if d else (0, 0)
            n = psutil.net_io_counters(pernic=True)
            net = (sum(c.bytes_recv for k, c in n.items() if k != "lo"), sum(c.bytes_sent for k, c in n.items() if k != "lo"))
        else:
            total, available = _proc_meminfo()
            disk = _proc_disk_bytes()
            net = _proc_net_bytes()
        return {
            "cpu": {
                "percent": round(sum(per_core) / len(per_core), 1) if per_core else 0.0,
                "per_core": per_core,
                "seconds": {m: [round(t[k], 2) for t in now] for k, m in enumerate(CPU_MODES)},
            },
            "mem": {"total": total, "available": available, "used": total - available},
            "disk": {"read_bytes": disk[0], "written_bytes": disk[1]},
            "net": {"rx_bytes": net[0], "tx_bytes": net[1]},
        }


# --- GPUs through NVML ------------------------------------------------------------------------


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def process_user(pid):
    """The login name owning ``pid`` (or its uid as text; None when the process is gone or hidden)."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def _process_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return None


def container_of_cgroup(data):
    """The id of the container a process runs in from the text of its /proc/PID/cgroup; None when it runs in none.

    The unified hierarchy's line (``0::/path``, cgroup v2) is asked first, then the v1 lines in their order; in a path
    that names several (a container inside a container) the innermost, the last, is the process's own.
    """
    lines = []
    for line in data.splitlines():
        hierarchy, sep, rest = line.partition(b":")
        controllers, sep2, path = rest.partition(b":")
        if sep and sep2:
            lines.append((not (hierarchy == b"0" and controllers == b""), path.strip()))
    for _, path in sorted(lines, key=lambda item: item[0]):  # stable: the v2 line first, the v1 lines as written
        found = CONTAINER_CGROUP.findall(path)
        if found:
            return found[-1].decode()
    return None


def process_container(pid):
    """The id of the container process ``pid`` runs in (its /proc/PID/cgroup); None when in none, gone or unreadable."""
    try:
        fd = os.open("/proc/%d/cgroup" % int(pid), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError, TypeError):
        return None
    try:
        data = os.read(fd, CGROUP_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return container_of_cgroup(data)


class NvmlSource:
    """Every GPU through NVML, and every MIG device of a GPU in MIG mode; a value NVML does not support becomes None, never an error.

    Under MIG, NVML reports no utilisation for the whole GPU (nvmlDeviceGetUtilizationRates
    answers NOT_SUPPORTED), so each MIG device gets a row of its own after its GPU's:
    its memory and processes, and where GPM works (Hopper and newer) the activity GPM
    measures for its GPU instance between two samples (GPM_MIG). The MIG layout is read
    when the agent starts (gpurig restarts it at least hourly); GPM is only sampled on
    GPUs that support it, so a host without MIG or GPM pays nothing more.
    """

    name = "nvml"

    def __init__(self, nvml, clock=time.monotonic):
        self.nvml = nvml
        self.clock = clock
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.static = [self._static(h) for h in self.handles]
        self._gpm_prev = {}
        self._gpm_ok = {i: self._gpm_supported(h) for i, h in enumerate(self.handles)}
        self._gpm_dead = set()
        self._pcie = {}
        self.driver = self._safe(nvml.nvmlSystemGetDriverVersion)
        self.mig = {i: self._mig_devices(i, h) for i, h in enumerate(self.handles) if self._mig_on(h)}
        self.notes = [self._mig_note(i) for i in sorted(self.mig)]

    def _safe(self, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def _call(self, name, *args):
        """``_safe`` for a call an older nvidia-ml-py may lack (None then, as for NOT_SUPPORTED)."""
        fn = getattr(self.nvml, name, None)
        return None if fn is None else self._safe(fn, *args)

    def _static(self, h):
        pci = self._safe(self.nvml.nvmlDeviceGetPciInfo, h)
        return {
            "name": _text(self._safe(self.nvml.nvmlDeviceGetName, h)),
            "uuid": _text(self._safe(self.nvml.nvmlDeviceGetUUID, h)),
            "pci_bus_id": _text(pci.busId) if pci is not None else None,
        }

    def _gpm_supported(self, h):
        support = self._call("nvmlGpmQueryDeviceSupport", h)
        return bool(support is not None and support.isSupportedDevice)

    def _mig_on(self, h):
        mode = self._call("nvmlDeviceGetMigMode", h)  # [current, pending]; NOT_SUPPORTED on GPUs without MIG
        return mode is not None and mode[0] == getattr(self.nvml, "NVML_DEVICE_MIG_ENABLE", 1)

    def _mig_devices(self, i, h):
        """(handle, identity) of each MIG device of GPU ``i``; an index without one answers NOT_FOUND and is skipped."""
        found = []
        for j in range(self._call("nvmlDeviceGetMaxMigDeviceCount", h) or 0):
            mh = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            if mh is None:
                continue
            found.append((mh, {
                "index": i, "mig": j, "name": _text(self._call("nvmlDeviceGetName", mh)), "uuid": _text(self._call("nvmlDeviceGetUUID", mh)),
                "pci_bus_id": self.static[i]["pci_bus_id"], "parent_uuid": self.static[i]["uuid"],
                "gpu_instance": self._call("nvmlDeviceGetGpuInstanceId", mh), "compute_instance": self._call("nvmlDeviceGetComputeInstanceId", mh),
            }))  # fmt: skip
        return found

    def _mig_gpm(self, i):
        return self._gpm_ok.get(i) and hasattr(self.nvml, "nvmlGpmMigSampleGet")

    def _mig_note(self, i):
        n = len(self.mig[i])
        said = f"GPU {i}: MIG mode is on, so NVML reports no whole-GPU utilisation"
        if not n:
            return f"{said}, and it has no MIG device to measure"
        if self._mig_gpm(i):
            return f"{said}; GPM engine and SM activity are shown for each of its {n} MIG devices instead"
        return f"{said}, and GPM is not available on this GPU/driver (it needs Hopper or newer): its {n} MIG devices show memory only"

    def _gpm(self, key, take, metrics):
        """{record key: 0..1} that GPM measured between this sample and the previous one of ``key``.

        None when no GPM sample could be taken (the caller stops asking), {} when the metrics could not be read this time.
        """
        nvml = self.nvml
        try:
            sample = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError:
            return {}
        try:
            take(sample)
        except nvml.NVMLError:
            self._safe(nvml.nvmlGpmSampleFree, sample)
            return None
        prev, self._gpm_prev[key] = self._gpm_prev.get(key), sample
        if prev is None:
            return dict.fromkeys((k for k, _ in metrics), None)  # GPM measures between two samples
        try:
            req = nvml.c_nvmlGpmMetricsGet_t()
            req.version = nvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(metrics)
            req.sample1, req.sample2 = prev, sample
            for n, (_, metric) in enumerate(metrics):
                req.metrics[n].metricId = getattr(nvml, metric)
            got = nvml.nvmlGpmMetricsGet(req)
            # Each metric carries its own return code: one the GPU cannot measure is None, not its garbage value.
            return {k: round(m.value / 100.0, 4) if getattr(m, "nvmlReturn", NVML_SUCCESS) == NVML_SUCCESS else None
                    for (k, _), m in zip(metrics, got.metrics)}  # fmt: skip
        except nvml.NVMLError:
            return {}
        finally:
            self._safe(nvml.nvmlGpmSampleFree, prev)

    def _whole_gpm(self, i, h):
        got = self._gpm(i, lambda s: self.nvml.nvmlGpmSampleGet(h, s), GPM_WHOLE)
        if got is None:
            self._gpm_ok[i] = False
            got = {}
        return got.get("sm_active"), got.get("sm_occupancy")

    def _pcie_kbs(self, i, h):
        now = self.clock()
        last = self._pcie.get(i)
        if last is None or now - last[0] >= PCIE_EVERY_S:
            tx = self._safe(self.nvml.nvmlDeviceGetPcieThroughput, h, self.nvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = self._safe(self.nvml.nvmlDeviceGetPcieThroughput, h, self.nvml.NVML_PCIE_UTIL_RX_BYTES)
            last = self._pcie[i] = (now, tx, rx)
        return last[1], last[2]

    def _processes(self, h):
        procs = self._safe(self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            proc = {"pid": p.pid, "user": process_user(p.pid), "name": _process_name(p.pid), "used_mib": None if used is None else used // 2**20}
            container = process_container(p.pid)
            if container is not None:  # only then: a process in no container is written as an older agent writes it
                proc["container"] = container
            out.append(proc)
        return out

    def sample(self):
        nvml, safe = self.nvml, self._safe
        gpus = []
        for i, h in enumerate(self.handles):
            util = safe(nvml.nvmlDeviceGetUtilizationRates, h)
            mem = safe(nvml.nvmlDeviceGetMemoryInfo, h)
            power = safe(nvml.nvmlDeviceGetPowerUsage, h)
            limit = safe(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            tx, rx = self._pcie_kbs(i, h)
            mig = i in self.mig
            sm_active, sm_occ = self._whole_gpm(i, h) if self._gpm_ok.get(i) and not mig else (None, None)
            gpus.append(
                {
                    "index": i,
                    **self.static[i],
                    "util_gpu": util.gpu if util is not None else None,
                    "util_mem": util.memory if util is not None else None,
                    "mem_used_mib": mem.used // 2**20 if mem is not None else None,
                    "mem_total_mib": mem.total // 2**20 if mem is not None else None,
                    "temp_c": safe(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                    "power_w": power / 1000.0 if power is not None else None,
                    "power_limit_w": limit / 1000.0 if limit is not None else None,
                    "sm_clock_mhz": safe(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                    "mem_clock_mhz": safe(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
                    "throttle": safe(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h),
                    "pcie_tx_kbs": tx,
                    "pcie_rx_kbs": rx,
                    "sm_active": sm_active,
                    "sm_occupancy": sm_occ,
                    # Under MIG the processes are listed on their MIG devices (the GPU's own list is an aggregate for root only).
                    "processes": [] if mig else self._processes(h),
                    **({"mig_mode": True} if mig else {}),
                }
            )
            if mig:
                gpus += self._mig_rows(i, h)
        return gpus

    def _mig_rows(self, i, h):
        """One record per MIG device of GPU ``i``; GPM is read once per GPU instance (its compute instances share it)."""
        by_instance = {}
        rows = []
        for mh, ident in self.mig[i]:
            gi, key = ident["gpu_instance"], ("mig", i, ident["gpu_instance"])
            gpm_on = bool(self._mig_gpm(i)) and gi is not None and key not in self._gpm_dead
            if gpm_on and gi not in by_instance:
                by_instance[gi] = self._gpm(key, lambda s, gi=gi: self.nvml.nvmlGpmMigSampleGet(h, gi, s), GPM_MIG)
                if by_instance[gi] is None:  # this GPU instance cannot be sampled: not asked again
                    self._gpm_dead.add(key)
                    gpm_on = False
            got = by_instance.get(gi) or {}
            mem = self._safe(self.nvml.nvmlDeviceGetMemoryInfo, mh)
            rows.append({
                **ident,
                "mem_used_mib": mem.used // 2**20 if mem is not None else None,
                "mem_total_mib": mem.total // 2**20 if mem is not None else None,
                **{k: got.get(k) for k, _ in GPM_MIG},
                "gpm": gpm_on,
                "processes": self._processes(mh),
            })  # fmt: skip
        return rows

    def close(self):
        for sample in self._gpm_prev.values():
            self._safe(self.nvml.nvmlGpmSampleFree, sample)
        self._safe(self.nvml.nvmlShutdown)


# --- GPUs through nvidia-smi ------------------------------------------------------------------


def parse_smi_value(key, text):
    """One field of `--format=csv,noheader,nounits` output; '[N/A]' and '[Not Supported]' become None."""
    text = text.strip()
    if text in SMI_MISSING:
        return None
    if key in ("name", "uuid", "pci_bus_id"):
        return text
    if key == "throttle":
        return int(text, 16)
    number = float(text)
    return int(number) if key in ("index", "util_gpu", "util_mem", "mem_used_mib", "mem_total_mib", "temp_c", "sm_clock_mhz", "mem_clock_mhz") else number


def parse_smi_line(line):
    """A GPU record from one line of the fallback's output (None for a line that is not one)."""
    parts = [p.strip() for p in line.rstrip("\n").split(",")]
    if len(parts) != len(SMI_KEYS):
        return None
    try:
        gpu = {k: parse_smi_value(k, v) for k, v in zip(SMI_KEYS, parts)}
    except ValueError:
        return None
    if gpu["index"] is None:
        return None
    gpu.update(pcie_tx_kbs=None, pcie_rx_kbs=None, sm_active=None, sm_occupancy=None, processes=[])
    return gpu


class SmiSource:
    """`nvidia-smi -lms` running beside the sampler; each sample takes the latest line of every GPU."""

    name = "nvidia-smi"

    def __init__(self, smi, interval):
        self.latest = {}
        self._lock = threading.Lock()
        query = ["--query-gpu=" + ",".join(SMI_FIELDS), "--format=csv,noheader,nounits"]
        first = subprocess.run([smi, *query], capture_output=True, text=True, timeout=30)
        if first.returncode != 0:
            said = (first.stdout + first.stderr).strip()
            raise RuntimeError(said.splitlines()[0] if said else f"nvidia-smi exited {first.returncode}")
        self._take(first.stdout.splitlines())
        ms = max(100, int(interval * 1000))
        self.proc = subprocess.Popen([smi, *query, "-lms", str(ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _take(self, lines):
        for line in lines:
            gpu = parse_smi_line(line)
            if gpu is not None:
                with self._lock:
                    self.latest[gpu["index"]] = gpu

    def _read(self):
        for line in self.proc.stdout:
            self._take([line])

    def sample(self):
        with self._lock:
            return [dict(self.latest[i]) for i in sorted(self.latest)]

    def close(self):
        self.proc.terminate()
        self.proc.wait()


# --- Slurm jobs holding each GPU ---------------------------------------------------------------


def read_mapping_file(path):
    """The first MAPPING_BYTES of a regular file, cut after its last whole line; None when it is missing, not a regular file or unreadable.

    Opened without following a link and without blocking (a FIFO put there answers None, it cannot hang the agent).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):  # ValueError: a NUL in a name
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAPPING_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAPPING_BYTES:  # a longer file: its line cut by the limit is not a whole job id
        data = data[: data.rfind(b"\n", 0, MAPPING_BYTES) + 1]
    return data


def _job_ids(data):
    jobs = []
    for line in data.splitlines():
        line = line.strip()
        if JOB_ID.fullmatch(line) and line.decode() not in jobs:
            jobs.append(line.decode())
            if len(jobs) == MAX_JOBS:
                break
    return jobs


def job_user(jobs_dir, job):
    """The user of ``job`` from its file: its name, else its uid as text (as for a process); None when neither is there."""
    data = read_mapping_file(os.path.join(jobs_dir, job)) or b""
    found = {}
    for line in data.splitlines():
        key, sep, value = line.partition(b"=")
        key = key.strip()
        if sep and key in (b"user", b"uid") and key not in found:  # the first of each counts
            found[key] = value.strip()
    name, uid = found.get(b"user", b""), found.get(b"uid", b"")
    if USER_NAME.fullmatch(name) and not name.isdigit():
        return name.decode()
    if UID.fullmatch(uid) and int(uid) < 2**32:
        return uid.decode()
    return None


def add_slurm_jobs(gpus, gpus_dir, jobs_dir):
    """Name in each GPU record the jobs holding it and their users; a record no job holds is left as it was.

    Costs one stat on a host without the mapping folder, and on a Slurm node one bounded read per GPU
    and per job holding one, at each sample: a job's mapping changes while the agent runs.
    """
    if not gpus:
        return
    try:
        if not stat.S_ISDIR(os.stat(gpus_dir).st_mode):
            return
    except (OSError, ValueError):
        return
    users = {}
    for g in gpus:
        if g.get("mig") is None:
            key = str(g["index"])
        elif g.get("gpu_instance") is not None:  # dcgm-exporter's <GPU>.<GPU instance>: compute instances of one share it
            key = f"{g['index']}.{g['gpu_instance']}"
        else:
            continue
        jobs = _job_ids(read_mapping_file(os.path.join(gpus_dir, key)) or b"")
        if jobs:
            for job in jobs:
                if job not in users:
                    users[job] = job_user(jobs_dir, job)
            g["hpc_jobs"] = jobs
            g["hpc_users"] = [users[job] for job in jobs]


# --- main -------------------------------------------------------------------------------------


def open_gpu_source(interval, want="auto"):
    """(source or None, note or None): NVML, else nvidia-smi, else nothing with the reason."""
    reasons = []
    if want in ("auto", "nvml"):
        try:
            import pynvml

            return NvmlSource(pynvml), None
        except ImportError:
            reasons.append("pynvml (nvidia-ml-py) is not installed")
        except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            reasons.append(f"NVML: {err}")
    if want in ("auto", "nvidia-smi"):
        smi = shutil.which("nvidia-smi")
        if smi is None:
            reasons.append("nvidia-smi is not on PATH")
        else:
            try:
                return SmiSource(smi, interval), None
            except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                reasons.append(f"nvidia-smi: {err}")
    return None, "no NVIDIA driver found (" + "; ".join(reasons) + "): sampling CPU and memory only"


def emit(record, out=sys.stdout):
    out.write(json.dumps(record, separators=(",", ":")) + "\n")
    out.flush()


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return str(os.getuid())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (default: run until killed)")
    parser.add_argument("--count", type=int, default=0, help="stop after this many samples")
    parser.add_argument("--gpu-source", choices=("auto", "nvml", "nvidia-smi", "none"), default="auto")
    args = parser.parse_args(argv)
    interval = max(0.01, args.interval)
    source, note = open_gpu_source(interval, args.gpu_source) if args.gpu_source != "none" else (None, "GPU sampling turned off (--gpu-source none)")
    host = HostSampler()
    gpus_dir = os.environ.get("GPURIG_SLURM_GPUS_DIR") or SLURM_GPUS_DIR
    jobs_dir = os.environ.get("GPURIG_SLURM_JOBS_DIR") or SLURM_JOBS_DIR
    emit(
        {
            "type": "hello", "hostname": socket.gethostname(), "user": _user(), "pid": os.getpid(),
            "source": source.name if source else "none", "psutil": psutil is not None,
            "cpus": os.cpu_count(), "interval": interval, "version": 1,
            "driver": getattr(source, "driver", None),
        }
    )  # fmt: skip
    for message in ([note] if note else []) + list(getattr(source, "notes", ())):
        emit({"type": "note", "message": message})
    started = time.monotonic()
    due = started + interval
    count = 0
    try:
        while True:
            time.sleep(max(0.0, due - time.monotonic()))
            due += interval
            if due < time.monotonic():  # fell behind (a slow NVML call): skip, never burst
                due = time.monotonic() + interval
            gpus = source.sample() if source else []
            # GPM measures between two samples: on the first one a MIG device that GPM measures may have nothing yet.
            blank = [g for g in gpus if not any(g.get(k) is not None for k in g if k not in IDENTITY) and not (g.get("gpm") and not count)]
            if blank:  # fail closed: a GPU found and then read as nothing is not an idle GPU
                g = blank[0]
                where = f"{g['index']}:{g['mig']}" if g.get("mig") is not None else str(g["index"])
                sys.stderr.write(f"gpu_sampler: GPU {where} ({g.get('uuid') or 'no UUID'}) gave no metric at all through {source.name}: "
                                 "the GPU may be lost or the driver broken; 'nvidia-smi -q' on the host says more\n")
                return 3
            add_slurm_jobs(gpus, gpus_dir, jobs_dir)
            record = {"type": "sample", "t": round(time.time(), 3), **host.sample(), "gpus": gpus}
            emit(record)
            count += 1
            if (args.count and count >= args.count) or (args.duration and time.monotonic() - started >= args.duration - interval / 2):
                break
        emit({"type": "end", "samples": count})
    except (BrokenPipeError, KeyboardInterrupt):  # the reader went away (SSH closed, Ctrl-C): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
    finally:
        if source:
            source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
