"""The sampler agent's JSON records as typed samples: one host at one instant, with its GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


_GPU_FIELDS = {f for f in GpuSample.__dataclass_fields__ if f != "processes"}


def gpu_from_record(rec: Mapping[str, Any]) -> GpuSample:
    values: dict[str, Any] = {k: rec.get(k) for k in _GPU_FIELDS}  # JSON values as the agent wrote them
    procs = tuple(
        GpuProcess(int(p["pid"]), p.get("user"), p.get("name"), p.get("used_mib")) for p in rec.get("processes") or ()
    )
    return GpuSample(**values, processes=procs)


def sample_from_record(host: str, rec: Mapping[str, Any]) -> Sample:
    """A Sample from the agent's ``{"type": "sample", ...}`` record; KeyError/TypeError/ValueError when malformed."""
    cpu, mem = rec["cpu"], rec.get("mem") or {}
    disk, net = rec.get("disk") or {}, rec.get("net") or {}
    return Sample(
        host=host,
        t=float(rec["t"]),
        cpu_percent=float(cpu["percent"]),
        per_core=tuple(float(x) for x in cpu.get("per_core") or ()),
        cpu_seconds={m: tuple(v) for m, v in (cpu.get("seconds") or {}).items()},
        mem_total=int(mem.get("total", 0)),
        mem_available=int(mem.get("available", 0)),
        disk_read_bytes=int(disk.get("read_bytes", 0)),
        disk_written_bytes=int(disk.get("written_bytes", 0)),
        net_rx_bytes=int(net.get("rx_bytes", 0)),
        net_tx_bytes=int(net.get("tx_bytes", 0)),
        gpus=tuple(gpu_from_record(g) for g in rec.get("gpus") or ()),
    )
