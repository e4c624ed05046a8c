"""Running a task's work over the fleet: the validated shared flags, connections, the progress, the JSON report, the recap, the exit code.

``HostOptions`` is what the host flags (-i -l -f -v --check --diff --json
--format) come to once validated and layered over the config
(gpurig.cli.options makes it from a task's flags); ``run_hosts`` runs a
task's ``work`` over the chosen hosts with progress on a terminal, the JSON
report (also after Ctrl-C) and the recap; ``exit_for`` ends the task with the
run's exit code.
"""

from __future__ import annotations

import getpass
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpurig.errors import Finished, InventoryError
from gpurig.report import console, err_console, outside
from gpurig.report.tables import document, show

# The connection and fleet machinery (the SSH library among it) loads when a task body runs, not when its flags are read.
if TYPE_CHECKING:
    from gpurig.config import Settings
    from gpurig.connect.connection import Connection
    from gpurig.connect.connector import Connector
    from gpurig.connect.early import EarlyLogins
    from gpurig.inventory import Host
    from gpurig.report.tables import Column, Row
    from gpurig.results import FleetReport
    from gpurig.slurm.scheduler import Reach


@dataclass(frozen=True)
class HostOptions:
    """The shared flags of one run, validated and layered over the config."""

    settings: Settings
    limit: tuple[str, ...]  # patterns, intersected
    verbose: int = 0
    check: bool = False
    diff: bool = False
    json: str | None = None
    format: str = "table"
    ask_sudo_password: bool = False

    def show(self, columns: Sequence[Column], rows: Sequence[Row], *, title: str | None = None, doc: dict | None = None, schema: str = "") -> None:
        """The result on stdout in --format; nothing when --json - already put the report there."""
        if self.json == "-":
            return
        show(console, columns, rows, self.format, title=title, doc=doc, schema=schema)


def connect_early(opts: HostOptions, hosts: Sequence[Host]) -> Connector:
    """A connector already logging in to ``hosts``, for ``run_hosts(..., connector=)``: the task's own loading runs
    during the round trips.

    For the commands people type all day, once every local check has passed
    (nothing reaches a host for a run that is refused here). The TCP connects
    go out before the connection code is imported.
    """
    from gpurig.connect.early import SPREAD_MIN, EarlyLogins
    from gpurig.connect.target import USER_SSH_CONFIG

    if len(hosts) >= SPREAD_MIN:  # a bigger run may fork workers, which must not inherit login threads (its head start is nothing)
        return make_connector(opts)
    early = EarlyLogins()
    early.dial(hosts, opts.settings.forks, opts.settings.connect_timeout, USER_SSH_CONFIG.expanduser())
    connector = make_connector(opts, early)
    connector.start_early(hosts, opts.settings.forks)
    return connector


def make_connector(opts: HostOptions, early: EarlyLogins | None = None) -> Connector:
    """Connections made as the settings say; the project's known_hosts where the config puts it."""
    from gpurig.connect.connector import Connector
    from gpurig.connect.ssh import SSHSettings

    s = opts.settings
    if s.host_key_policy == "off":
        err_console.print(
            "[bold red]WARNING: host key checking is OFF. Any machine that answers for these hosts "
            "will be trusted; use this only on a network you control.[/]"
        )
    ssh = SSHSettings(connect_timeout=s.connect_timeout, host_key_policy=s.host_key_policy, project_known_hosts=s.known_hosts)
    password = (lambda: getpass.getpass("sudo password: ")) if opts.ask_sudo_password else None
    return Connector(ssh, sudo_password=password, early=early)


def select_hosts(opts: HostOptions, connects: bool = True) -> list[Host]:
    """The inventory's hosts that match every --limit/--host/--group/--pattern given (each narrows); all if none.

    Their gpurig_* vars are validated here, before any task contacts a host; for a task that ``connects``, so is
    their ansible_connection (one host of winrm or docker does not stop a task that leaves it out).
    """
    from gpurig.inventory import load_inventory
    from gpurig.inventory.hostvars import connection_problem
    from gpurig.inventory.profile import host_profile

    chosen = load_inventory(opts.settings.inventory).select(*opts.limit)
    if not chosen:
        raise InventoryError(
            f"the selection {' & '.join(opts.limit)} matches no host in {opts.settings.inventory}",
            "check the patterns with 'gpurig hosts -l PATTERN'",
        )
    for host in chosen if connects else ():
        problem = connection_problem(host.connection)
        if problem:
            raise InventoryError(f"{opts.settings.inventory}: host {host.name}: {problem[0]}", problem[1].replace("HOST", host.name))
    for host in chosen:  # every gpurig_* var checked whatever the task: a typo deploy would refuse stops provision too
        profile = host_profile(host, opts.settings.inventory)
        if "gpurig_containers" in host.vars:  # deploy's container rules load only where a host has containers
            from gpurig.deploy.containers import check_containers

            check_containers(host, opts.settings.inventory, profile)
    return chosen


def slurm_reach(opts: HostOptions) -> Reach:
    """How the Slurm library reaches the inventory's cluster under these flags (connections, forks)."""
    from gpurig.slurm.scheduler import Reach

    return Reach(lambda: make_connector(opts), opts.settings.forks)


def follow_hint(job: str) -> str:
    """How a person follows a job gpurig no longer follows, and how they stop it."""
    return f"follow it with gpurig logs --job {job} --follow; stop it with gpurig cancel {job}"


# a pending job's reasons that say only that its scheduler has not looked at it yet (gpurig's agent, Slurm): no line for them
NOT_YET_WAITING = ("", "starting", "None")


class WaitLines:
    """``run --wait`` and ``logs --follow`` on a job that stays pending: one line on stderr when it starts waiting, saying why
    (its place in the queue, the GPUs it waits for, Slurm's reason), one more each time why changes, and one when it stops waiting.

    Called as ``on_wait(state, reason)`` from the thread that follows the job; a reason told again is not printed again, so a log
    that is no terminal gets at most a line per change.
    """

    def __init__(self, job: str, clock=None) -> None:
        import time

        self.job = job
        self.clock = clock or time.monotonic
        self.shown = ""
        self.since = 0.0

    def __call__(self, state: str, reason: str) -> None:
        if state == "pending":
            if reason in NOT_YET_WAITING or reason == self.shown:
                return
            self.since = self.since if self.shown else self.clock()
            self.shown = reason
            err_console.print(f"job {outside(self.job)} is pending: {outside(reason)}", highlight=False, soft_wrap=True)
        elif self.shown:
            self.shown = ""
            err_console.print(f"job {outside(self.job)} is {outside(state or 'no longer pending')} "
                              f"(it waited {self.clock() - self.since:.0f}s)", highlight=False, soft_wrap=True)


def interrupted(stop: KeyboardInterrupt, said: str) -> Finished:
    """The one line that ends a task a signal stopped, saying what became of its job; exit 130 after Ctrl-C, 143 after SIGTERM."""
    from gpurig.results import SIGINT_EXIT

    code = int(getattr(stop, "exit_code", SIGINT_EXIT))
    return Finished(code, f"gpurig: {'terminated (SIGTERM)' if code == 128 + signal.SIGTERM else 'interrupted'}; {said}")


def run_hosts(
    opts: HostOptions,
    hosts: Sequence[Host],
    work: Callable[[Connection], Any],
    *,
    label: str,
    schema: str,
    annotate: Callable[[FleetReport], dict[str, Any]] | None = None,
    finished: bool = True,
    connector: Connector | None = None,
    spread: bool = False,
    interrupt_recap: bool = True,
) -> FleetReport:
    """``work`` over ``hosts`` with progress on a terminal, the JSON report if asked (also after Ctrl-C), and the recap.

    ``annotate(report)`` adds top-level keys to the JSON report (e.g. each host's verdict). ``finished=False``:
    more work follows (provision's cluster phase), so the report and the recap wait for ``finish``. ``connector``:
    ``connect_early``'s, whose logins are under way (closed here, as one made here is). ``spread``: ``work`` keeps
    nothing across hosts and returns picklable data, so a run over hundreds of hosts may use a worker process per core.
    ``interrupt_recap=False``: after Ctrl-C the task says itself, in one line, what became of its work (a job it follows).
    """
    from gpurig.connect.fleet import run_fleet
    from gpurig.connect.spread import worker_count
    from gpurig.report.fleetrun import FleetProgress, PlainProgress, print_recap
    from gpurig.results import FleetInterrupted

    connector = connector or make_connector(opts)
    events = FleetProgress(err_console) if err_console.is_terminal else PlainProgress(err_console, progress_every())
    try:
        report = run_fleet(hosts, work, connector=connector, forks=opts.settings.forks, events=events, label=label,
                           workers=worker_count(len(hosts)) if spread else 1)
    except FleetInterrupted as stop:
        write_json_report(opts, stop.report, schema, annotate)
        if interrupt_recap:
            print_recap(stop.report, err_console)
        raise
    finally:
        connector.close()
    if finished:
        finish(opts, report, schema, annotate)
    return report


def progress_every() -> float:
    """Seconds between the plain progress lines of a run whose output is no terminal: $GPURIG_PROGRESS_EVERY, else 30."""
    try:
        every = float(os.environ.get("GPURIG_PROGRESS_EVERY", "30"))
    except ValueError:
        return 30.0
    return every if every > 0 else 30.0


def finish(opts: HostOptions, report: FleetReport, schema: str, annotate: Callable[[FleetReport], dict[str, Any]] | None = None) -> None:
    """The JSON report if asked, and the recap."""
    from gpurig.report.fleetrun import print_recap

    write_json_report(opts, report, schema, annotate)
    print_recap(report, err_console)


def fleet_document(opts: HostOptions, report: FleetReport, schema: str, **extra: Any) -> dict[str, Any]:
    """A fleet report as JSON: schema, gpurig's version, the inventory, check mode, then every host."""
    return document(schema, {**report.to_dict(), **extra}, inventory=str(opts.settings.inventory), check=opts.check)


def write_json_report(opts: HostOptions, report: FleetReport, schema: str, annotate=None) -> None:
    """The JSON report where --json asks for one (written again when a task learns more after the run, as run after a cancel)."""
    if opts.json:
        from gpurig.files import write_report
        from gpurig.results import jsonable

        extra = annotate(report) if annotate else {}
        write_report(opts.json, fleet_document(opts, report, schema, **extra), default=jsonable)


def exit_for(report: FleetReport) -> None:
    """Exit non-zero when any host did not succeed (1), or after Ctrl-C (130)."""
    if report.exit_code:
        raise Finished(report.exit_code)
