"""A Prometheus exporter over a Run: dcgm-exporter's GPU metric names and labels, node-exporter-style host metrics.

A custom collector (prometheus_client) builds the metric families from each
host's latest sample and prometheus_client renders them; the page is shared
(MetricsPage) so that many scrapers at once cost one rendering, and a small
asyncio server answers them. Dashboards written for dcgm-exporter
(``DCGM_FI_DEV_GPU_UTIL{gpu, UUID, modelName, Hostname}``) and node-exporter
(``node_cpu_seconds_total{cpu, mode}``) work unchanged.

Under MIG, as dcgm-exporter does, the GPU has no DCGM_FI_DEV_GPU_UTIL (NVML
reports none) and each MIG device has its own series: the GPU's labels plus
``GPU_I_PROFILE`` and ``GPU_I_ID`` (dcgm-exporter's) and ``mig_uuid`` (two
compute instances of one GPU instance differ only there), with its memory and
GPM's ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``SM_ACTIVE``, ``SM_OCCUPANCY`` and
``DRAM_ACTIVE``. A page without MIG devices is what it always was.

On a Slurm node, the series of a GPU (or MIG device) a job holds carry
dcgm-exporter's ``hpc_job`` label (its HPC job mapping) and gpurig's
``hpc_user``; a GPU no job holds has neither label, as in dcgm-exporter.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpurig.monitor import MonitorError
from gpurig.monitor.samples import GpuSample, Sample
from gpurig.monitor.session import Run
from gpurig.strict.validate import excerpt, whole_number

MAX_AGE_S = 1.0  # samples arrive about once a second
MAX_STALE_S = 5.0  # older than this, a scrape waits for a fresh page (Prometheus scrapes every 15 s or so)
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID", "mig_uuid")
HPC_JOB_LABEL = "hpc_job"  # dcgm-exporter's (internal/pkg/transformation/const.go, hpcJobAttribute)
HPC_USER_LABEL = "hpc_user"  # gpurig's: dcgm-exporter's mapping files name no user


def _fb_free(g: GpuSample) -> float | None:
    return None if g.mem_used_mib is None or g.mem_total_mib is None else g.mem_total_mib - g.mem_used_mib


# dcgm-exporter's name, its help text, and the value from a GpuSample (in dcgm's unit).
DCGM_GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.util_gpu),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.util_mem),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.mem_used_mib),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temp_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda g: g.power_limit_w),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.mem_clock_mhz),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bit mask).", lambda g: g.throttle),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe TX throughput (in KB/s).", lambda g: g.pcie_tx_kbs),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe RX throughput (in KB/s).", lambda g: g.pcie_rx_kbs),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned (in %).", lambda g: g.sm_active),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM (in %).", lambda g: g.sm_occupancy),
)
# Read for MIG devices only (GPM's stand-ins for the utilisation MIG lacks); on the page only when one has a value.
MIG_GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active (in %).", lambda g: g.gr_active),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data (in %).", lambda g: g.dram_active),
)
MIG_NAMES = frozenset(name for name, _, _ in MIG_GAUGES)


def gpu_labels(host: str, g: GpuSample) -> dict[str, str]:
    """dcgm-exporter's labels for a GPU; for a MIG device its GPU's, plus which MIG device it is."""
    labels = dict(zip(GPU_LABELS, (str(g.index), (g.parent_uuid if g.mig is not None else g.uuid) or "", g.pci_bus_id or "",
                                   f"nvidia{g.index}", g.model or "", host)))  # fmt: skip
    if g.mig is not None:
        labels.update(zip(MIG_LABELS, (g.profile or "", "" if g.gpu_instance is None else str(g.gpu_instance), g.uuid or "")))
    return labels


def series_labels(host: str, g: GpuSample) -> list[dict[str, str]]:
    """The label sets of a GPU's series: one without job labels, or one per Slurm job holding it.

    As dcgm-exporter's hpcMapper does: no job, no ``hpc_job`` label at all (not an
    empty one, so that ``{hpc_job!=""}`` selects the GPUs jobs hold and dashboards
    that never heard of jobs see the series they always saw); several jobs on one
    GPU, the GPU's value repeated in one series per job, which differ only in
    ``hpc_job`` (and ``hpc_user``). A sum over a shared GPU's series counts it once per job.
    """
    labels = gpu_labels(host, g)
    if not g.hpc_jobs:
        return [labels]
    return [{**labels, HPC_JOB_LABEL: job.id, **({HPC_USER_LABEL: job.user} if job.user else {})} for job in g.hpc_jobs]


class RunCollector(Collector):
    """Metric families from each host's latest sample; a host silent for ``stale_after`` seconds is left out."""

    def __init__(self, run: Run, stale_after: float | None = None, clock: Callable[[], float] = time.time) -> None:
        self.run = run
        self.stale_after = stale_after
        self.clock = clock

    def _current(self) -> list[Sample]:
        latest = self.run.latest()
        if self.stale_after is None:
            return list(latest.values())
        now = self.clock()
        return [s for s in latest.values() if now - s.t <= self.stale_after]

    def collect(self) -> Iterator[Metric]:
        samples = self._current()
        gauges = {name: GaugeMetricFamily(name, text, labels=GPU_LABELS) for name, text, _ in DCGM_GAUGES + MIG_GAUGES}
        cpu = CounterMetricFamily("node_cpu_seconds", "Seconds the CPUs spent in each mode.", labels=("Hostname", "cpu", "mode"))
        host_gauges = {
            "node_memory_MemTotal_bytes": GaugeMetricFamily("node_memory_MemTotal_bytes", "Memory information field MemTotal_bytes.", labels=("Hostname",)),
            "node_memory_MemAvailable_bytes": GaugeMetricFamily(
                "node_memory_MemAvailable_bytes", "Memory information field MemAvailable_bytes.", labels=("Hostname",)
            ),
        }
        counters = {
            "node_disk_read_bytes": CounterMetricFamily("node_disk_read_bytes", "The total number of bytes read successfully.", labels=("Hostname",)),
            "node_disk_written_bytes": CounterMetricFamily("node_disk_written_bytes", "The total number of bytes written successfully.", labels=("Hostname",)),
            "node_network_receive_bytes": CounterMetricFamily("node_network_receive_bytes", "Network device statistic receive_bytes.", labels=("Hostname",)),
            "node_network_transmit_bytes": CounterMetricFamily("node_network_transmit_bytes", "Network device statistic transmit_bytes.", labels=("Hostname",)),
        }
        for s in samples:
            for g in s.gpus:
                label_sets = series_labels(s.host, g)
                for name, _, read in DCGM_GAUGES + (MIG_GAUGES if g.mig is not None else ()):
                    v = read(g)
                    if v is not None:
                        for labels in label_sets:
                            gauges[name].add_sample(name, labels, float(v))
            for mode, per_core in s.cpu_seconds.items():
                for core, seconds in enumerate(per_core):
                    cpu.add_metric([s.host, str(core), mode], float(seconds))
            host_gauges["node_memory_MemTotal_bytes"].add_metric([s.host], float(s.mem_total))
            host_gauges["node_memory_MemAvailable_bytes"].add_metric([s.host], float(s.mem_available))
            for name, value in (
                ("node_disk_read_bytes", s.disk_read_bytes),
                ("node_disk_written_bytes", s.disk_written_bytes),
                ("node_network_receive_bytes", s.net_rx_bytes),
                ("node_network_transmit_bytes", s.net_tx_bytes),
            ):
                counters[name].add_metric([s.host], float(value))
        yield from (f for f in gauges.values() if f.samples or f.name not in MIG_NAMES)
        yield cpu
        yield from host_gauges.values()
        yield from counters.values()


def parse_listen(text: str) -> tuple[str, int]:
    """'[ADDR:]PORT' -> (address, port); loopback unless an address is given."""
    addr, _, port = str(text).rpartition(":")
    addr = addr.strip("[]") or "127.0.0.1"
    number = whole_number(port, 65535)
    if number is None:
        raise MonitorError(f"--prometheus {excerpt(text)} is not [ADDR:]PORT", "give a port such as 9400, or 0.0.0.0:9400 to listen on every interface")
    return addr, number


class MetricsPage:
    """The /metrics page, rendered once for many scrapers.

    A page younger than ``max_age`` is served as it is; one up to
    ``max_stale`` old is served while a fresh one renders in the background;
    an older one (Prometheus every 15 s) is rendered before answering. Only
    one rendering runs at a time, and only the latest page is held.
    """

    def __init__(self, registry: CollectorRegistry, max_age: float = MAX_AGE_S, max_stale: float = MAX_STALE_S) -> None:
        self.registry = registry
        self.max_age = max_age
        self.max_stale = max_stale
        self._lock = threading.Lock()  # guards the page
        self._rendering = threading.Lock()  # one rendering at a time
        self._pages: tuple[bytes, bytes] | None = None  # (plain, gzip)
        self._at = 0.0

    def _render(self) -> tuple[bytes, bytes]:
        plain = generate_latest(self.registry)
        pages = (plain, gzip.compress(plain, compresslevel=1))  # Prometheus asks for gzip: a tenth of the bytes
        with self._lock:
            self._pages, self._at = pages, time.monotonic()
        return pages

    def _refresh_in_background(self) -> None:
        if self._rendering.acquire(blocking=False):
            def run() -> None:
                try:
                    self._render()
                finally:
                    self._rendering.release()

            threading.Thread(target=run, name="gpurig-exporter-render", daemon=True).start()

    def render(self) -> tuple[bytes, bytes]:
        """(plain, gzip) pages, rendering first when the held one is too old."""
        pages = self.cached()
        if pages is not None:
            return pages
        with self._rendering:
            with self._lock:  # another scraper may have rendered it while this one waited
                if self._pages is not None and time.monotonic() - self._at < self.max_age:
                    return self._pages
            return self._render()

    def cached(self) -> tuple[bytes, bytes] | None:
        """The page if it can be served without waiting for a rendering (else None)."""
        with self._lock:
            pages, age = self._pages, time.monotonic() - self._at
        if pages is not None and age < self.max_age:
            return pages
        if pages is not None and age < self.max_stale:
            self._refresh_in_background()
            return pages
        return None


def _response(pages: tuple[bytes, bytes], head: bytes) -> bytes:
    """The HTTP/1.0 answer to one request head: the page (gzipped when asked), or 404."""
    request, *lines = head.decode("latin-1").split("\r\n")
    method, path = (request.split() + ["", ""])[:2]
    if method not in ("GET", "HEAD") or path.split("?")[0] not in ("/", "/metrics"):
        return b"HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 38\r\n\r\nnot found: the metrics are at /metrics"
    packed = any(line.lower().startswith("accept-encoding:") and "gzip" in line for line in lines)
    body = pages[1] if packed else pages[0]
    encoding = "Content-Encoding: gzip\r\n" if packed else ""
    head_out = f"HTTP/1.0 200 OK\r\nContent-Type: {CONTENT_TYPE_LATEST}\r\nContent-Length: {len(body)}\r\n{encoding}Connection: close\r\n\r\n"
    return head_out.encode() + (body if method == "GET" else b"")


class _PageProtocol(asyncio.Protocol):
    """One scrape: read the request head, write the page, close."""

    def __init__(self, page: MetricsPage, loop: asyncio.AbstractEventLoop) -> None:
        self.page = page
        self.loop = loop
        self.buf = b""

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.timer = self.loop.call_later(10, transport.close)  # a client that never sends a request

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > 65536:
                self.transport.close()
            return
        self.timer.cancel()
        head = self.buf[:end]
        pages = self.page.cached()
        if pages is not None:
            self._answer(pages, head)
        else:
            render = self.loop.run_in_executor(None, self.page.render)
            render.add_done_callback(lambda done: self._answer(done.result(), head))

    def _answer(self, pages: tuple[bytes, bytes], head: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(_response(pages, head))
            self.transport.close()  # after the buffered answer is sent

    def connection_lost(self, exc) -> None:
        self.timer.cancel()


class _HttpServer:
    """A small asyncio HTTP/1.0 server for one page, in its own thread.

    Far cheaper per request than a thread per connection (socketserver's
    ThreadingMixIn, whose listen backlog of 5 also drops a burst of scrapers).
    """

    def __init__(self, page: MetricsPage, address: str, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self._server = self.loop.run_until_complete(self.loop.create_server(lambda: _PageProtocol(page, self.loop), address, port, backlog=512))
        except BaseException:
            self.loop.close()
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, name="gpurig-exporter", daemon=True)
        self.thread.start()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@dataclass
class Exporter:
    """A running exporter; ``close`` stops it."""

    address: str
    port: int
    _server: _HttpServer

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.close()


def serve(run: Run, address: str = "127.0.0.1", port: int = 9400, stale_after: float | None = None) -> Exporter:
    """Serve the Run's metrics over HTTP (port 0: any free port), in a background thread."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(run, stale_after))
    try:
        server = _HttpServer(MetricsPage(registry), address, port)
    except OSError as err:
        raise MonitorError(f"cannot listen on {address}:{port}: {err.strerror}", "choose another --prometheus port") from None
    return Exporter(address, server.port, server)
