"""The ``usage`` task: GPU-hours allocated and used per user (-v: per job and host) over a window, and the idle allocations.

Thin: check --since and --idle-after; then ``gpurig.flows.fleetusage.usage_fleet``
reads the selected hosts' job records and the monitor recordings and presents them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.options import host_task

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions

__all__ = ["usage"]

HELP = {
    "since": "the window's start: a span back from now (90m, 24h, 7d) or an ISO date (2026-01-31); default 7d",
    "from_records": "a monitor recording (gpurig monitor --record DIR) whose samples give utilisation; repeatable",
    "idle_after": "list a GPU held at under 5% for longer than this (default 30m)",
    "csv": "also write one row per user, job and host to this CSV file",
}


@host_task(help=HELP, iterable=["from_records"])
def usage(c, opts: HostOptions, since="7d", from_records=None, idle_after="30m", csv=None):
    """GPU-hours allocated (jobs' GPUs x run time) and used (utilisation-weighted, from monitor recordings) per user; idle allocations."""
    import time

    from gpurig.flows.fleetusage import usage_fleet
    from gpurig.jobs.gpuhours import parse_since, parse_span

    start = parse_since(since, time.time())
    idle = parse_span(idle_after, "--idle-after")
    usage_fleet(opts, start, list(from_records or ()), idle, csv)
