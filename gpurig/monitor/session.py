"""Everything a monitoring run saw, host by host: the agent's hello, its notes and the samples, thread-safe."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpurig.monitor.samples import Sample, sample_from_record

# Samples kept in memory per host for the summary and the diagnosis: a day at 1/s.
HISTORY = 86_400

RecordListener = Callable[[str, Mapping[str, Any], "Sample | None"], None]


@dataclass
class HostState:
    """What one host's agent said about itself, and its samples in time order."""

    hello: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    samples: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    malformed: int = 0

    @property
    def source(self) -> str:
        return self.hello.get("source", "?")

    @property
    def user(self) -> str | None:
        return self.hello.get("user")


class Run:
    """Records from any number of hosts, fed by their reader threads; listeners see each one as it comes."""

    def __init__(self, listeners: tuple[RecordListener, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._hosts: dict[str, HostState] = {}
        self.listeners = list(listeners)

    def add(self, host: str, record: Mapping[str, Any]) -> Sample | None:
        """Take one agent record; returns the Sample it carried, if any. A malformed record is counted, not raised."""
        kind = record.get("type")
        sample = None
        with self._lock:
            state = self._hosts.setdefault(host, HostState())
            if kind == "hello":
                state.hello = dict(record)
            elif kind == "note":
                message = str(record.get("message", ""))
                if message not in state.notes:  # an agent restarted for the next chunk says it again
                    state.notes.append(message)
            elif kind == "sample":
                try:
                    sample = sample_from_record(host, record)
                except (KeyError, TypeError, ValueError, AttributeError):
                    state.malformed += 1
                    return None
                state.samples.append(sample)
        for listen in self.listeners:
            listen(host, record, sample)
        return sample

    def hosts(self) -> list[str]:
        with self._lock:
            return sorted(self._hosts)

    def state(self, host: str) -> HostState:
        with self._lock:
            return self._hosts.setdefault(host, HostState())

    def series(self, host: str) -> list[Sample]:
        with self._lock:
            state = self._hosts.get(host)
            return list(state.samples) if state else []

    def recent(self, host: str, after: float | None = None, limit: int | None = None) -> list[Sample]:
        """A host's newest samples, oldest first: those later than ``after``, at most ``limit`` of them; read from the end, so a
        reader that asks each second for what is new (the dashboard) costs what is new, not the day kept in memory."""
        out: list[Sample] = []
        with self._lock:
            state = self._hosts.get(host)
            for sample in reversed(state.samples) if state else ():
                if (after is not None and sample.t <= after) or (limit is not None and len(out) >= limit):
                    break
                out.append(sample)
        out.reverse()
        return out

    def latest(self) -> dict[str, Sample]:
        """The newest sample of every host that has one."""
        with self._lock:
            return {h: s.samples[-1] for h, s in self._hosts.items() if s.samples}
