"""The ``jobs``, ``attach``, ``cancel`` and ``fetch`` tasks, and ``logs --job``: jobs read from the hosts, found by id.

Thin: a job's state lives on its host, so each task asks the selected hosts
(every host of the inventory unless narrowed with -l) through the job agent,
finds the job by its id or a unique prefix of it, and acts on that host.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from gpurig.cli.options import container_names, exit_with_job, host_task, select_hosts, slurm_reach, to_stdout
from gpurig.errors import ConfigError
from gpurig.files import RUNS, output_dir
from gpurig.report import err_console, outside
from gpurig.report.tables import Column
from gpurig.status import STATUS_STYLE, Status

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.flows.fleettask import HostOptions
    from gpurig.jobs.views import JobView
    from gpurig.results import FleetReport, Outcome

__all__ = ["jobs", "logs", "attach", "cancel", "fetch_"]

@host_task(help={"state": "only jobs in these states, comma-separated (pending, running, succeeded, failed, cancelled)",
                 "job": "only this job (its id, or a unique start of it)"})
def jobs(c, opts: HostOptions, state=None, job=None):
    """The jobs on the selected hosts (default: all): state (with why it waits or failed), GPUs, runtime, command."""
    from gpurig.flows.fleettask import exit_for, fleet_document
    from gpurig.flows.jobfind import JOBS_SCHEMA, list_jobs, views_of
    from gpurig.jobs.views import STATES, check_job_id, duration_text

    wanted = [s.strip() for s in (state or "").split(",") if s.strip()]
    for s in wanted:
        if s not in STATES:
            raise ConfigError(f"--state {s!r} is not a job state", f"use {', '.join(STATES)}")
    report = list_jobs(opts, (check_job_id(job),) if job is not None else ())
    found = sorted(views_of(report), key=lambda v: (v.submitted_at or 0, v.host, v.id))
    shown = [v for v in found if not wanted or v.state in wanted]
    columns = [Column("host"), Column("job"), Column("name", drop=3), Column("state"), Column("gpus", drop=2), Column("runtime", drop=1),
               Column("command", drop=4)]
    rows = [[v.host, v.id, v.name, v.state_text, v.gpu_text, duration_text(v.runtime_s), " ".join(v.argv)] for v in shown]
    for r in report.results:
        if r.status not in (Status.OK, Status.CHANGED):
            rows.append([r.host, "-", "", f"{r.status}: {r.reason}", "", "", ""])
    opts.show(columns, rows, doc=fleet_document(opts, report, JOBS_SCHEMA, jobs=[v.to_dict() for v in shown]))
    exit_for(report)


def on_job_host(opts: HostOptions, view: JobView, label: str, work, interrupt_recap: bool = True) -> FleetReport:
    from gpurig.flows.fleettask import run_hosts

    chosen = [h for h in select_hosts(opts) if h.name == view.host]
    return run_hosts(opts, chosen, work, label=label, schema=f"gpurig.{label}/1", interrupt_recap=interrupt_recap)


def stream_log(opts: HostOptions, view: JobView, *, follow: bool, tail: int, label: str) -> FleetReport:
    """The job's log to stdout; Ctrl-C (or SIGTERM) while following ends it with one line: following stopped, the job goes on."""
    from gpurig.flows.fleettask import WaitLines
    from gpurig.flows.jobact import log_work

    work = log_work(view, print_now, follow=follow, tail=tail, on_wait=WaitLines(view.id) if follow else None)
    try:
        return on_job_host(opts, view, label, work, interrupt_recap=False)
    except KeyboardInterrupt as stop:  # the fleet's FleetInterrupted, or a second Ctrl-C that cut its stopping short
        raise stopped_following(stop, view) from None


def stopped_following(stop: KeyboardInterrupt, view: JobView) -> Exception:
    """The one line a signal ends a job's followed log with: the person stopped following, the job is as it was."""
    from gpurig.flows.fleettask import interrupted

    if view.ended:
        return interrupted(stop, f"stopped reading job {view.id}'s log; the job had ended ({view.state_text})")
    return interrupted(stop, f"stopped following job {view.id}, which goes on (gpurig cancel {view.id} stops it)")


def print_now(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def job_logs(opts: HostOptions, job: str, follow: bool, tail: int) -> None:
    """``gpurig logs --job ID``: the whole log (or its last ``tail`` lines), with --follow until the job ends."""
    from gpurig.flows.fleettask import WaitLines, exit_for
    from gpurig.flows.jobfind import find_job
    from gpurig.jobs.views import check_job_id

    view = find_job(opts, check_job_id(job))
    if view.mode == "slurm":
        from gpurig.slurm.scheduler import follow as follow_slurm
        from gpurig.slurm.scheduler import the_cluster

        try:
            follow_slurm(slurm_reach(opts), the_cluster(opts.settings.inventory), view, to_stdout, follow_it=follow,
                         on_wait=WaitLines(view.id) if follow else None)
        except KeyboardInterrupt as stop:
            raise stopped_following(stop, view) from None
        return
    exit_for(stream_log(opts, view, follow=follow, tail=tail, label="logs"))


@host_task(help={"name": "the container (as in gpurig status), or with --job the job's id (or a unique start of it)",
                 "follow": "keep printing new lines until Ctrl-C (a job's: until it ends)",
                 "tail": "how many lines from the end (default 100 for a container, a job's whole log; 0 = all)",
                 "job": "NAME is a job: its log, from whichever host runs it (every host is searched unless -l narrows)"},
           positional=["name"])
def logs(c, opts: HostOptions, name=None, follow=False, tail=-1, job=False):
    """A deployed container's logs (stdout and stderr), prefixed with the host when several are selected; or a job's (--job ID)."""
    from gpurig.connect.engineopen import open_engine
    from gpurig.deploy.compare import NAME_LABEL
    from gpurig.flows.fleettask import connect_early, exit_for, run_hosts
    from gpurig.results import Outcome

    if job:
        job_logs(opts, name, bool(follow), max(int(tail), 0))
        return
    tail = 100 if int(tail) < 0 else tail
    if not name:
        raise ConfigError("which container? `gpurig logs -l HOST NAME` (or a job: `gpurig logs --job ID`)", "see the names with `gpurig status`")
    container_names(name)  # checked before any host is contacted
    chosen = select_hosts(opts)
    early = connect_early(opts, chosen)
    prefix = len(chosen) > 1

    def work(conn: Connection) -> Outcome:
        with open_engine(conn) as engine:
            found = engine.container(name)
            if found is None or NAME_LABEL not in found.labels:
                return Outcome(status=Status.FAILED, detail=f"no gpurig container named {name} (see gpurig status)")
            for chunk in engine.follow_logs(name, tail=int(tail) or "all", follow=bool(follow)):
                text = chunk.decode(errors="replace")
                if prefix:
                    text = "".join(f"{conn.name} | {line}" for line in text.splitlines(keepends=True))
                sys.stdout.write(text)
                sys.stdout.flush()
        return Outcome(status=Status.OK)

    report = run_hosts(opts, chosen, work, label="logs", schema="gpurig.logs/1", connector=early)
    exit_for(report)


@host_task(help={"job": "the job (its id, or a unique start of it)", "tail": "lines of the log already written to show first (default 20; 0 = all)"},
           positional=["job"])
def attach(c, opts: HostOptions, job=None, tail=20):
    """Follow a job's output until it ends, then exit with its exit code; Ctrl-C detaches (the job goes on)."""
    from gpurig.flows.fleettask import WaitLines, exit_for, follow_hint, interrupted
    from gpurig.flows.jobfind import find_job
    from gpurig.jobs.views import check_job_id

    view = find_job(opts, check_job_id(job))
    if view.mode == "slurm":
        from gpurig.slurm import scheduler

        try:
            after = scheduler.follow(slurm_reach(opts), scheduler.the_cluster(opts.settings.inventory), view, to_stdout,
                                     on_wait=WaitLines(view.id))
        except KeyboardInterrupt as stop:
            raise interrupted(stop, f"detached from slurm job {view.id}, which goes on: {follow_hint(view.id)}") from None
        exit_with_job(after)
        return
    report = stream_log(opts, view, follow=True, tail=int(tail), label="attach")
    exit_for(report)
    end = next((r.data for r in report.results if r.data is not None), None)
    after = find_job(opts, view.id)
    err_console.print(f"job {after.id} on {outside(after.host)}: {outside(after.state_text)}", highlight=False)
    if end is not None and after.ended:
        raise Exit(code=after.exit_status)


@host_task(help={"job": "the job (its id, or a unique start of it)", "grace": "seconds between TERM and KILL (default 10)"},
           positional=["job"], changes=True)
def cancel(c, opts: HostOptions, job=None, grace=10):
    """Stop a job (TERM to its processes, KILL after --grace) or take it out of its host's queue; a deployed container it ran in stays up."""
    from gpurig.flows.fleettask import exit_for, fleet_document
    from gpurig.flows.jobact import cancel_work
    from gpurig.flows.jobfind import find_job
    from gpurig.jobs.views import check_job_id

    view = find_job(opts, check_job_id(job))
    seconds = float(grace)
    if view.mode == "slurm":
        from gpurig.slurm import scheduler

        if opts.check:
            err_console.print(f"would scancel slurm job {view.id} ({view.state_text})", highlight=False)
            return
        after = scheduler.cancel(slurm_reach(opts), scheduler.the_cluster(opts.settings.inventory), view.id)
        opts.show([Column("job"), Column("state")], [[after.id, after.state_text]])
        return

    report = on_job_host(opts, view, "cancel", cancel_work(view, seconds, check=opts.check))
    rows = [[r.host, view.id, r.status, r.reason] for r in report.results]
    opts.show([Column("host"), Column("job"), Column("status", styles=STATUS_STYLE), Column("reason")], rows,
              doc=fleet_document(opts, report, "gpurig.cancel/1"))
    exit_for(report)


@host_task(help={"job": "the job (its id, or a unique start of it)",
                 "into": f"where to put them (default: as run --wait, the job's WORKDIR/{RUNS}/JOB when run from inside it, else ./{RUNS}/JOB)"},
           positional=["job"], name="fetch")
def fetch_(c, opts: HostOptions, job=None, into=None):
    """Bring a job's artifacts (its --artifacts paths) here: only the files that differ, each checked by sha256."""
    from gpurig.flows.fleettask import exit_for
    from gpurig.flows.jobfind import find_job
    from gpurig.jobs.artifacts import default_into, fetch
    from gpurig.jobs.remote import JobAgent
    from gpurig.jobs.views import check_job_id
    from gpurig.results import Outcome

    job = check_job_id(job)
    chosen_into = output_dir(into, "--into") if into else None  # as given, before anything resolves it: no other user's link
    view = find_job(opts, job)
    if view.mode == "slurm":
        raise ConfigError(f"job {view.id} ran through Slurm, whose jobs' artifacts gpurig does not fetch yet",
                          "write them to a shared folder the nodes mount (a dataset volume)")
    if not view.artifacts:
        raise ConfigError(f"job {view.id} names no artifacts", "give run --artifacts PATH (e.g. checkpoints/) for the next job")
    dest = chosen_into or default_into(view.id, view.workdir, str(view.raw.get("client") or ""))

    def work(conn: Connection) -> Outcome:
        return Outcome(data=fetch(JobAgent(conn), view.id, dest))

    report = on_job_host(opts, view, "fetch", work)
    for r in report.results:
        if r.data is not None:
            err_console.print(f"{outside(r.host)}: job {view.id}: {outside(r.data.line())}", highlight=False)
    exit_for(report)
    if not view.ended:
        err_console.print(f"job {view.id} is still {view.state}: fetch again when it ends for the rest", highlight=False)
