"""The sampler agent's JSON records as typed samples: one host at one instant, with its GPUs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpurig.strict.validate import finite_number

# NVML's clock throttle (since 535 "clocks event") reason bits, with nvidia-smi's names.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The reasons that cost speed because of heat or power (gpu_idle and settings do not).
HEAT_OR_POWER = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    user: str | None = None
    name: str | None = None
    used_mib: int | None = None
    container: str | None = None  # the id (64 hex) of the container it runs in, from its cgroup; None: in none, or an older agent


@dataclass(frozen=True)
class HpcJob:
    """A Slurm job holding a GPU (the node's job mapping, dcgm-exporter's HPC job mapping): its id and, where known, its user."""

    id: str
    user: str | None = None  # the login name, or the uid as text where the job's file gives no name


# The agent's own patterns (checks/gpu_sampler.py JOB_ID, USER_NAME, MAX_JOBS): a record with anything else is not the agent's.
JOB_ID = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?(?:\.[0-9]{1,10})?")
USER_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")
MAX_JOBS = 16
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")  # what the agent reads from a cgroup (checks/gpu_sampler.py CONTAINER_CGROUP)


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant. None: the GPU or its driver does not report that value."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    util_gpu: float | None = None  # % of time a kernel ran (nvidia-smi utilization.gpu)
    util_mem: float | None = None  # % of time memory was read or written
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle: int | None = None  # NVML reason bit mask
    pcie_tx_kbs: float | None = None
    pcie_rx_kbs: float | None = None
    sm_active: float | None = None  # 0..1, NVML GPM (Hopper and newer)
    sm_occupancy: float | None = None  # 0..1
    processes: tuple[GpuProcess, ...] = ()
    # MIG. A whole GPU in MIG mode has mig_mode True and no utilisation (NVML does not report it under MIG);
    # each of its MIG devices is a GpuSample of its own with ``mig`` set (its index under GPU ``index``).
    mig_mode: bool | None = None
    mig: int | None = None
    parent_uuid: str | None = None  # a MIG device's GPU
    gpu_instance: int | None = None
    compute_instance: int | None = None
    gpm: bool | None = None  # a MIG device: whether GPM can measure it (False: not on this GPU/driver)
    gr_active: float | None = None  # 0..1, GPM GRAPHICS_UTIL: a MIG device's stand-in for util_gpu
    dram_active: float | None = None  # 0..1, GPM DRAM_BW_UTIL: a MIG device's stand-in for util_mem
    hpc_jobs: tuple[HpcJob, ...] = ()  # the Slurm jobs holding it, where the node maps them (several: a shared GPU)

    @property
    def label(self) -> str:
        """'0' for a whole GPU, '0:1' for MIG device 1 of GPU 0 (NVIDIA_VISIBLE_DEVICES' own form)."""
        return str(self.index) if self.mig is None else f"{self.index}:{self.mig}"

    @property
    def key(self) -> tuple[int, int]:
        """Sorts a GPU before its MIG devices."""
        return (self.index, -1 if self.mig is None else self.mig)

    @property
    def profile(self) -> str | None:
        """A MIG device's profile ('3g.40gb') from the name NVML gives it ('NVIDIA H100 80GB HBM3 MIG 3g.40gb')."""
        if self.mig is None or not self.name:
            return None
        _, sep, profile = self.name.rpartition(" MIG ")
        return profile if sep else None

    @property
    def model(self) -> str | None:
        """The GPU's model name, without a MIG device's profile."""
        if self.mig is None or not self.name:
            return self.name
        return self.name.rpartition(" MIG ")[0] or self.name

    @property
    def throttle_reasons(self) -> tuple[str, ...]:
        if not self.throttle:
            return ()
        return tuple(name for bit, name in THROTTLE_REASONS.items() if self.throttle & bit)

    @property
    def mem_fraction(self) -> float | None:
        if self.mem_used_mib is None or not self.mem_total_mib:
            return None
        return self.mem_used_mib / self.mem_total_mib


@dataclass(frozen=True)
class Sample:
    """One host at one instant (``t``: seconds since the epoch)."""

    host: str
    t: float
    cpu_percent: float
    per_core: tuple[float, ...] = ()
    cpu_seconds: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    mem_total: int = 0
    mem_available: int = 0
    disk_read_bytes: int = 0
    disk_written_bytes: int = 0
    net_rx_bytes: int = 0
    net_tx_bytes: int = 0
    gpus: tuple[GpuSample, ...] = ()

    @property
    def mem_used(self) -> int:
        return self.mem_total - self.mem_available

    @property
    def max_core(self) -> float:
        return max(self.per_core, default=self.cpu_percent)


_GPU_FIELDS = {f for f in GpuSample.__dataclass_fields__ if f not in ("processes", "hpc_jobs")}
_GPU_TEXT = ("name", "uuid", "pci_bus_id", "parent_uuid")
_GPU_COUNTS = ("index", "throttle", "mig", "gpu_instance", "compute_instance")
_GPU_FLAGS = ("mig_mode", "gpm")
# The end of year 9999: a later time cannot be shown as a date (time.localtime overflows), so it is no time a host recorded.
MAX_TIME = 253_402_300_799.0
MAX_COUNT = 2**63 - 1


def _number(value: Any, what: str) -> float:
    """A finite number as the agent wrote it (an int or float, never a string, bool, NaN or inf); ValueError else."""
    number = finite_number(value) if isinstance(value, (int, float)) else None
    if number is None:
        raise ValueError(f"{what} is not a finite number")
    return number


def _count(value: Any, what: str) -> int:
    """A whole number 0..2**63-1 as the agent wrote it; ValueError else (int(1e308) is a 300-digit int, int(inf) raises)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value) if abs(value) <= MAX_COUNT else -1
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{what} is not a count")
    return value


def _gpu_value(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in _GPU_TEXT:
        if not isinstance(value, str):
            raise ValueError(f"gpu {name} is not text")
        return value
    if name in _GPU_FLAGS:
        if not isinstance(value, bool):
            raise ValueError(f"gpu {name} is not true or false")
        return value
    if name in _GPU_COUNTS:
        return _count(value, f"gpu {name}")
    return _number(value, f"gpu {name}")


def gpu_from_record(rec: Mapping[str, Any]) -> GpuSample:
    """A GpuSample from the agent's JSON; ValueError/TypeError/KeyError when a value is not what the agent writes."""
    values: dict[str, Any] = {k: _gpu_value(k, rec.get(k)) for k in _GPU_FIELDS}
    if values["index"] is None:
        raise KeyError("index")
    procs = tuple(
        GpuProcess(_count(p["pid"], "pid"), _text(p.get("user")), _text(p.get("name")),
                   None if p.get("used_mib") is None else _count(p.get("used_mib"), "used_mib"), _container(p.get("container")))
        for p in rec.get("processes") or ()
    )  # fmt: skip
    return GpuSample(**values, processes=procs, hpc_jobs=_hpc_jobs(rec.get("hpc_jobs"), rec.get("hpc_users")))


def _hpc_jobs(jobs: Any, users: Any) -> tuple[HpcJob, ...]:
    """The agent's "hpc_jobs" (ids) and "hpc_users" (a name or None for each) as HpcJobs; ValueError when they are not what it writes."""
    if jobs is None and users is None:
        return ()
    if not isinstance(jobs, list) or not isinstance(users, list) or not 0 < len(jobs) <= MAX_JOBS or len(users) != len(jobs):
        raise ValueError("gpu hpc_jobs and hpc_users are not two lists of the same length, 1 to 16")
    if len(set(map(str, jobs))) != len(jobs):  # one job twice would be two identical series: Prometheus refuses the page
        raise ValueError("gpu hpc_jobs names a job twice")
    out = []
    for job, user in zip(jobs, users):
        if not isinstance(job, str) or not JOB_ID.fullmatch(job):
            raise ValueError("gpu hpc_jobs holds what is not a Slurm job id")
        if user is not None and (not isinstance(user, str) or not USER_NAME.fullmatch(user)):
            raise ValueError("gpu hpc_users holds what is not a user name")
        out.append(HpcJob(job, user))
    return tuple(out)


def _container(value: Any) -> str | None:
    """A process's container id as the agent writes it (64 lowercase hex digits), or None where it sent none."""
    if value is None:
        return None
    if not isinstance(value, str) or not CONTAINER_ID.fullmatch(value):
        raise ValueError("a process's container is not a container id")
    return value


def _text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError("not text")
    return value


def sample_from_record(host: str, rec: Mapping[str, Any]) -> Sample:
    """A Sample from the agent's ``{"type": "sample", ...}`` record; KeyError/TypeError/ValueError when malformed.

    Every number is checked as it enters: a recorded time of 1e308 or a
    memory size of Infinity would otherwise surface later as an overflow in
    the CSV's dates, the plot or the live view.
    """
    cpu, mem = rec["cpu"], rec.get("mem") or {}
    disk, net = rec.get("disk") or {}, rec.get("net") or {}
    t = _number(rec["t"], "t")
    if not 0 <= t <= MAX_TIME:
        raise ValueError("t is not a time")
    return Sample(
        host=host,
        t=t,
        cpu_percent=_number(cpu["percent"], "cpu percent"),
        per_core=tuple(_number(x, "cpu per_core") for x in cpu.get("per_core") or ()),
        cpu_seconds={str(m): tuple(_number(x, "cpu seconds") for x in v) for m, v in (cpu.get("seconds") or {}).items()},
        mem_total=_count(mem.get("total", 0), "mem total"),
        mem_available=_count(mem.get("available", 0), "mem available"),
        disk_read_bytes=_count(disk.get("read_bytes", 0), "disk read_bytes"),
        disk_written_bytes=_count(disk.get("written_bytes", 0), "disk written_bytes"),
        net_rx_bytes=_count(net.get("rx_bytes", 0), "net rx_bytes"),
        net_tx_bytes=_count(net.get("tx_bytes", 0), "net tx_bytes"),
        gpus=tuple(gpu_from_record(g) for g in rec.get("gpus") or ()),
    )
