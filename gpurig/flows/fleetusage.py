"""GPU-hours over a window as ``gpurig usage`` shows them: the job records of the selected hosts (flows.jobfind.list_jobs) and
monitor recordings, added up by gpurig.jobs.gpuhours; a table per user (-v per job and per host), the idle allocations, --json, --csv.

Nothing checked is not a pass: a host whose jobs could not be read is named
and the run exits 1 (the table is still printed); a window in which no job
ran and no sample was recorded says so and exits 1.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpurig.errors import Finished, counted
from gpurig.files import write_output, write_report
from gpurig.report.tables import Column, document
from gpurig.status import Status

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions
    from gpurig.jobs.gpuhours import IdleSpell, Usage, UsageReport

SCHEMA = "gpurig.usage/1"
USER_COLUMNS = (Column("user"), Column("allocated h", key="allocated_h"), Column("used h", key="used_h"),
                Column("efficiency", key="efficiency_pct"))
JOB_COLUMNS = (Column("user"), Column("job"), Column("host"), Column("allocated h", key="allocated_h"), Column("used h", key="used_h"),
               Column("efficiency", key="efficiency_pct"))
HOST_COLUMNS = (Column("host"), Column("allocated h", key="allocated_h"), Column("used h", key="used_h"),
                Column("efficiency", key="efficiency_pct"))
IDLE_COLUMNS = (Column("host"), Column("gpu"), Column("held by"), Column("user"), Column("idle"), Column("from", drop=1))


def usage_fleet(opts: HostOptions, start: float, records: Sequence[str], idle_after: float, csv_path: str | None = None) -> None:
    """The window from ``start`` to now over the selected hosts' job records and the ``records`` directories."""
    from gpurig.flows.jobfind import list_jobs, views_of
    from gpurig.jobs.gpuhours import usage
    from gpurig.monitor.record import load_run

    runs = [load_run(d) for d in records]  # a directory that holds no run is one line before any host is asked
    end = time.time()
    report = list_jobs(dataclasses.replace(opts, json=None), label="usage")
    unasked = [{"host": r.host, "status": str(r.status), "why": r.reason} for r in report.results if r.status not in (Status.OK, Status.CHANGED)]
    found = usage(views_of(report), runs, start, end, idle_after)
    doc = usage_document(found, unasked, list(records))
    if opts.json:
        write_report(opts.json, doc)
    if csv_path:
        write_output(csv_path, usage_csv(found), "--csv")
    present(opts, found, unasked, doc)
    if unasked:
        raise Finished(1, f"usage: {counted(len(unasked), 'host')} could not be asked for jobs; the figures leave them out")
    if not found.jobs and not found.samples:
        raise Finished(1, f"usage: no job ran and no sample was recorded between {_when(start)} and {_when(end)}: nothing to count")


def _hours(seconds: float) -> str:
    """GPU-hours as read: 2 decimals, 4 under a hundredth (a short recording), 0 for none."""
    h = seconds / 3600
    return "0" if h == 0 else f"{h:.2f}" if h >= 0.01 else f"{h:.4f}"


def _pct(u: Usage) -> str:
    eff = u.efficiency
    return "-" if eff is None else f"{eff:.0%}"


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _idle_text(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def present(opts: HostOptions, found: UsageReport, unasked: list[dict[str, str]], doc: dict[str, Any]) -> None:
    from gpurig.report import console, err_console

    users = [[u.user, _hours(u.allocated_s), _hours(u.used_s), _pct(u)] for u in found.totals("user")]
    opts.show(list(USER_COLUMNS), users, doc=doc)
    if opts.json == "-" or opts.format == "json":
        return
    if opts.verbose:
        opts.show(list(JOB_COLUMNS), [[u.user, u.job, u.host, _hours(u.allocated_s), _hours(u.used_s), _pct(u)] for u in found.rows])
        opts.show(list(HOST_COLUMNS), [[u.host, _hours(u.allocated_s), _hours(u.used_s), _pct(u)] for u in found.totals("host")])
    if found.idle:
        opts.show(list(IDLE_COLUMNS), [_idle_row(x) for x in found.idle], title="idle allocations (held, under 5%)")
    for note in found.notes:
        err_console.print(f"note: {note}", highlight=False)
    for u in unasked:
        err_console.print(f"{u['status']}: {u['host']}: {u['why']}", highlight=False)
    if opts.format == "table":
        window = f"{_when(found.start)[:16].replace('T', ' ')} to {_when(found.end)[:16].replace('T', ' ')} UTC"
        console.print(f"{counted(found.jobs, 'job record')} and {counted(found.samples, 'sample')} from {window}", highlight=False)


def _idle_row(x: IdleSpell) -> list[str]:
    return [x.host, x.gpu, x.holders, x.users, _idle_text(x.seconds), _when(x.start)]


def _figures(u: Usage) -> dict[str, Any]:
    eff = u.efficiency
    return {"allocated_h": round(u.allocated_s / 3600, 6), "used_h": round(u.used_s / 3600, 6), "held_h": round(u.held_s / 3600, 6),
            "efficiency_pct": None if eff is None else round(100 * eff, 2)}


def usage_document(found: UsageReport, unasked: list[dict[str, str]], records: list[str]) -> dict[str, Any]:
    return document(SCHEMA, {
        "since": _when(found.start), "until": _when(found.end), "records": records, "job_records": found.jobs, "samples": found.samples,
        "users": [{"user": u.user, **_figures(u)} for u in found.totals("user")],
        "jobs": [{"user": u.user, "job": u.job, "host": u.host, "gpus": u.gpus, "from_job_record": u.recorded, **_figures(u)}
                 for u in found.rows],
        "hosts": [{"host": u.host, **_figures(u)} for u in found.totals("host")],
        "idle": [{"host": x.host, "gpu": x.gpu, "held_by": x.holders, "users": x.users, "from": _when(x.start), "to": _when(x.end),
                  "minutes": round(x.seconds / 60, 2)} for x in found.idle],
        "unasked": unasked, "notes": found.notes,
        "passed": not unasked and bool(found.jobs or found.samples),
    })


def usage_csv(found: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["user", "job", "host", "allocated_h", "used_h", "held_h", "efficiency_pct"])
    for u in found.rows:
        f = _figures(u)
        writer.writerow([u.user, u.job, u.host, f["allocated_h"], f["used_h"], f["held_h"], "" if f["efficiency_pct"] is None else f["efficiency_pct"]])
    return out.getvalue()
