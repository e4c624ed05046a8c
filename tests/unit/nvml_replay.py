"""The monitor's agent (checks/gpu_sampler.py) loaded as a module, and pynvml's surface as it uses it, replayed from a recorded fixture.

FakeNvml answers each call from tests/fixtures/monitor/nvml-*.json (see the
fixture's README for where each value's shape comes from) with the real
binding's errors and constants: ``"NOT_SUPPORTED"`` (or another NVML error
name) raises that NVMLError, as pynvml does. ``calls`` counts what the agent
asked, so a test can say what a sample costs.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pynvml

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "checks" / "gpu_sampler.py"
FIXTURES = ROOT / "tests" / "fixtures" / "monitor"

_spec = importlib.util.spec_from_file_location("gpu_sampler", AGENT)
assert _spec is not None and _spec.loader is not None
sampler = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sampler)

# GPM metric ids and the fixture's names for them.
GPM_NAMES = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics_util",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_util",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_bw_util",
}


def _raise_if_error(value):
    if isinstance(value, str) and hasattr(pynvml, f"NVML_ERROR_{value}"):
        raise pynvml.NVMLError(getattr(pynvml, f"NVML_ERROR_{value}"))
    return value


class FakeNvml:
    """pynvml as the agent uses it. A GPU's handle is its index; a MIG device's is ("mig", gpu, index)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, data):
        self.data = data
        self.calls: Counter[str] = Counter()
        self.__dict__.update({k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith("NVML_")})

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if not name.startswith("nvml"):
            return value
        calls = object.__getattribute__(self, "calls")

        def counted(*args):
            calls[name] += 1
            return value(*args)

        return counted

    def _device(self, h):
        if isinstance(h, tuple):
            return self.data["devices"][h[1]]["mig_devices"][h[2]]
        return self.data["devices"][h]

    def _get(self, h, *keys):
        value = self._device(h)
        for k in keys:
            value = _raise_if_error(value)
            value = value.get(k, "NOT_SUPPORTED") if isinstance(value, dict) else value[k]
        return _raise_if_error(value)

    def nvmlInit(self): ...
    def nvmlShutdown(self): ...
    def nvmlSystemGetDriverVersion(self): return self.data["driver"]
    def nvmlDeviceGetCount(self): return len(self.data["devices"])
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return self._get(h, "name")
    def nvmlDeviceGetUUID(self, h): return self._get(h, "uuid")
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=self._get(h, "busId").encode())
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(**self._get(h, "utilization"))
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(**self._get(h, "memory"))
    def nvmlDeviceGetTemperature(self, h, sensor): return self._get(h, "temperature")
    def nvmlDeviceGetPowerUsage(self, h): return self._get(h, "power_mw")
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return self._get(h, "power_limit_mw")
    def nvmlDeviceGetClockInfo(self, h, clock): return self._get(h, "clocks", "sm" if clock == pynvml.NVML_CLOCK_SM else "mem")
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h): return self._get(h, "throttle")
    def nvmlDeviceGetPcieThroughput(self, h, which): return self._get(h, "pcie_kbs", "tx" if which == pynvml.NVML_PCIE_UTIL_TX_BYTES else "rx")
    def nvmlDeviceGetComputeRunningProcesses(self, h): return [SimpleNamespace(**p) for p in self._get(h, "processes")]
    def nvmlDeviceGetMigMode(self, h): return list(self._get(h, "mig_mode"))
    def nvmlDeviceGetMaxMigDeviceCount(self, h): return self._get(h, "max_mig_devices")
    def nvmlDeviceGetGpuInstanceId(self, h): return self._get(h, "gpu_instance")
    def nvmlDeviceGetComputeInstanceId(self, h): return self._get(h, "compute_instance")

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, index):
        if self._get(h, "mig_mode")[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if index >= len(self._get(h, "mig_devices")):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h, index)

    def nvmlGpmQueryDeviceSupport(self, h): return SimpleNamespace(isSupportedDevice=int(self._device(h)["gpm"] != "NOT_SUPPORTED"))
    def nvmlGpmSampleAlloc(self): return SimpleNamespace(device=None, gpu_instance=None)
    def nvmlGpmSampleFree(self, s): ...

    def nvmlGpmSampleGet(self, h, s):
        self._get(h, "gpm")
        s.device = h

    def nvmlGpmMigSampleGet(self, h, gpu_instance, s):
        if self._device(h)["gpm"] == "NOT_SUPPORTED" or str(gpu_instance) not in self._device(h).get("gpm_mig", {}):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        s.device, s.gpu_instance = h, gpu_instance

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, value=0.0, nvmlReturn=0) for _ in range(pynvml.NVML_GPM_METRIC_MAX)])

    def nvmlGpmMetricsGet(self, req):
        s = req.sample2
        values = self._get(s.device, "gpm") if s.gpu_instance is None else self._device(s.device)["gpm_mig"][str(s.gpu_instance)]
        for m in req.metrics[: req.numMetrics]:
            value = values.get(GPM_NAMES.get(m.metricId), "NOT_SUPPORTED")
            if value == "NOT_SUPPORTED":  # one metric this GPU cannot measure: its own return code, the call succeeds
                m.nvmlReturn, m.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                m.nvmlReturn, m.value = pynvml.NVML_SUCCESS, value
        return req


T0 = 1_760_000_000.0
# The host half of a sample record, fixed so that a replayed run renders the same every time.
HOST_PART = {
    "cpu": {"percent": 40.0, "per_core": [55.0, 25.0], "seconds": {"user": [10.0, 5.0], "system": [1.0, 1.0], "idle": [50.0, 60.0], "iowait": [0.5, 0.5]}},
    "mem": {"total": 64 * 2**30, "available": 40 * 2**30, "used": 24 * 2**30},
    "disk": {"read_bytes": 10**9, "written_bytes": 10**8},
    "net": {"rx_bytes": 10**9, "tx_bytes": 10**8},
}


def agent_records(nvml: FakeNvml, host: str, n: int = 3) -> list[dict]:
    """What the agent streams over ``nvml`` (hello, its notes, ``n`` samples a second apart), each with ``host`` as --record keeps it."""
    source = sampler.NvmlSource(nvml)
    records = [{"type": "hello", "hostname": host, "user": "alice", "pid": 1, "source": "nvml", "psutil": True, "cpus": 2, "interval": 1.0, "version": 1,
                "driver": source.driver}]  # fmt: skip
    records += [{"type": "note", "message": m} for m in source.notes]
    records += [{"type": "sample", "t": T0 + i, **HOST_PART, "gpus": source.sample()} for i in range(n)]
    source.close()
    return [{**r, "host": host} for r in records]
