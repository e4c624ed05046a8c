"""The Step model: a step plans from facts (pure), then applies only what its plan says.

A ``Step`` compares a host's ``Facts`` with the wanted ``HostProfile`` and
returns a ``Plan``: the ``Change``s it would make (a line a human reads, the
shell commands that make it, a unified diff for files), or why nothing is
needed (``ok``), or why the step does not apply (``skipped``), or why it
cannot proceed (``failed``). ``apply`` runs a plan's commands, each written
to be idempotent, as the host's administrator (``Connection.admin``). Planning never
touches the host, so every plan is tested from recorded facts alone.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from gpurig.connect.connection import CommandError, CommandTimeout, Connection, ConnectionLost
from gpurig.errors import GpurigError, HostError, permission_denied
from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile

STEP_STATUSES = ("ok", "changed", "skipped", "failed")


@dataclass(frozen=True)
class Change:
    """One thing a step changes: what a human reads, the commands that do it, and for a file its diff and new content."""

    summary: str
    commands: tuple[str, ...] = ()
    diff: str = ""
    path: str | None = None
    content: str | None = field(default=None, repr=False)
    fix: str = ""  # what to do when one of its commands fails (else the command error's own fix)
    uploads: tuple[tuple[str, str], ...] = ()  # (local file, path on the host) put over SSH before the commands

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
    """What a step would do on one host: status is ok | changed | skipped | failed, as in ``StepResult``."""

    status: str
    reason: str = ""
    changes: tuple[Change, ...] = ()

    @classmethod
    def ok(cls, reason: str) -> Plan:
        return cls("ok", reason)

    @classmethod
    def skip(cls, reason: str) -> Plan:
        return cls("skipped", reason)

    @classmethod
    def fail(cls, reason: str) -> Plan:
        return cls("failed", reason)

    @classmethod
    def change(cls, reason: str, *changes: Change) -> Plan:
        return cls("changed", reason, tuple(changes))


@dataclass(frozen=True)
class StepResult:
    """How one step ended on one host. ``changes``: what it made, tried to make (failed) or would make (check mode)."""

    step: str
    status: str  # one of STEP_STATUSES
    reason: str = ""
    changes: tuple[Change, ...] = ()
    duration_s: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.status != "failed"

    def to_dict(self, diff: bool = False) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "reason": self.reason,
            "changes": [c.to_dict(diff) for c in self.changes],
            "duration_s": round(self.duration_s, 3),
        }


class Step:
    """A concern on a host (docker, daemon, driver...). Subclasses set ``name`` and write ``plan``.

    ``apply`` runs each change's commands in order; a step whose changes need
    more than commands (a wait, a reboot) overrides it. Any GpurigError it
    raises (a failed command) makes the step ``failed`` with that message.
    """

    name: str = ""
    # One command's bound (a driver's DKMS build takes minutes); past it the command is killed on the host too.
    timeout_s: float = 1800.0

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        raise NotImplementedError

    def apply(self, conn: Connection, plan: Plan) -> None:
        for change in plan.changes:
            folders = sorted({remote.rsplit("/", 1)[0] for _, remote in change.uploads})
            try:
                self._upload(conn, change, folders)
                self._run_commands(conn, change)
            finally:
                for folder in folders:  # on failure too: nothing of ours stays in /tmp
                    try:
                        conn.run(["rm", "-rf", "--", folder], warn=True)
                    except GpurigError:
                        pass

    @staticmethod
    def _upload(conn: Connection, change: Change, folders: list[str]) -> None:
        for folder in folders:
            # A fresh 0700 folder of the login user's, never one found there: in a shared /tmp another user could
            # have made it first and swap a .deb that root then installs. mkdir without -p fails on anything there.
            conn.run(f"rm -rf -- {shlex.quote(folder)} 2>/dev/null; mkdir -m 0700 -- {shlex.quote(folder)}")
        for local, remote in change.uploads:
            conn.put(local, remote)

    def _run_commands(self, conn: Connection, change: Change) -> None:
        for command in change.commands:
            try:
                conn.admin(command, timeout=self.timeout_s)
            except CommandError as err:
                # The command line itself (a script, file content) means nothing to a reader: its last words do.
                said = (err.result.stderr.strip() or err.result.stdout.strip()).splitlines()
                why = f"exited {err.result.exited}" + (f": {said[-1][:300]}" if said else "")
                fix = change.fix or err.fix
                if permission_denied(why) and not conn.become:
                    fix = "set ansible_become: true for this host (the login user is not root)"
                raise HostError(f"could not {change.summary}: {why}", fix) from None
            except CommandTimeout:
                raise HostError(f"could not {change.summary}: no end within {self.timeout_s:.0f} s; it was stopped on the host",
                                "look at the host (a hung apt or DKMS build?) and run again") from None
            except ConnectionLost:
                raise HostError(f"could not {change.summary}: the connection to the host was lost mid-command",
                                "check that the host is up; run again and the steps pick up where this one stopped") from None
