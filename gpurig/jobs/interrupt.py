"""What became of ``gpurig run``'s job when a signal (Ctrl-C, SIGTERM) stopped it: the one line run ends with, and ``ending`` for its
JSON report.

Before the submission left, nothing runs on the host. Where the job may exist
(the submission was sent, its answer not read; or the job was followed), the
host is asked before anything is said: the job it made, none, or how to find
it when it could not be asked. With ``cancel`` (--cancel-on-interrupt) the job
is cancelled as ``gpurig cancel`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpurig.connect.fleet import run_fleet
from gpurig.jobs.remote import JobAgent
from gpurig.jobs.submit import STARTING, SUBMITTED, SUBMITTING
from gpurig.jobs.views import JobView, job_view
from gpurig.results import Outcome
from gpurig.strict.validate import printable

if TYPE_CHECKING:
    from gpurig.connect.connector import Connector
    from gpurig.inventory import Host
    from gpurig.jobs.request import RunRequest


FOLLOWING, ENDED = "following", "ended"


def after_interrupt(connector: Callable[[], Connector], host: Host, ended: list | None, job: str, stage: str, request: RunRequest,
                    cancel: bool, ending: dict, wait: bool = True, hint: Callable[[str], str] = lambda job: "") -> str:
    """What became of the job when a signal stopped ``run`` at ``stage`` (``ending`` says it for the report): never started (nothing
    runs), cancelled (``cancel``), left to go on, or already ended. Where the job may exist, the host is asked (connections from
    ``connector()``). ``ended``: what --wait saw of the job's end (run's Waited), None without a report; ``hint(job)``: how a
    person follows and stops the job."""
    where = printable(host.name)
    if stage in STARTING:  # the submission never left: what moved (the image, the synced tree) is reused by the next run
        ending.update(state="not started", reason=f"interrupted while {stage}")
        return f"job {job} was not started on {where} (interrupted while {stage}): nothing runs there; run again"
    if stage == ENDED:
        found = ended or []
        if not found:
            return f"job {job}'s log had ended; see how the job ended with gpurig jobs --job {job}"
        view = found[0].view
        fetch = f"; bring its artifacts with gpurig fetch {job}" if request.artifacts and found[0].fetched is None else ""
        return f"job {job} had already ended ({view.state_text}, exit code {view.exit_status}){fetch}"
    if stage == SUBMITTED and not wait:
        return f"job {job} was submitted on {where} before the interrupt; gpurig leaves it to go on: {hint(job)}"
    if cancel and stage != SUBMITTING:
        return cancel_job(connector, host, job, request.grace, ending)
    looked, problem = look(connector, host, job)
    if stage == SUBMITTING:  # the request was sent, its answer not read: only the host knows whether the job exists
        if problem:
            ending.update(state="unknown", reason=f"interrupted while submitting it; its state could not be read: {problem}")
            return (f"job {job} may have been started on {where} (interrupted while submitting it; {problem}): see it with gpurig jobs "
                    f"--job {job}; stop it with gpurig cancel {job}")
        if looked is None:
            ending.update(state="not started", reason="interrupted while submitting it, before the host made it")
            return f"job {job} was not started on {where} (interrupted while submitting it, before the host made it): nothing runs there; run again"
        if cancel:
            return cancel_job(connector, host, job, request.grace, ending)
        ending.update(state=looked.state, reason=looked.reason, detached=True)
        if looked.ended:
            return f"job {job} was started on {where} before the interrupt and has ended ({looked.state_text}): see it with gpurig jobs --job {job}"
        return f"job {job} was started on {where} before the interrupt ({looked.state_text}) and goes on: {hint(job)}"
    ending.update(detached=True)
    if problem or looked is None:
        ending.update(state="unknown", reason=f"not read after the interrupt: {problem or 'the host no longer lists it'}")
    else:
        ending.update(state=looked.state, reason=looked.reason)
        if looked.ended:
            fetch = f"; bring its artifacts with gpurig fetch {job}" if request.artifacts else ""
            return f"job {job} ended as gpurig stopped following it ({looked.state_text}){fetch}"
    return f"detached from job {job}, which goes on: {hint(job)}"


def look(connector_for: Callable[[], Connector], host: Host, job: str) -> tuple[JobView | None, str]:
    """Job ``job`` as its host has it now (None: the host has no such job), or why it could not be read."""

    connector = connector_for()
    try:
        got = run_fleet([host], lambda conn: Outcome(data=[job_view(conn.name, d) for d in JobAgent(conn).jobs((job,)) if d.get("id") == job]),
                        connector=connector, forks=1, label="jobs").results[0]
    except KeyboardInterrupt:
        return None, "interrupted again while asking the host"
    finally:
        connector.close()
    if not isinstance(got.data, list):
        return None, got.reason or "the host did not answer"
    return (got.data[0] if got.data else None), ""


def cancel_job(connector_for: Callable[[], Connector], host: Host, job: str, grace: float, ending: dict) -> str:
    """--cancel-on-interrupt: the job cancelled as gpurig cancel does; what the host says after it."""

    connector = connector_for()
    try:
        done = run_fleet([host], lambda conn: Outcome(data=JobAgent(conn).cancel(job, grace)), connector=connector, forks=1,
                         label="cancel").results[0]
    except KeyboardInterrupt:
        ending.update(state="unknown", reason="interrupted again while cancelling it")
        return f"interrupted again while cancelling job {job}, which may go on: stop it with gpurig cancel {job}"
    finally:
        connector.close()
    if not isinstance(done.data, dict):
        ending.update(state="unknown", reason=f"the cancel failed: {done.reason}")
        return f"job {job} could not be cancelled ({done.reason}) and may go on: stop it with gpurig cancel {job}"
    state = str(done.data.get("state") or "")
    ending.update(state=state, reason=str(done.data.get("reason") or ""))
    if done.data.get("changed"):
        return f"cancelled job {job} ({state})"
    return f"job {job} had already ended ({state})" if state in ("succeeded", "failed", "cancelled") else \
        f"job {job} is {state} after the cancel: stop it with gpurig cancel {job}"
