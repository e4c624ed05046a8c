"""How a piece of work ended, in one vocabulary for steps, deploy's containers, the fleet's hosts and every report.

``Status`` is a ``str`` enum: JSON reports and tables show its value
(``"ok"``, ``"changed"``...), which users' scripts read, so the values
never change.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    UNREACHABLE = "unreachable"  # a host gpurig could not connect to (the fleet only)
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:  # the value's hash, so a member and its string find the same dict entry
        return str.__hash__(self)

    @property
    def succeeded(self) -> bool:
        """ok, changed and skipped are successes (exit 0); failed and unreachable are not."""
        return self not in (Status.FAILED, Status.UNREACHABLE)


def worst(statuses) -> Status:
    """One status for many (a host's steps or containers): failed if any failed, else changed if any changed, else ok."""
    found = set(statuses)
    for status in (Status.FAILED, Status.UNREACHABLE, Status.CHANGED):
        if status in found:
            return status
    return Status.OK


# The colour each status has in tables and recaps, keyed by the status's string value (Status is a str): they look
# cells up by their text. Here rather than in gpurig.report, so that a task module's column definitions need no rich.
STATUS_STYLE: dict[str, str] = {Status.OK: "green", Status.CHANGED: "yellow", Status.FAILED: "red", Status.UNREACHABLE: "magenta", Status.SKIPPED: "cyan"}
