"""The ``provision`` task: converge hosts to their inventory profile, step by step (for now: the daemon step).

Thin on purpose: select hosts, validate every host's profile before any
connection, run ``gpurig.steps.converge`` over the fleet, then present a
per-host per-step table, the diffs when asked, and an Ansible-style recap.
"""

from __future__ import annotations

from invoke.exceptions import Exit
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpurig.cli.base import task
from gpurig.cli.hosts import _CONNECT_HELP, _SELECT_HELP, inventory_path, make_connector, select_hosts
from gpurig.connection import Connection
from gpurig.files import write_report
from gpurig.fleet import FleetReport, HostResult, Outcome, run_fleet
from gpurig.profile import host_profile
from gpurig.report import console, err_console
from gpurig.steps import STEP_STATUSES, STEPS, StepResult, converge

__all__ = ["provision"]

REPORT_SCHEMA = "gpurig.provision/1"
_STYLE = {"ok": "green", "changed": "yellow", "skipped": "cyan", "failed": "red", "unreachable": "magenta"}


@task(
    help={
        **_SELECT_HELP,
        **_CONNECT_HELP,
        "check": "plan only: say what would change, change nothing",
        "diff": "show the unified diff of every file a step changes (or would change, with --check)",
        "json": "also write the results as a JSON report to this file (- for stdout)",
    },
    auto_shortflags=False,
)
def provision(
    c,
    host=None,
    group=None,
    pattern=None,
    inventory=None,
    check=False,
    diff=False,
    json=None,
    forks=0,
    host_key_policy="accept-new",
    connect_timeout=10,
    ask_sudo_password=False,
):
    """Bring hosts to the state their inventory vars ask for (today: gpurig_daemon into /etc/docker/daemon.json)."""
    chosen = select_hosts(c, host, group, pattern, inventory)
    path = inventory_path(c, inventory)
    profiles = {h.name: host_profile(h, path) for h in chosen}  # every error before any host is touched
    steps = [cls() for cls in STEPS.values()]

    def work(conn: Connection) -> Outcome:
        results = converge(conn, steps, profiles[conn.host.name], check=check, diff=diff)
        failed = [f"step {r.step} failed" for r in results if r.status == "failed"]
        return Outcome(changed=any(r.status == "changed" for r in results), data=tuple(results), detail="; ".join(failed))

    connector = make_connector(host_key_policy, float(connect_timeout), ask_sudo_password, path)
    try:
        report = run_fleet(chosen, work, connector=connector, forks=int(forks) or None, label="provision")
    finally:
        connector.close()
    out = err_console if json == "-" else console  # stdout carries the JSON then
    out.print(steps_table(report))
    if diff:
        print_diffs(report, out)
    print_recap(report, out)
    if json:
        write_report(json, report_dict(report, check, diff, str(path)))
    if not converged(report):
        raise Exit(code=1)


def host_steps(r: HostResult) -> tuple[StepResult, ...]:
    return r.data if isinstance(r.data, tuple) else ()


def host_status(r: HostResult) -> str:
    """The host's state: unreachable/failed from the fleet, else failed if a step failed, changed if one changed."""
    statuses = {s.status for s in host_steps(r)}
    if not r.succeeded:
        return r.status
    return "failed" if "failed" in statuses else "changed" if "changed" in statuses else "ok"


def converged(report: FleetReport) -> bool:
    return not report.interrupted and all(host_status(r) in ("ok", "changed") for r in report.results)


def steps_table(report: FleetReport) -> Table:
    table = Table("host", "step", "status", "reason")
    table.columns[3].overflow = "fold"
    for r in report.results:
        results = host_steps(r)
        if not results:
            table.add_row(r.host, "-", f"[{_STYLE[r.status]}]{r.status}[/]", escape(r.reason))
        for s in results:
            lines = [s.reason, *(f"- {c.summary}" for c in s.changes)]
            table.add_row(r.host, s.step, f"[{_STYLE[s.status]}]{s.status}[/]", escape("\n".join(lines)))
    return table


def print_diffs(report: FleetReport, out: Console) -> None:
    for r in report.results:
        for s in host_steps(r):
            for change in s.changes:
                if change.diff:
                    out.print(f"[bold]{r.host} {s.step}: {escape(change.summary)}[/]")
                    for line in change.diff.splitlines():
                        style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
                        out.print(f"[{style}]{escape(line)}[/]" if style else escape(line), soft_wrap=True)


def recap(r: HostResult) -> dict[str, int]:
    """Ansible's recap counts for one host: steps by status, and unreachable."""
    counts = {s: sum(1 for x in host_steps(r) if x.status == s) for s in STEP_STATUSES}
    counts["unreachable"] = int(r.status == "unreachable")
    if r.status == "failed" and not host_steps(r):
        counts["failed"] = 1  # the host failed before any step ran (facts could not be gathered)
    return counts


def print_recap(report: FleetReport, out: Console) -> None:
    out.print("RECAP")
    width = max((len(r.host) for r in report.results), default=0)
    for r in report.results:
        counts = recap(r)
        parts = [f"[{_STYLE[k]}]{k}={n}[/]" if n else f"{k}={n}" for k, n in counts.items()]
        out.print(f"[{_STYLE[host_status(r)]}]{r.host:<{width}}[/] : " + "  ".join(parts))


def report_dict(report: FleetReport, check: bool, diff: bool, inventory: str) -> dict:
    from gpurig import __version__

    return {
        "schema": REPORT_SCHEMA,
        "gpurig": __version__,
        "inventory": inventory,
        "check": check,
        "started": report.started,
        "duration_s": round(report.duration_s, 3),
        "converged": converged(report),
        "hosts": [
            {
                "host": r.host,
                "status": host_status(r),
                "reason": r.reason,
                "recap": recap(r),
                "steps": [s.to_dict(diff) for s in host_steps(r)],
            }
            for r in report.results
        ],
    }
