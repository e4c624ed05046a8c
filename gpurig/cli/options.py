"""The flags every host task shares (Ansible's -i -l -f -v --check --diff --json), validated into HostOptions.

A task module writes::

    @host_task(help={"variant": "..."}, changes=True)
    def deploy(c, opts: HostOptions, variant=None):
        from gpurig.flows.fleettask import exit_for, fleet_document, run_hosts

        report = run_hosts(opts, select_hosts(opts), work, label="deploy", schema="gpurig.deploy/1")
        opts.show(columns, rows, doc=fleet_document(opts, report, "gpurig.deploy/1"))
        exit_for(report)

and gets ``-i/--inventory``, ``-l/--limit`` (with ``--host``/``--group``/
``--pattern`` as narrowing aliases), ``-f/--forks``, ``--connect-timeout``,
``--host-key-policy``, ``--ask-sudo-password``, ``-v/-vv``, ``--json F``,
``--format``, and with ``changes=True`` ``--check``/``--diff`` (Invoke's
``--dry`` means ``--check``). Values are layered over gpurig's config
(gpurig/config.py) and validated before the task body runs. The run over
the fleet itself (connections, progress, the JSON report, the recap) is
library code: gpurig.flows.fleettask.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from invoke.exceptions import Exit

from gpurig.cli.base import dry_run, task
from gpurig.config import choice, settings
from gpurig.errors import ConfigError
from gpurig.report import err_console, outside
from gpurig.report.tables import FORMATS
from gpurig.strict import validate

# The connection and fleet machinery (the SSH library among it) loads when a task body runs, not when its flags are read.
if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions
    from gpurig.inventory import Host
    from gpurig.jobs.views import JobView
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
    "verbose": "say more, repeated for more: -v gpurig's steps, -vv debug with the SSH library's log and tracebacks",
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


def host_options(c, **flags: Any) -> HostOptions:
    """HostOptions from the flags a host task received (a flag left at None falls back to the config)."""
    from gpurig.flows.fleettask import HostOptions

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
    """The selected hosts, validated (gpurig.flows.fleettask.select_hosts, loaded when a task body runs)."""
    from gpurig.flows.fleettask import select_hosts as select

    return select(opts, connects)


def container_names(name: str | None) -> list[str]:
    """The container names of a NAME[,NAME] flag, each by Docker's grammar (one line before any host is contacted)."""
    names = [n.strip() for n in (name or "").split(",") if n.strip()]
    for one in names:
        rule = validate.container_name_problem(one)
        if rule:
            raise ConfigError(f"container {validate.excerpt(one)} {rule}", "name containers as `gpurig status` shows them")
    return names


def slurm_reach(opts: HostOptions) -> Reach:
    """How the Slurm library reaches the inventory's cluster (gpurig.flows.fleettask.slurm_reach, loaded when a task body runs)."""
    from gpurig.flows.fleettask import slurm_reach as reach

    return reach(opts)


def to_stdout(data: bytes) -> None:
    """A job's log as it comes, byte for byte."""
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def exit_with_job(view: JobView) -> None:
    """How a Slurm job ended, on stderr; exit with its code."""
    err_console.print(f"slurm job {view.id}: {outside(view.state_text)}, exit code {view.exit_status}", highlight=False)
    if view.exit_status:
        raise Exit(code=view.exit_status)


