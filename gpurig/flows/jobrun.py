"""A job run on one host with gpurig's queue, as `gpurig run` shows it: submitted, or with --wait followed to its end.

--wait streams the log, fetches the artifacts, prints the summary (exit
code, wall time, GPU use, the diagnosis) on stderr; an interrupt says once
what became of the job (left to go on, or cancelled). The run task and the
CI chain's run stage run the same code.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.errors import ConfigError, Finished, GpurigError
from gpurig.files import RUNS
from gpurig.flows.fleettask import (
    HostOptions,
    WaitLines,
    exit_for,
    fleet_document,
    follow_hint,
    interrupted,
    make_connector,
    run_hosts,
    write_json_report,
)
from gpurig.report import err_console, outside
from gpurig.report.tables import Column
from gpurig.status import Status

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpurig.connect.connection import Connection
    from gpurig.image.spec import ImageSpec
    from gpurig.inventory import Host
    from gpurig.jobs import request as jobspec
    from gpurig.jobs.artifacts import Fetched
    from gpurig.jobs.submit import Submitted
    from gpurig.jobs.summary import GpuUse
    from gpurig.jobs.views import JobView
    from gpurig.results import FleetReport, Outcome

SCHEMA = "gpurig.run/1"

# git's own folders (nested repositories' too: git never sends their contents), and where fetched artifacts land
ALWAYS_IGNORED = (".git", f"/{RUNS}")


@dataclass(frozen=True)
class Waited:
    """What --wait saw after the submission: how the job ended, its artifacts, its GPU use."""

    view: JobView
    fetched: Fetched | None
    use: GpuUse | None
    error: GpurigError | None = None  # fetching the artifacts or the samples failed: the job's result stands, the host fails


def run_job(opts: HostOptions, host: Host, request: jobspec.RunRequest, *, load_spec: Callable[[], ImageSpec], wait: bool, junit,
            into: Path | None, cancel: bool) -> None:
    """The job on ``host``'s queue: its id printed, or with ``wait`` followed to its end; exits with the script's code.

    ``load_spec`` gives the project's image spec where the job's container needs it. An interrupt while the job is
    followed ends in one line saying what became of it: left to go on, or cancelled (``cancel``).
    """
    from gpurig.jobs import request as jobspec
    from gpurig.jobs.placement import resolve_target
    from gpurig.jobs.sync import sync_key
    from gpurig.jobs.tree import scan
    from gpurig.results import FleetInterrupted, Outcome

    tree = scan(request.workdir, always_ignored=ALWAYS_IGNORED)
    for skipped in tree.skipped:
        err_console.print(f"[yellow]{outside(skipped.path)}: {outside(skipped.why)}[/]", highlight=False)
    job = jobspec.new_job_id()
    target = resolve_target(host, request, job, sync_key(request.workdir), tree, check=opts.check, load_spec=load_spec,
                            source=opts.settings.inventory)
    into_dir = into or request.workdir / RUNS / job
    from gpurig.jobs.interrupt import ENDED, FOLLOWING, after_interrupt
    from gpurig.jobs.submit import READING

    # submit_job's step (reading the host ... submitting, submitted), then "following" (the job is on the host) and "ended" (its log
    # ended): what an interrupt leaves behind
    stage = [READING]
    ending: dict = {}  # what became of the job after an interrupt, for the JSON report: its state as read, detached, or cancelled

    def work(conn: Connection) -> Outcome:
        from gpurig.connect.connection import CommandInterrupted
        from gpurig.jobs.submit import submit_job

        submitted = submit_job(conn, target, phase=lambda step: stage.__setitem__(0, step))
        if opts.check or not wait:
            return Outcome(status=Status.SKIPPED if opts.check else Status.CHANGED, data=RunResult(submitted))
        stage[0] = FOLLOWING
        try:
            done = follow(conn, submitted.job, request, into_dir, lambda: stage.__setitem__(0, ENDED), WaitLines(submitted.job))
        except CommandInterrupted:
            if not conn.interrupted:
                raise
            # what became of the job is said once, by the task (the command stopped was gpurig's reading of the log, not the job)
            what = "after its log ended, before how it ended was read" if stage[0] == ENDED else "while following its log"
            return Outcome(status=Status.CHANGED, data=RunResult(submitted), detail=f"interrupted {what} (job {submitted.job})")
        view = done.view
        if view.state != "succeeded":  # the recap counts a job that exited non-zero as failed, as its exit code says
            why = f"job {view.id} {view.state_text}" + (f"; {done.error.problem}" if done.error else "")
            return Outcome(status=Status.FAILED, data=RunResult(submitted, done), detail=why, fix=done.error.fix if done.error else "")
        if done.error is not None:
            return Outcome(status=Status.FAILED, data=RunResult(submitted, done), detail=done.error.problem, fix=done.error.fix)
        return Outcome(status=Status.CHANGED, data=RunResult(submitted, done))

    try:
        report = run_hosts(opts, [host], work, label="run", schema=SCHEMA, annotate=lambda rep: {"job": job_doc(rep, ending, job)},
                           interrupt_recap=False)
    except KeyboardInterrupt as stop:  # the fleet's FleetInterrupted, or a second Ctrl-C that cut its stopping short (no report)
        stopped = stop.report if isinstance(stop, FleetInterrupted) else None
        said = after_interrupt(lambda: make_connector(opts), host, waited(stopped) if stopped is not None else None, job, stage[0], request,
                               cancel, ending, wait=wait, hint=follow_hint)
        if stopped is not None:
            write_json_report(opts, stopped, SCHEMA, lambda rep: {"job": job_doc(rep, ending, job)})
        raise interrupted(stop, said) from None
    show_run(opts, report, wait)
    if junit:
        from gpurig.files import write_text_report
        from gpurig.jobs.views import job_junit

        write_text_report(junit, job_junit([w.view for w in waited(report)]), "--junit")
    done = waited(report)
    if done and done[0].view.exit_status:  # the script's own code, before a failed fetch's 1
        raise Finished(done[0].view.exit_status)
    exit_for(report)


def follow(conn: Connection, job: str, request: jobspec.RunRequest, into: Path, log_ended=lambda: None, on_wait=None) -> Waited:
    """--wait: the log to stdout until the job ends (then ``log_ended()``), then its artifacts and its GPU use; ``on_wait(state, reason)``
    hears why the job waits while it is pending."""
    from gpurig.jobs.artifacts import fetch
    from gpurig.jobs.remote import JobAgent
    from gpurig.jobs.summary import gpu_use
    from gpurig.jobs.views import job_view

    agent = JobAgent(conn)

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    agent.logs(job, out, follow=True, on_wait=on_wait)
    log_ended()
    found = agent.jobs((job,))
    view = job_view(conn.name, found[0]) if found else None
    if view is None:
        raise ConfigError(f"job {job} is gone from {conn.name}", "see `gpurig jobs`")
    try:  # the artifacts first: a failure after them (the GPU samples) keeps what was fetched in the report
        fetched = fetch(agent, job, into) if request.artifacts else None
    except GpurigError as err:
        return Waited(view, None, None, err)
    try:
        return Waited(view, fetched, gpu_use(view, agent.samples(job)))
    except GpurigError as err:
        return Waited(view, fetched, None, err)


@dataclass(frozen=True)
class RunResult:
    """A host's data in the fleet report: the submission, and with --wait how the job ended."""

    submitted: Submitted
    waited: Waited | None = None

    def to_dict(self) -> dict:
        """The JSON report's job: no env value (the body stays on the host), no file list (the counts)."""
        s = self.submitted
        doc = {"id": s.job, "state": s.state, "gpus": s.gpus, "supervisor": s.supervisor, "image_delivery": s.delivery,
               "bytes_moved": s.bytes_moved, "sync": {"files": s.plan.files, "bytes": s.plan.bytes, "deleted": len(s.plan.delete),
                                                      "unchanged": s.plan.unchanged, "wire_bytes": s.sync.sent_bytes if s.sync else 0}}
        w = self.waited
        if w is not None:
            view = w.view
            doc.update(state=view.state, reason=view.reason, exit_code=view.exit_code, exit_status=view.exit_status,
                       runtime_s=view.runtime_s, attempts=list(view.attempts),
                       artifacts=({"into": str(w.fetched.into), "fetched": list(w.fetched.files), "unchanged": w.fetched.unchanged}
                                  if w.fetched else None),
                       gpu_use=w.use.to_dict() if w.use else None, error=w.error.problem if w.error else None)
        return doc


def results_of(rep: FleetReport) -> list[RunResult]:
    return [r.data for r in rep.results if isinstance(r.data, RunResult)]


def waited(rep: FleetReport) -> list[Waited]:
    return [r.waited for r in results_of(rep) if r.waited is not None]


def job_doc(rep: FleetReport, ending: dict | None = None, job: str = "") -> dict | None:
    """The report's job: as submitted and followed, with what an interrupt found (``ending``) over it; a job an interrupt kept from
    starting is its id and "not started"."""
    found = results_of(rep)
    if found:
        return {**found[0].to_dict(), **(ending or {})}
    return {"id": job, **ending} if job and ending else None


def show_run(opts: HostOptions, report: FleetReport, wait: bool) -> None:
    columns = [Column("host"), Column("job"), Column("state"), Column("gpus", drop=2), Column("synced", drop=1), Column("reason")]
    rows = []
    for r in report.results:
        if not isinstance(r.data, RunResult):
            rows.append([r.host, "-", r.status, "", "", r.reason])
            continue
        s = r.data.submitted
        synced = f"{s.plan.files} changed ({s.plan.bytes} bytes), {s.plan.unchanged} unchanged" + (f", {len(s.plan.delete)} deleted" if s.plan.delete else "")
        state = "would submit" if opts.check else s.state
        rows.append([r.host, s.job, state, str(s.gpus or "none"), synced, r.reason])
    out = err_console if wait or opts.json == "-" else None
    if wait:
        for w in waited(report):
            summary_lines(w, out or err_console)
        return
    opts.show(columns, rows, doc=fleet_document(opts, report, SCHEMA, job=job_doc(report)))
    if not opts.check:
        for s in (x.submitted for x in results_of(report)):
            err_console.print(f"follow it: gpurig logs --job {s.job} --follow  (or gpurig attach {s.job}); stop it: gpurig cancel {s.job}",
                              highlight=False)


def summary_lines(w: Waited, out) -> None:
    from gpurig.jobs.views import duration_text

    view = w.view
    out.print(f"job {view.id} on {outside(view.host)}: {outside(view.state_text)}, exit code {view.exit_status}, "
              f"wall time {duration_text(view.runtime_s)}" + (f", {len(view.attempts)} attempts" if len(view.attempts) > 1 else ""),
              highlight=False)
    if w.use is not None:
        out.print(f"  GPUs: {outside(w.use.line())}", highlight=False)
        for f in w.use.findings:
            out.print(f"  {outside(f.title)}: {outside(f.evidence)}; fix: {outside(f.fix)}", highlight=False)
    if w.fetched is not None:
        out.print(f"  artifacts: {outside(w.fetched.line())}", highlight=False)
