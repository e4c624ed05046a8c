"""CSV of a run with nvidia-smi's own column names and units, so scripts written for `nvidia-smi --query-gpu` keep working.

Rows look like `nvidia-smi --query-gpu=... --format=csv,nounits`: header names
with units in brackets, values without, ", " between fields, "[N/A]" for a
value the GPU does not report, and a "hostname" column after the timestamp.
The columns after clocks_throttle_reasons.active have no nvidia-smi name and
are gpurig's (PCIe, SM activity from NVML GPM, the host's CPU and memory).
A host without GPUs gets one row per sample with the GPU fields "[N/A]".
A GPU in MIG mode is followed by a row per MIG device, as NVIDIA's tools name
it: index "0:1" (GPU 0's MIG device 1, NVIDIA_VISIBLE_DEVICES' form), its
MIG- uuid and its NVML name ("... MIG 3g.40gb"). NVML reports no utilisation
under MIG, so utilization.gpu is "[N/A]" there, never 0; sm.active and
sm.occupancy are the MIG device's own, from GPM. The header never changes.
The file is written under a temporary name and renamed when the run ends.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpurig.files import output_path
from gpurig.monitor import MonitorError
from gpurig.monitor.samples import GpuSample, Sample

NA = "[N/A]"


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return NA
    return f"{value:.{digits}f}"


def _pct(ratio: float | None) -> str:
    return NA if ratio is None else f"{100 * ratio:.1f}"


def timestamp(t: float) -> str:
    """nvidia-smi's timestamp format: local time, 2024/01/15 10:23:45.123."""
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


GpuColumn = tuple[str, Callable[[GpuSample], str]]
GPU_COLUMNS: tuple[GpuColumn, ...] = (
    ("index", lambda g: g.label),
    ("name", lambda g: g.name or NA),
    ("uuid", lambda g: g.uuid or NA),
    ("pci.bus_id", lambda g: g.pci_bus_id or NA),
    ("utilization.gpu [%]", lambda g: _num(g.util_gpu)),
    ("utilization.memory [%]", lambda g: _num(g.util_mem)),
    ("memory.used [MiB]", lambda g: _num(g.mem_used_mib)),
    ("memory.total [MiB]", lambda g: _num(g.mem_total_mib)),
    ("temperature.gpu", lambda g: _num(g.temp_c)),
    ("power.draw [W]", lambda g: _num(g.power_w, 2)),
    ("power.limit [W]", lambda g: _num(g.power_limit_w, 2)),
    ("clocks.sm [MHz]", lambda g: _num(g.sm_clock_mhz)),
    ("clocks.mem [MHz]", lambda g: _num(g.mem_clock_mhz)),
    ("clocks_throttle_reasons.active", lambda g: NA if g.throttle is None else f"0x{g.throttle:016x}"),
    ("pcie.tx [KB/s]", lambda g: _num(g.pcie_tx_kbs)),
    ("pcie.rx [KB/s]", lambda g: _num(g.pcie_rx_kbs)),
    ("sm.active [%]", lambda g: _pct(g.sm_active)),
    ("sm.occupancy [%]", lambda g: _pct(g.sm_occupancy)),
)
HOST_COLUMNS: tuple[tuple[str, Callable[[Sample], str]], ...] = (
    ("host.cpu [%]", lambda s: f"{s.cpu_percent:.1f}"),
    ("host.cpu.max_core [%]", lambda s: f"{s.max_core:.1f}"),
    ("host.memory.used [MiB]", lambda s: str(s.mem_used >> 20)),
    ("host.memory.total [MiB]", lambda s: str(s.mem_total >> 20)),
)
HEADER = ("timestamp", "hostname", *(n for n, _ in GPU_COLUMNS), *(n for n, _ in HOST_COLUMNS))


def quote(field: str) -> str:
    """CSV quoting (RFC 4180) for a field that holds the separator, a quote, a newline or leading space."""
    if any(c in field for c in ',"\r\n') or field[:1].isspace():
        return '"' + field.replace('"', '""') + '"'
    return field


def rows(sample: Sample) -> list[list[str]]:
    """The CSV rows of one host sample: one per GPU, or one with the GPU fields [N/A]."""
    head = [timestamp(sample.t), sample.host]
    tail = [fn(sample) for _, fn in HOST_COLUMNS]
    if not sample.gpus:
        return [head + [NA] * len(GPU_COLUMNS) + tail]
    return [head + [fn(g) for _, fn in GPU_COLUMNS] + tail for g in sample.gpus]


def format_row(fields: list[str]) -> str:
    return ", ".join(quote(f) for f in fields) + "\n"


class CsvWriter:
    """A Run listener writing each sample's rows as they arrive; ``close`` puts the file in place."""

    def __init__(self, path: str | Path) -> None:
        # The whole path checked (no other user's link on the way); a device or FIFO is written in place, never replaced.
        self.path, found = output_path(path, "--csv")
        self._tmp: Path | None = None
        try:
            if found is not None and not stat.S_ISREG(found.st_mode):
                self._fh = open(self.path, "w", encoding="utf-8", newline="")
            else:
                fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=self.path.parent)
                self._tmp = Path(tmp)
                self._fh = os.fdopen(fd, "w", encoding="utf-8", newline="")
        except OSError as err:
            raise MonitorError(f"cannot write {path}: {err.strerror}", "choose a --csv path you can write") from None
        self._fh.write(format_row(list(HEADER)))
        self._lock = threading.Lock()

    def __call__(self, host: str, record: Mapping[str, Any], sample: Sample | None) -> None:
        if sample is None:
            return
        text = "".join(format_row(r) for r in rows(sample))
        with self._lock:
            if not self._fh.closed:
                self._fh.write(text)
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh.closed:
                return
            self._fh.close()
        if self._tmp is not None:
            os.chmod(self._tmp, 0o644)
            os.replace(self._tmp, self.path)

    def discard(self) -> None:
        with self._lock:
            self._fh.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def write_csv(path: str | Path, samples: list[Sample]) -> None:
    """Write recorded samples as one CSV (from a recorded run)."""
    writer = CsvWriter(path)
    try:
        for s in samples:
            writer(s.host, {}, s)
    except BaseException:
        writer.discard()
        raise
    writer.close()
