"""Verifying hosts over the fleet as `gpurig verify` shows it: one row per host (or every record with -v), the JSON report, JUnit XML.

The verify task and the CI chain's verify stage run the same code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpurig.files import write_text_report
from gpurig.flows.fleettask import HostOptions, connect_early, exit_for, fleet_document, run_hosts
from gpurig.report.tables import Column

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.inventory import Host
    from gpurig.results import FleetReport, Outcome
    from gpurig.verify.runner import VerifyPlan

SCHEMA = "gpurig.verify/1"

VERDICT_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "cyan", "unreachable": "magenta"}

HOST_COLUMNS = (
    Column("host"),
    Column("verdict", styles=VERDICT_STYLE),
    Column("failing"),
    Column("fix", drop=1),
    Column("figures", drop=2),
    Column("time", drop=3),
)

RECORD_COLUMNS = (
    Column("host"),
    Column("status", styles=VERDICT_STYLE),
    Column("record"),
    Column("measured"),
    Column("expected", drop=2),
    Column("detail", drop=1),
)


def verify_fleet(opts: HostOptions, chosen: Sequence[Host], plan: VerifyPlan, *, junit: str | None = None) -> None:
    """``plan`` on every chosen host against its inventory's GPUs (a Slurm node's state beside): one row per host (-v: every record),
    the JSON report, JUnit XML to ``junit`` (- = stdout); exits non-zero when a host did not pass."""
    from gpurig.inventory.profile import host_profile
    from gpurig.verify.gate import fleet_passed, verdict_outcome

    expect = {h.name: host_profile(h, opts.settings.inventory).gpus for h in chosen}  # every error before any host
    early = connect_early(opts, chosen)
    from gpurig.slurm.conf import NODES_GROUP
    from gpurig.slurm.health import node_record
    from gpurig.verify.junit import junit_xml
    from gpurig.verify.runner import verify_host

    slurm_nodes = {h.name for h in chosen if NODES_GROUP in h.groups}

    def work(conn: Connection) -> Outcome:
        gpus = expect[conn.name]
        verdict = verify_host(conn, plan, gpus.count, gpus.model, gpus.mig)
        if conn.name in slurm_nodes:  # what the scheduler makes of the node: drained, with the health program's reason
            verdict = dataclasses.replace(verdict, records=(*verdict.records, node_record(conn)))
        return verdict_outcome(verdict)

    def annotate(report: FleetReport) -> dict:
        return {"level": plan.level, "target": plan.target or None, "passed": fleet_passed(report)}

    report = run_hosts(opts, chosen, work, label="verify", schema=SCHEMA, annotate=annotate, connector=early)
    keep_history(opts, report, plan)
    if junit:
        write_text_report(junit, junit_xml(report), "--junit")
    columns, rows = (record_rows(report) if opts.verbose else host_rows(report))
    if junit != "-":  # stdout already holds the XML
        opts.show(columns, rows, doc=fleet_document(opts, report, SCHEMA, **annotate(report)))
    exit_for(report)


def keep_history(opts: HostOptions, report: FleetReport, plan: VerifyPlan) -> None:
    """One line per host in the project's verify history (gpurig.verify.verdictlog); nothing under --check/--dry. A history
    that cannot be written is said on stderr: the verdicts stand, the run's exit is theirs."""
    from gpurig.report import err_console
    from gpurig.verify.gate import verdict_of
    from gpurig.verify.verdictlog import append_entries, unverified_entry, verdict_entry

    if opts.check:
        return
    entries = []
    for r in report.results:
        v = verdict_of(r.data)
        entries.append(verdict_entry(v) if v is not None else
                       unverified_entry(r.host, plan.level, plan.target, str(r.status), r.reason, r.fix))
    try:
        append_entries(opts.settings.project, entries)
    except OSError as err:
        err_console.print(f"verify: the history was not kept: {err}", highlight=False)


def host_rows(report: FleetReport) -> tuple[list[Column], list[list[str]]]:
    """One row per host: worst status, the first failing record, its fix, the key figures, the time taken."""
    from gpurig.verify.gate import verdict_of

    rows = []
    for r in report.results:
        v = verdict_of(r.data)
        if v is None:
            rows.append([r.host, r.status, "-", r.reason, "", f"{r.duration_s:.1f}s"])
            continue
        bad = v.failures or tuple(x for x in v.records if x.status == "warn")
        failing = f"{bad[0].id}: {bad[0].detail}" if bad else "-"
        more = f" (+{len(bad) - 1} more, -v shows all)" if len(bad) > 1 else ""
        rows.append([r.host, v.worst, failing + more, bad[0].fix if bad else "", v.figures(), f"{r.duration_s:.1f}s"])
    return list(HOST_COLUMNS), rows


def record_rows(report: FleetReport) -> tuple[list[Column], list[list[str]]]:
    """-v: every record of every host, with its fix under the detail."""
    from gpurig.verify.gate import verdict_of

    rows = []
    for r in report.results:
        v = verdict_of(r.data)
        if v is None:
            rows.append([r.host, r.status, "-", "-", "-", r.reason])
            continue
        for x in v.records:
            detail = x.detail + (f"\nfix: {x.fix}" if x.fix else "")
            rows.append([r.host, x.status, x.id, x.shown("measured"), x.shown("expected"), detail])
    return list(RECORD_COLUMNS), rows
