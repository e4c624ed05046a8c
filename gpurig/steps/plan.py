"""The Step model: a step plans from facts (pure), then applies only what its plan says.

A ``Step`` compares a host's ``Facts`` with the wanted ``HostProfile`` and
returns a ``Plan``: the ``Change``s it would make (a line a human reads, the
command objects that make it, a unified diff for files), or why nothing is
needed (``ok``), or why the step does not apply (``skipped``), or why it
cannot proceed (``failed``, with the problem and the fix as two fields).
``apply`` runs a plan's commands (``gpurig.steps.commands``), each written
to be idempotent, as the host's administrator (``Connection.admin``).
Planning never touches the host, so every plan is tested from recorded
facts alone. Deploy plans its containers with the same model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile
from gpurig.results import HostResult, Outcome
from gpurig.status import Status, worst
from gpurig.steps.commands import Command, Upload, run_change


@dataclass(frozen=True)
class Change:
    """One thing a step changes: what a human reads, the commands that do it, and for a file its diff."""

    summary: str
    commands: tuple[Command, ...] = ()
    diff: str = ""
    fix: str = ""  # what to do when one of its commands fails (else the command error's own fix)
    settings: tuple[tuple[str, Any, Any], ...] = ()  # a container's settings that differ: (key, old, new)

    @property
    def written(self) -> Upload | None:
        """The file this change writes from text (daemon.json, an apt source), if any."""
        return next((c for c in self.commands if isinstance(c, Upload) and c.content is not None), None)

    @property
    def path(self) -> str | None:
        return self.written.remote if self.written else None

    @property
    def content(self) -> str | None:
        return self.written.content if self.written else None

    def for_report(self, diff: bool) -> Change:
        """The change as a report may keep it: no file content, and the diff only when asked."""
        commands = tuple(dataclasses.replace(c, content="") if c is self.written else c for c in self.commands)
        return dataclasses.replace(self, commands=commands, diff=self.diff if diff else "")

    def to_dict(self, diff: bool = False) -> dict[str, Any]:
        """The change for a report; the diff only when asked (a file may hold what a report should not)."""
        data: dict[str, Any] = {"summary": self.summary}
        if self.path:
            data["path"] = self.path
        if diff and self.diff:
            data["diff"] = self.diff
        return data


@dataclass(frozen=True)
class Plan:
    """What a step would do on one host; a failed plan says the problem (``reason``) and the ``fix`` apart."""

    status: Status
    reason: str = ""
    changes: tuple[Change, ...] = ()
    fix: str = ""

    @classmethod
    def ok(cls, reason: str) -> Plan:
        return cls(Status.OK, reason)

    @classmethod
    def skip(cls, reason: str) -> Plan:
        return cls(Status.SKIPPED, reason)

    @classmethod
    def fail(cls, problem: str, fix: str = "") -> Plan:
        return cls(Status.FAILED, problem, fix=fix)

    @classmethod
    def change(cls, reason: str, *changes: Change) -> Plan:
        return cls(Status.CHANGED, reason, tuple(changes))


@dataclass(frozen=True)
class StepResult:
    """How one step (or one deployed container) ended on one host.

    ``changes``: what it made, tried to make (failed) or would make (check
    mode). ``reason`` is the problem when it failed, ``fix`` what to do.
    ``details``: what a report says beside the changes (a container's image,
    the bytes moved to the host), already fit for JSON.
    """

    step: str
    status: Status
    reason: str = ""
    changes: tuple[Change, ...] = ()
    duration_s: float = 0.0
    fix: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.status.succeeded

    def to_dict(self, diff: bool = False) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "reason": self.reason,
            "fix": self.fix,
            "changes": [c.to_dict(diff) for c in self.changes],
            "duration_s": round(self.duration_s, 3),
        }


class Step:
    """A concern on a host (docker, daemon, driver...). Subclasses set ``name`` and write ``plan``.

    ``apply`` runs each change's commands in order (shell lines, uploads,
    calls); any GpurigError it raises makes the step ``failed`` with that
    error's problem and fix.
    """

    name: str = ""
    # One command's bound (a driver's DKMS build takes minutes); past it the command is killed on the host too.
    timeout_s: float = 1800.0

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        raise NotImplementedError

    def apply(self, conn: Connection, plan: Plan) -> None:
        for change in plan.changes:
            run_change(conn, change.summary, change.commands, fix=change.fix, timeout=self.timeout_s)


def outcome(results: Sequence[StepResult], failed: Callable[[StepResult], str]) -> Outcome:
    """The host's status from its results (failed, else changed, else ok), why the failed ones failed, the first fix."""
    bad = [r for r in results if r.status == Status.FAILED]
    return Outcome(status=worst(r.status for r in results), data=tuple(results),
                   detail="; ".join(failed(r) for r in bad), fix=next((r.fix for r in bad if r.fix), ""))


def host_results(r: HostResult) -> tuple[StepResult, ...]:
    return r.data if isinstance(r.data, tuple) else ()
