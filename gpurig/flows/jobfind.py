"""Jobs read from the hosts: every selected host's (its job agent's) and the Slurm cluster's, and one job found by its id.

What ``gpurig jobs``, ``logs --job``, ``attach``, ``cancel`` and ``fetch`` ask
first, and what any other reader of the job queue (a dashboard) asks the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpurig.errors import ConfigError, GpurigError, counted
from gpurig.flows.fleettask import make_connector, run_hosts, select_hosts, slurm_reach
from gpurig.status import Status

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.flows.fleettask import HostOptions
    from gpurig.jobs.views import JobView
    from gpurig.results import FleetReport, Outcome

JOBS_SCHEMA = "gpurig.jobs/1"


def views_of(rep: FleetReport) -> list[JobView]:
    return [v for r in rep.results if isinstance(r.data, tuple) for v in r.data]


def list_jobs(opts: HostOptions, ids: tuple[str, ...] = (), label: str = "jobs") -> FleetReport:
    """Every selected host's jobs (its job agent's), and Slurm's gpurig jobs from the cluster's controller when it is selected."""
    return run_hosts(opts, select_hosts(opts), jobs_work(opts, ids), label=label, schema=JOBS_SCHEMA,
                     annotate=lambda rep: {"jobs": [v.to_dict() for v in views_of(rep)]})


def jobs_work(opts: HostOptions, ids: tuple[str, ...] = ()) -> Callable[[Connection], Outcome]:
    """What ``list_jobs`` does on each host (its JobViews as the Outcome's data), for a reader that runs it over the fleet itself,
    quietly and again and again (the dashboard): the same reads, no progress, report or recap."""
    from gpurig.jobs.remote import JobAgent
    from gpurig.jobs.views import job_view
    from gpurig.results import Outcome

    agent_text = None
    controller = slurm_controller(opts)

    def work(conn: Connection) -> Outcome:
        nonlocal agent_text
        agent = JobAgent(conn, agent_text)
        agent_text = agent.source
        views = [job_view(conn.name, d) for d in agent.jobs(ids)]
        if conn.name == controller:
            from gpurig.slurm.scheduler import slurm_jobs

            views += [v for v in slurm_jobs(conn) if not ids or v.id in ids]
        return Outcome(data=tuple(views))

    return work


def slurm_controller(opts: HostOptions) -> str | None:
    """The inventory's Slurm controller, when it has a cluster (its gpurig jobs are listed from there)."""
    from gpurig.inventory import load_inventory
    from gpurig.slurm.cluster import cluster_hosts

    found = cluster_hosts(load_inventory(opts.settings.inventory), opts.settings.inventory)
    return found.controller.name if found else None


def find_job(opts: HostOptions, wanted: str) -> JobView:
    """The job ``wanted`` names among the selected hosts' (one line when it is nowhere, or several, or a host could not be asked)."""
    from gpurig.connect.fleet import run_fleet
    from gpurig.jobs.remote import JobAgent
    from gpurig.jobs.views import job_view, pick
    from gpurig.results import Outcome

    if wanted.isdecimal():  # Slurm's
        from gpurig.slurm.scheduler import find, the_cluster

        return find(slurm_reach(opts), the_cluster(opts.settings.inventory), wanted)
    hosts = select_hosts(opts)
    connector = make_connector(opts)
    try:
        report = run_fleet(hosts, lambda conn: Outcome(data=tuple(job_view(conn.name, d) for d in JobAgent(conn).jobs((wanted,)))),
                           connector=connector, forks=opts.settings.forks, label="find")
    finally:
        connector.close()
    views = views_of(report)
    try:
        return pick(views, wanted, len(hosts))
    except GpurigError as err:
        unasked = [r for r in report.results if r.status not in (Status.OK, Status.CHANGED)]
        if unasked and not views:
            said = "; ".join(f"{r.host}: {r.reason}" for r in unasked[:3])
            raise ConfigError(f"{err.problem}; {counted(len(unasked), 'host')} could not be asked ({said})", err.fix) from None
        raise
