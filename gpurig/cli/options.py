"""The flags every host task shares (Ansible's -i -l -f -v --check --diff --json), and running a task over the fleet.

A task module writes::

    @host_task(help={"variant": "..."}, changes=True)
    def deploy(c, opts: HostOptions, variant=None):
        report = run_hosts(opts, select_hosts(opts), work, label="deploy", schema="gpurig.deploy/1")
        opts.show(columns, rows, doc=fleet_document(opts, report, "gpurig.deploy/1"))
        exit_for(report)

and gets ``-i/--inventory``, ``-l/--limit`` (with ``--host``/``--group``/
``--pattern`` as narrowing aliases), ``-f/--forks``, ``--connect-timeout``,
``--host-key-policy``, ``--ask-sudo-password``, ``-v/-vv``, ``--json F``,
``--format``, and with ``changes=True`` ``--check``/``--diff`` (Invoke's
``--dry`` means ``--check``). Values are layered over gpurig's config
(gpurig/config.py) and validated before the task body runs.
"""

from __future__ import annotations

import functools
import getpass
import inspect
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from invoke.exceptions import Exit

from gpurig.cli.base import dry_run, task
from gpurig.config import choice, settings
from gpurig.errors import ConfigError, InventoryError
from gpurig.report import console, err_console, outside
from gpurig.report.tables import FORMATS, document, show
from gpurig.strict import validate

# The connection and fleet machinery (paramiko among it) loads when a task body runs, not when its flags are read.
if TYPE_CHECKING:
    from gpurig.config import Settings
    from gpurig.connect.connection import Connection
    from gpurig.connect.connector import Connector
    from gpurig.connect.early import EarlyLogins
    from gpurig.inventory import Host
    from gpurig.jobs.views import JobView
    from gpurig.report.tables import Column, Row
    from gpurig.results import FleetReport
    from gpurig.slurm.scheduler import Reach

SELECT_HELP = {
    "inventory": "inventory file, YAML or INI (default: inventory in gpurig.yaml / $GPURIG_INVENTORY, else inventory/hosts.yaml)",
    "limit": "narrow the run to an Ansible host pattern, e.g. 'gpu:!a100-01' or 'a100-*' (repeatable: each narrows)",
    "host": "narrow to these hosts: names or patterns, comma-separated (same as --limit)",
    "group": "narrow to these inventory groups, comma-separated",
    "pattern": "same as --limit",
}
CONNECT_HELP = {
    "forks": "how many hosts at once (default: forks in gpurig.yaml / $GPURIG_FORKS, else 64)",
    "connect_timeout": "seconds to wait for a host to answer (default 10)",
    "host_key_policy": "strict | accept-new (default) | off: what to do with unknown host keys",
    "ask_sudo_password": "prompt once for the sudo password (else $GPURIG_SUDO_PASSWORD)",
}
OUTPUT_HELP = {
    "verbose": "say more, repeated for more: -v gpurig's steps, -vv debug with paramiko's log and tracebacks",
    "json": "also write a JSON report to this file (- = stdout)",
    "format": "table (default) | tsv | json: how to print the result",
}
CHANGE_HELP = {
    "check": "only say what would change; change nothing (--dry means the same)",
    "diff": "show the difference each change makes (files as unified diffs)",
}

_SELECT = ("inventory", "limit", "host", "group", "pattern")
_CONNECT = ("forks", "connect_timeout", "host_key_policy", "ask_sudo_password")
_OUTPUT = ("verbose", "json", "format")
_CHANGE = ("check", "diff")
_DEFAULTS = {"ask_sudo_password": False, "verbose": 0, "check": False, "diff": False}


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


def host_options(c, **flags: Any) -> HostOptions:
    """HostOptions from the flags a host task received (a flag left at None falls back to the config)."""
    layered = settings(
        c.config,
        inventory=flags.get("inventory"),
        forks=flags.get("forks"),
        connect_timeout=flags.get("connect_timeout"),
        host_key_policy=flags.get("host_key_policy"),
    )
    limit = tuple(p for p in (*(flags.get("limit") or ()), flags.get("pattern"), flags.get("host"), flags.get("group")) if p)
    return HostOptions(
        settings=layered,
        limit=limit,
        verbose=int(flags.get("verbose") or 0),
        check=bool(flags.get("check")) or dry_run(c),
        diff=bool(flags.get("diff")),
        json=flags.get("json") or None,
        format=choice(flags.get("format") or "table", FORMATS, "--format"),
        ask_sudo_password=bool(flags.get("ask_sudo_password")),
    )


def host_task(help: dict[str, str] | None = None, *, connect: bool = True, changes: bool = False, **task_kwargs: Any):
    """``@task`` for a host task: adds the shared flags and calls ``fn(c, opts, **own_flags)``."""
    shared = _SELECT + (_CONNECT if connect else ()) + _OUTPUT + (_CHANGE if changes else ())
    helps = {**SELECT_HELP, **CONNECT_HELP, **OUTPUT_HELP, **CHANGE_HELP}

    def decorate(fn: Callable) -> Any:
        own = list(inspect.signature(fn).parameters.values())
        context, own = own[0], own[2:]  # (c, opts, *own flags)
        extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=_DEFAULTS.get(n)) for n in shared]
        signature = inspect.Signature([context, *[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own], *extra])

        @functools.wraps(fn)
        def wrapper(c, **kw):
            common = {n: kw.pop(n) for n in shared if n in kw}
            return fn(c, host_options(c, **common), **kw)

        # inspect.signature (and so Invoke) reads __signature__, which typeshed's functools._Wrapped does not declare.
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        merged_help = {**{n: helps[n] for n in shared}, **(help or {})}
        incrementable = [*task_kwargs.pop("incrementable", ()), "verbose"]
        iterable = [*task_kwargs.pop("iterable", ()), "limit"]
        return task(help=merged_help, auto_shortflags=False, incrementable=incrementable, iterable=iterable, **task_kwargs)(wrapper)

    return decorate


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


def container_names(name: str | None) -> list[str]:
    """The container names of a NAME[,NAME] flag, each by Docker's grammar (one line before any host is contacted)."""
    names = [n.strip() for n in (name or "").split(",") if n.strip()]
    for one in names:
        rule = validate.container_name_problem(one)
        if rule:
            raise ConfigError(f"container {validate.excerpt(one)} {rule}", "name containers as `gpurig status` shows them")
    return names


def slurm_reach(opts: HostOptions) -> Reach:
    """How the Slurm library reaches the inventory's cluster under these flags (connections, forks)."""
    from gpurig.slurm.scheduler import Reach

    return Reach(lambda: make_connector(opts), opts.settings.forks)


def to_stdout(data: bytes) -> None:
    """A job's log as it comes, byte for byte."""
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def exit_with_job(view: JobView) -> None:
    """How a Slurm job ended, on stderr; exit with its code."""
    err_console.print(f"slurm job {view.id}: {outside(view.state_text)}, exit code {view.exit_status}", highlight=False)
    if view.exit_status:
        raise Exit(code=view.exit_status)


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


def interrupted(stop: KeyboardInterrupt, said: str) -> Exit:
    """The one line that ends a task a signal stopped, saying what became of its job; exit 130 after Ctrl-C, 143 after SIGTERM."""
    from gpurig.results import SIGINT_EXIT

    code = int(getattr(stop, "exit_code", SIGINT_EXIT))
    return Exit(f"gpurig: {'terminated (SIGTERM)' if code == 128 + signal.SIGTERM else 'interrupted'}; {said}", code=code)


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
        raise Exit(code=report.exit_code)

