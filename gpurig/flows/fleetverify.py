"""Verifying hosts over the fleet as `gpurig verify` shows it: one row per host (or every record with -v), the JSON report, JUnit XML.

The verify task and the CI chain's verify stage run the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.report.tables import Column

if TYPE_CHECKING:
    from gpurig.results import FleetReport

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
