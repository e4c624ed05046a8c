"""The ``provision`` task: converge hosts to their inventory profile, step by step (for now: the daemon step).

Thin on purpose: select hosts, validate every host's profile before any
connection, run ``gpurig.steps.converge`` over the fleet, then present a
per-host per-step table, the diffs when asked, and the recap.
"""

from __future__ import annotations

from rich.markup import escape

from gpurig.cli.options import HostOptions, exit_for, fleet_document, host_task, run_hosts, select_hosts
from gpurig.connection import Connection
from gpurig.fleet import FleetReport, HostResult, Outcome
from gpurig.profile import host_profile
from gpurig.report import console, err_console
from gpurig.report.fleet import STATUS_STYLE
from gpurig.report.tables import Column
from gpurig.steps import STEPS, StepResult, converge

__all__ = ["provision"]

SCHEMA = "gpurig.provision/1"


@host_task(changes=True)
def provision(c, opts: HostOptions):
    """Bring hosts to the state their inventory vars ask for (today: gpurig_daemon into /etc/docker/daemon.json)."""
    chosen = select_hosts(opts)
    profiles = {h.name: host_profile(h, opts.settings.inventory) for h in chosen}  # every error before any host is touched
    steps = [cls() for cls in STEPS.values()]

    def work(conn: Connection) -> Outcome:
        results = converge(conn, steps, profiles[conn.name], check=opts.check, diff=opts.diff)
        statuses = {r.status for r in results}
        status = "failed" if "failed" in statuses else "changed" if "changed" in statuses else "ok"
        failed = "; ".join(f"step {r.step} failed: {r.reason}" for r in results if r.status == "failed")
        return Outcome(status=status, data=tuple(results), detail=failed)

    def annotate(rep: FleetReport) -> dict:
        return {"converged": rep.exit_code == 0, "hosts": host_documents(rep, opts.diff)}

    report = run_hosts(opts, chosen, work, label="provision", schema=SCHEMA, annotate=annotate)
    columns = [Column("host"), Column("step"), Column("status", styles=STATUS_STYLE), Column("reason")]
    opts.show(columns, step_rows(report), doc=fleet_document(opts, report, SCHEMA, **annotate(report)))
    if opts.diff and opts.format == "table":
        print_diffs(report, err_console if opts.json == "-" else console)
    exit_for(report)


def host_steps(r: HostResult) -> tuple[StepResult, ...]:
    return r.data if isinstance(r.data, tuple) else ()


def step_rows(report: FleetReport) -> list[list[str]]:
    rows = []
    for r in report.results:
        results = host_steps(r)
        if not results:
            rows.append([r.host, "-", r.status, r.reason])
        for s in results:
            rows.append([r.host, s.step, s.status, "\n".join([s.reason, *(f"- {c.summary}" for c in s.changes)])])
    return rows


def host_documents(report: FleetReport, diff: bool) -> list[dict]:
    return [
        {"host": r.host, "status": r.status, "reason": r.reason, "duration_s": round(r.duration_s, 3),
         "steps": [s.to_dict(diff) for s in host_steps(r)]}
        for r in report.results
    ]


def print_diffs(report: FleetReport, out) -> None:
    for r in report.results:
        for s in host_steps(r):
            for change in s.changes:
                if change.diff:
                    out.print(f"[bold]{escape(r.host)} {s.step}: {escape(change.summary)}[/]")
                    for line in change.diff.splitlines():
                        style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
                        out.print(f"[{style}]{escape(line)}[/]" if style else escape(line), soft_wrap=True)
