"""Acting on one job found by its id: reading its log and cancelling it, as ``gpurig logs --job``, ``gpurig cancel`` and the dashboard do.

``log_work`` and ``cancel_work`` are what runs on the job's host (the job
agent's ``logs`` and ``cancel`` verbs); the CLI runs them with its progress,
report and recap, and ``log_tail`` and ``cancel_job`` run them quietly for a
caller with no terminal (the dashboard): the same verbs, one answer back, and
a host that could not be asked raised as one ``HostError``, never an empty
log or a silent "ok".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpurig.errors import HostError
from gpurig.flows.fleettask import make_connector, select_hosts, slurm_reach
from gpurig.status import Status

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.flows.fleettask import HostOptions
    from gpurig.jobs.views import JobView
    from gpurig.results import HostResult, Outcome

LOG_TAIL = 200  # lines of a job's log the dashboard shows by default
MAX_LOG_BYTES = 1 << 20  # of those, at most the last MiB: 200 lines of a progress bar's carriage returns can be large
CANCEL_GRACE = 10.0  # seconds between TERM and KILL, as `gpurig cancel` by default


def log_work(view: JobView, on_text: Callable[[str], None], *, follow: bool, tail: int,
             on_wait: Callable[[str, str], None] | None = None) -> Callable[[Connection], Outcome]:
    """The job's log from its host's agent to ``on_text`` (the last ``tail`` lines; with ``follow`` to the job's end); the Outcome's
    data is how the job stood at the end (a LogEnd). A following stopped by Ctrl-C is an Outcome saying so: the job goes on."""
    from gpurig.connect.connection import CommandInterrupted
    from gpurig.jobs.remote import JobAgent
    from gpurig.results import Outcome

    def work(conn: Connection) -> Outcome:
        try:
            end = JobAgent(conn).logs(view.id, on_text, follow=follow, tail=tail, on_wait=on_wait)
        except CommandInterrupted:
            if not conn.interrupted:
                raise
            return Outcome(detail="stopped following the log")  # what was stopped was the reading, not the job
        return Outcome(data=end)

    return work


def cancel_work(view: JobView, grace: float, check: bool = False) -> Callable[[Connection], Outcome]:
    """Cancel the job on its host (TERM, KILL after ``grace`` s, or out of the queue): changed when it stopped it, ok when it had
    ended already (saying how); with ``check`` only what it would do. The Outcome's data is the agent's answer."""
    from gpurig.jobs.remote import JobAgent
    from gpurig.results import Outcome

    def work(conn: Connection) -> Outcome:
        if check:
            return Outcome(status=Status.SKIPPED, detail=f"would cancel job {view.id} ({view.state_text})")
        said = JobAgent(conn).cancel(view.id, grace)
        changed = bool(said.get("changed"))
        detail = f"job {view.id}: {said.get('state')}" + ("" if changed else f" already ({said.get('reason') or 'ended'})")
        return Outcome(status=Status.CHANGED if changed else Status.OK, detail=detail, data=said)

    return work


def on_host_quietly(opts: HostOptions, view: JobView, work: Callable[[Connection], Any], label: str) -> HostResult:
    """``work`` on the job's host with no progress, report or recap; a host that could not be reached or failed is one HostError."""
    from gpurig.connect.fleet import run_fleet

    chosen = [h for h in select_hosts(opts) if h.name == view.host]
    if not chosen:
        raise HostError(f"job {view.id}'s host {view.host} is not among the selected hosts", "select it with -l", host=view.host)
    connector = make_connector(opts)
    try:
        report = run_fleet(chosen, work, connector=connector, forks=1, label=label)
    finally:
        connector.close()
    [result] = report.results
    if result.status not in (Status.OK, Status.CHANGED):
        raise HostError(f"{result.status}: {result.reason or 'no reason given'}", result.fix, host=result.host)
    return result


@dataclass(frozen=True)
class LogTail:
    """The end of a job's log as read: its text (decoded, invalid bytes replaced), how many lines were asked, and whether it was
    cut to MAX_LOG_BYTES."""

    view: JobView
    text: str
    lines: int
    cut: bool = False


def log_tail(opts: HostOptions, wanted: str, lines: int = LOG_TAIL) -> LogTail:
    """The last ``lines`` lines of job ``wanted``'s log (its id or a unique start of it) as ``gpurig logs --job ID --tail N`` reads
    them, from whichever selected host runs it (or Slurm's batch host). No such job: NoSuchJob; a host that could not be asked:
    one line saying so (HostError, or ConfigError when the job could not even be looked for)."""
    from gpurig.flows.jobfind import find_job
    from gpurig.jobs.views import check_job_id

    view = find_job(opts, check_job_id(wanted))
    pieces: list[str] = []
    if view.mode == "slurm":
        from gpurig.slurm.scheduler import follow, the_cluster

        raw: list[bytes] = []
        follow(slurm_reach(opts), the_cluster(opts.settings.inventory), view, raw.append, follow_it=False)
        text = b"".join(raw).decode(errors="replace")
        kept = text.splitlines(keepends=True)[-lines:] if lines else [text]
        pieces = ["".join(kept)]
    else:
        on_host_quietly(opts, view, log_work(view, pieces.append, follow=False, tail=lines), "logs")
    text = "".join(pieces)
    cut = len(text.encode()) > MAX_LOG_BYTES
    if cut:
        text = text.encode()[-MAX_LOG_BYTES:].decode(errors="replace")
    return LogTail(view, text, lines, cut)


@dataclass(frozen=True)
class Cancelled:
    """What ``cancel_job`` did: the job as found, whether it stopped it (False: it had ended already), and the host's words."""

    view: JobView
    changed: bool
    detail: str


def cancel_job(opts: HostOptions, wanted: str, grace: float = CANCEL_GRACE) -> Cancelled:
    """Cancel job ``wanted`` as ``gpurig cancel`` does (TERM, KILL after ``grace`` s; Slurm's through scancel), quietly."""
    from gpurig.flows.jobfind import find_job
    from gpurig.jobs.views import check_job_id

    view = find_job(opts, check_job_id(wanted))
    if view.mode == "slurm":
        from gpurig.slurm.scheduler import cancel, the_cluster

        if view.ended:
            return Cancelled(view, False, f"slurm job {view.id}: {view.state_text} already")
        after = cancel(slurm_reach(opts), the_cluster(opts.settings.inventory), view.id)
        return Cancelled(view, after.state == "cancelled", f"slurm job {view.id}: {after.state_text}")
    result = on_host_quietly(opts, view, cancel_work(view, grace), "cancel")
    return Cancelled(view, result.status == Status.CHANGED, result.reason)
