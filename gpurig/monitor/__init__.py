"""Monitoring: the sampler agent's records as data, and what gpurig makes of them.

model (records -> Sample), agent (run checks/gpu_sampler.py on hosts through
their connections and stream its records), session (the Run: samples of
every host in one place, with listeners), csvfile (nvidia-smi's columns),
exporter (Prometheus, dcgm-exporter names), record (a run on disk and back),
plot (PNG), diagnose (why the GPU is idle), idle (since when a held GPU has sat idle, as the
samples come), view (rich renderables).
"""

from gpurig.errors import GpurigError


class MonitorError(GpurigError):
    """A monitoring run that cannot start or a recorded run that cannot be read."""
