"""What a run over hosts produced: each host's result, the run's report, and the events a display follows.

Below both the fleet that fills them (connect/) and the reports that print
them (report/), so printing a table needs no transport.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpurig.files import write_report
from gpurig.status import Status

SIGINT_EXIT = 130  # 128 + SIGINT; an interrupt that carries its own ``exit_code`` (SIGTERM's 143) uses that


@dataclass(frozen=True)
class Outcome:
    """What a host function may return to say more than ``ok``: changed, or an explicit status with its data.

    ``status`` wins over ``changed``; a ``failed`` outcome keeps its data
    (e.g. a command's output) where raising would lose it. ``detail`` says
    why, ``fix`` what to do about it.
    """

    changed: bool = False
    data: Any = None
    detail: str = ""
    status: Status | None = None
    fix: str = ""

    @property
    def resolved(self) -> Status:
        return self.status or (Status.CHANGED if self.changed else Status.OK)


class FleetEvents:
    """What a fleet run reports as it goes; the CLI passes a display, library callers nothing. Methods may be called from worker threads."""

    def start(self, total: int, label: str) -> None:
        """Before the first host starts."""

    def state(self, host: str, state: str) -> None:
        """A host moved to ``connecting`` or ``running``."""

    def finished(self, result: HostResult) -> None:
        """A host's final result."""

    def stop(self) -> None:
        """After the last host (or Ctrl-C)."""


@dataclass(frozen=True)
class HostResult:
    """One host's end state in a fleet run."""

    host: str
    status: Status
    reason: str = ""  # the problem, for a host that did not succeed
    data: Any = None
    duration_s: float = 0.0
    fix: str = ""  # what to do about it

    @property
    def succeeded(self) -> bool:
        return self.status.succeeded


@dataclass(frozen=True)
class FleetReport:
    """Every host's result, in inventory order, with a summary and an exit code."""

    results: tuple[HostResult, ...]
    started: str
    duration_s: float
    interrupted: bool = False
    summary: dict[str, int] = field(default_factory=dict)
    stop_code: int = 0  # the exit code the signal that interrupted the run asks for (130 Ctrl-C, 143 SIGTERM)

    @property
    def failed(self) -> bool:
        return self.interrupted or any(not r.succeeded for r in self.results)

    @property
    def exit_code(self) -> int:
        """0 when every host is ok, changed or skipped, 130 after Ctrl-C (143 after SIGTERM), 1 otherwise."""
        if self.interrupted:
            return self.stop_code or SIGINT_EXIT
        return 1 if self.failed else 0

    def by_host(self) -> dict[str, HostResult]:
        return {r.host: r for r in self.results}

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
            "interrupted": self.interrupted,
            "summary": self.summary,
            "hosts": [
                {f.name: getattr(r, f.name) for f in dataclasses.fields(r)} | {"data": _data(r.data), "duration_s": round(r.duration_s, 3)}
                for r in self.results
            ],
        }

    def write_json(self, path: str | Path) -> None:
        """Write the report atomically: readers see the old file or the whole new one."""
        write_report(path, self.to_dict(), default=jsonable)


class FleetInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a fleet run; carries the partial report (already written to disk if asked) and its exit code."""

    def __init__(self, report: FleetReport) -> None:
        super().__init__("interrupted")
        self.report = report
        self.exit_code = report.exit_code


def _data(value: Any) -> Any:
    """A host's data for a report: its own ``to_dict`` where it has one (it decides what may be shown)."""
    return value.to_dict() if hasattr(value, "to_dict") and not isinstance(value, type) else value


def jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)
