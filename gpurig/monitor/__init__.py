"""Monitoring: the sampler agent's records as data, and what gpurig makes of them.

model (records -> Sample), agent (run checks/gpu_sampler.py on a host and
stream its records), session (samples of every host in one place), csvfile,
exporter (Prometheus), record (a run on disk and back), plot, diagnose, view.
"""

from gpurig.errors import GpurigError


class MonitorError(GpurigError):
    """A monitoring run that cannot start or a recorded run that cannot be read."""
