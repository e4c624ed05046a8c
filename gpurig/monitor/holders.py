"""Since when each holder of each GPU has held it (a Slurm job, a container, a process in none), from the Run's samples.

A listener of the Run, as the idle tracker: one look at each sample as it
comes. A holder's time is the sample in which it first appeared, on the
samples' own clock. A holder already there in the first sample of a host,
or in the first after a gap in the samples (none for ``max_gap``), was
holding before anything seen: its time is that sample's and ``known`` is
False (it has held the GPU at least that long). A holder gone from a sample
is forgotten; coming back, it starts again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpurig.monitor.samples import GpuSample, Sample

MIN_GAP = 30.0  # seconds without a sample after which what held a GPU before is not taken to have held it throughout


def holder_keys(g: GpuSample) -> list[str]:
    """What holds ``g``, each once: ``job:ID`` for a Slurm job, ``container:ID`` for a container (its processes together),
    ``pid:PID:NAME`` for a process in no container."""
    keys = [f"job:{j.id}" for j in g.hpc_jobs]
    for p in g.processes:
        keys.append(f"container:{p.container}" if p.container else f"pid:{p.pid}:{p.name or ''}")
    return list(dict.fromkeys(keys))


@dataclass(frozen=True)
class Held:
    """Since when (the samples' clock) a holder has held a GPU; ``known`` False: it held it already when the samples began."""

    since: float
    known: bool


class HolderTracker:
    """host -> GPU label -> holder key -> Held, as of the host's latest sample."""

    def __init__(self, max_gap: float = MIN_GAP) -> None:
        self.max_gap = max_gap
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, dict[str, dict[str, Held]]] = {}

    def __call__(self, host: str, record: Mapping[str, Any], sample: Sample | None) -> None:
        if sample is None:
            return
        with self._lock:
            last = self._last.get(host)
            fresh = last is None or sample.t - last > self.max_gap  # the first sample, or the first after a gap
            before = {} if fresh else self._held.get(host, {})
            now: dict[str, dict[str, Held]] = {}
            for g in sample.gpus:
                had = before.get(g.label, {})
                now[g.label] = {k: had.get(k) or Held(sample.t, not fresh) for k in holder_keys(g)}
            self._held[host] = now
            self._last[host] = sample.t

    def of(self, host: str) -> dict[str, dict[str, Held]]:
        with self._lock:
            return {label: dict(held) for label, held in self._held.get(host, {}).items()}
