"""Since when each held GPU has sat idle: under 5% utilisation while a process or a Slurm job holds it, from the Run's samples.

A listener of the Run (``run.listeners.append(tracker)``), so it costs one
look at each sample as it comes, however long the run; what it says is what
the monitor's samples say, nothing read a second time. A MIG device is judged
on GPM's engine activity, as the diagnosis does; a GPU that reports neither
is never called idle.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gpurig.monitor.samples import GpuSample, Sample

IDLE_UTIL = 5.0  # % utilisation under which a held GPU counts as idle


def utilisation(g: GpuSample) -> float | None:
    """Utilisation in %, or a MIG device's GPM engine activity in its place; None where the GPU reports neither."""
    if g.util_gpu is not None:
        return g.util_gpu
    return None if g.gr_active is None else 100.0 * g.gr_active


class IdleTracker:
    """host -> GPU label -> the time its current idle streak began (only GPUs held and idle now)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, dict[str, float]] = {}

    def __call__(self, host: str, record: Mapping[str, Any], sample: Sample | None) -> None:
        if sample is None:
            return
        with self._lock:
            since = self._since.setdefault(host, {})
            for g in sample.gpus:
                util = utilisation(g)
                if (g.processes or g.hpc_jobs) and util is not None and util < IDLE_UTIL:
                    since.setdefault(g.label, sample.t)
                else:
                    since.pop(g.label, None)

    def of(self, host: str) -> dict[str, float]:
        """The held GPUs of ``host`` idle now, each with the time it went idle."""
        with self._lock:
            return dict(self._since.get(host, {}))
