"""The ``run`` task: a script on a host's GPUs, detached, with ``--wait`` for CI (the log streamed, the script's exit code).

Thin: every flag checked and the working directory scanned before any host is
contacted; the job's container resolved here (deploy's settings for the
variant, or an explicit image, or a deployed container), then
``gpurig.jobs.submit.submit_job`` on the one selected host. Without ``--wait``
it prints the job's id and returns; the job goes on without this process.
With ``--wait`` it streams the log, fetches the artifacts, prints the summary
(exit code, wall time, GPU use, the diagnosis) on stderr and exits with the
script's exit code. Ctrl-C or SIGTERM then detaches, leaving the job running,
and says how to follow and stop it; with ``--cancel-on-interrupt`` (``gpurig
ci``'s way) it cancels the job instead, as ``gpurig cancel`` does, and says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from gpurig.cli.base import load_project_spec, remainder_argv
from gpurig.cli.options import exit_with_job, host_task, select_hosts, slurm_reach, to_stdout
from gpurig.errors import ConfigError, GpurigError, InventoryError
from gpurig.files import RUNS, output_dir
from gpurig.report import console, err_console, outside
from gpurig.report.tables import Column
from gpurig.status import Status
from gpurig.strict import validate

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.flows.fleettask import HostOptions
    from gpurig.jobs import request as jobspec
    from gpurig.jobs.submit import Submitted
    from gpurig.results import FleetReport, Outcome

if TYPE_CHECKING:
    from gpurig.jobs.artifacts import Fetched
    from gpurig.jobs.summary import GpuUse
    from gpurig.jobs.views import JobView

__all__ = ["run"]

SCHEMA = "gpurig.run/1"
# git's own folders (nested repositories' too: git never sends their contents), and where fetched artifacts land
ALWAYS_IGNORED = (".git", f"/{RUNS}")

RUN_HELP = {
    "variant": "run in a fresh container of this variant of the project's image (default slim), with deploy's settings for it",
    "image": "run in a fresh container of this image instead (name:tag, on this machine or the host)",
    "container": "run inside this deployed container (docker exec) instead of a fresh one; it stays up after the job",
    "gpus": "GPUs for the job: a count (2), all, none, or devices (device=0, 0,1, GPU-uuid); default 1 for a CUDA image on a GPU host",
    "share": "may run on GPUs another container or job holds, where that one shares too",
    "workdir": "the folder synced to the host and used as the job's /workspace, its cwd (default: .)",
    "name": "the job's name in `gpurig jobs` (default: the script's name)",
    "artifacts": "a path in the working directory to bring back when the job ends (repeatable), e.g. checkpoints/",
    "keep": "how many ended jobs of this working directory the host keeps (default 10; older ones are removed)",
    "retry": "run again this many times when the script exits non-zero (never after cancel)",
    "timeout": "stop the job (TERM, then KILL after --grace) when an attempt runs longer: 90, 30m, 2h, 1d",
    "grace": "seconds between TERM and KILL when the job is stopped (default 10)",
    "env": "NAME=VALUE for the job's environment (repeatable); the value reaches the script byte for byte",
    "ulimit": "NAME=N or NAME=SOFT:HARD over the container's ulimits (repeatable; -1 unlimited), e.g. memlock=-1",
    "shm_size": "the job's /dev/shm (default: the container's, 16g unless gpurig_shm_size or its gpurig_containers entry says)",
    "wait": "stream the log until the job ends, fetch its artifacts, exit with its exit code (for CI); Ctrl-C detaches, the job goes on",
    "cancel_on_interrupt": "with --wait, Ctrl-C or SIGTERM cancels the job (as gpurig cancel does) instead of leaving it running",
    "junit": "with --wait, also write the result as JUnit XML to this file (- = stdout)",
    "into": f"where --wait puts the artifacts (default: WORKDIR/{RUNS}/JOB)",
    "spec": "image spec file (default: the one in images/)",
    "scheduler": "gpurig (default: the host's own queue, gpurig's job agent) or slurm (the inventory's Slurm cluster: sbatch on its controller)",
    "nodes": "with --scheduler slurm: how many nodes the job spans (one task a node; MASTER_ADDR, NODE_RANK, NNODES set)",
    "partition": "with --scheduler slurm: the partition (default: the cluster's default)",
    "launcher": "with --scheduler slurm: none (the command on each node) or torchrun (it starts the command with Slurm's rendezvous); "
                "default torchrun for --nodes 2 or more",
}
SCHEDULERS = ("gpurig", "slurm")


@dataclass(frozen=True)
class Waited:
    """What --wait saw after the submission: how the job ended, its artifacts, its GPU use."""

    view: JobView
    fetched: Fetched | None
    use: GpuUse | None
    error: GpurigError | None = None  # fetching the artifacts or the samples failed: the job's result stands, the host fails


@host_task(help=RUN_HELP, changes=True, iterable=["artifacts", "env", "ulimit"])
def run(c, opts: HostOptions, variant=None, image=None, container=None, gpus=None, share=False, workdir=None, name=None,
        artifacts=None, keep=10, retry=0, timeout=None, grace=10, env=None, ulimit=None, shm_size=None, wait=False, junit=None, into=None,
        spec=None, scheduler="gpurig", nodes=1, partition=None, launcher=None, cancel_on_interrupt=False):
    """Run a script on a host's GPUs: sync the working directory, start it detached (print its id), or --wait for it."""
    from gpurig.flows.fleettask import exit_for, interrupted, run_hosts, write_json_report
    from gpurig.jobs import request as jobspec
    from gpurig.jobs.sync import sync_key
    from gpurig.jobs.tree import scan
    from gpurig.results import FleetInterrupted, Outcome

    argv = remainder_argv(c)
    if not argv:
        raise ConfigError("no command given", "gpurig run -l HOST -- python train.py --epochs 3")
    if any("\0" in a for a in argv):
        raise ConfigError("the command holds a NUL byte", "remove it: no process can receive one")
    if sum(bool(x) for x in (variant, image, container)) > 1:
        raise ConfigError("--variant, --image and --container each say where the job runs", "give one of them")
    if junit and not wait:
        raise ConfigError("--junit needs --wait (the result is known only at the end)", "add --wait")
    if cancel_on_interrupt and not wait:
        raise ConfigError("--cancel-on-interrupt needs --wait (without it, gpurig leaves as soon as the job is submitted)", "add --wait")
    # checked as given, before anything resolves it: resolving first followed another user's link unchecked
    chosen_into = output_dir(into, "--into") if into else None
    request = jobspec.RunRequest(
        argv=argv, workdir=Path(workdir or ".").resolve(), variant=None if image or container else (variant or "slim"),
        image=image, container=container, gpus=jobspec.gpus_flag(gpus), share=bool(share), name=jobspec.job_name(argv, name),
        artifacts=jobspec.artifact_flags(artifacts), keep=jobspec.whole(keep, "--keep", 0, jobspec.MAX_KEEP, "10"),
        retry=jobspec.whole(retry, "--retry", 0, jobspec.MAX_RETRY, "2"),
        timeout=jobspec.duration(timeout, "--timeout") if timeout is not None else None,
        grace=float(jobspec.whole(grace, "--grace", 0, 3600, "30")), env=jobspec.env_flags(env),
        ulimits=jobspec.ulimit_flags(ulimit), shm_size=jobspec.shm_flag(shm_size),
    )
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler {scheduler!r} is not one gpurig knows", f"use {' or '.join(SCHEDULERS)}")
    if scheduler == "slurm":
        return run_slurm(c, opts, request, nodes=jobspec.whole(nodes, "--nodes", 1, 10_000, "2"), partition=partition, launcher=launcher,
                         wait=bool(wait), junit=junit, spec=spec, cancel=bool(cancel_on_interrupt))
    chosen = select_hosts(opts)
    if len(chosen) != 1:
        raise InventoryError(f"run puts a job on one host; the selection picks {len(chosen)}", "narrow it with -l HOST")
    host = chosen[0]
    tree = scan(request.workdir, always_ignored=ALWAYS_IGNORED)
    for skipped in tree.skipped:
        err_console.print(f"[yellow]{outside(skipped.path)}: {outside(skipped.why)}[/]", highlight=False)
    from gpurig.jobs.placement import resolve_target

    job = jobspec.new_job_id()
    target = resolve_target(host, request, job, sync_key(request.workdir), tree, check=opts.check,
                            load_spec=lambda: load_project_spec(c, spec), source=opts.settings.inventory)
    into_dir = chosen_into or request.workdir / RUNS / job
    stage = ["submitting"]  # then "following" (the job is on the host), then "ended" (its log ended): what an interrupt leaves
    ending: dict = {}  # what an interrupt did to the job, for the JSON report: detached, or its state after the cancel

    def work(conn: Connection) -> Outcome:
        from gpurig.connect.connection import CommandInterrupted
        from gpurig.jobs.submit import submit_job

        submitted = submit_job(conn, target)
        if opts.check or not wait:
            return Outcome(status=Status.SKIPPED if opts.check else Status.CHANGED, data=RunResult(submitted))
        stage[0] = "following"
        try:
            done = follow(conn, submitted.job, request, into_dir, lambda: stage.__setitem__(0, "ended"))
        except CommandInterrupted:
            if not conn.interrupted:
                raise
            # what became of the job is said once, by the task (the command stopped was gpurig's reading of the log, not the job)
            return Outcome(status=Status.CHANGED, data=RunResult(submitted), detail=f"interrupted; job {submitted.job} was left to go on")
        view = done.view
        if view.state != "succeeded":  # the recap counts a job that exited non-zero as failed, as its exit code says
            why = f"job {view.id} {view.state_text}" + (f"; {done.error.problem}" if done.error else "")
            return Outcome(status=Status.FAILED, data=RunResult(submitted, done), detail=why, fix=done.error.fix if done.error else "")
        if done.error is not None:
            return Outcome(status=Status.FAILED, data=RunResult(submitted, done), detail=done.error.problem, fix=done.error.fix)
        return Outcome(status=Status.CHANGED, data=RunResult(submitted, done))

    try:
        report = run_hosts(opts, chosen, work, label="run", schema=SCHEMA, annotate=lambda rep: {"job": job_doc(rep, ending)},
                           interrupt_recap=not wait)
    except KeyboardInterrupt as stop:  # the fleet's FleetInterrupted, or a second Ctrl-C that cut its stopping short (no report)
        if not wait:
            raise
        stopped = stop.report if isinstance(stop, FleetInterrupted) else None
        if stage[0] == "submitting":  # no job known to be on the host: the recap says where the submission stopped
            from gpurig.report.fleetrun import print_recap

            if stopped is not None:
                print_recap(stopped, err_console)
            raise
        said = after_interrupt(opts, host, stopped, job, stage[0], request, cancel_on_interrupt, ending)
        if stopped is not None:
            write_json_report(opts, stopped, SCHEMA, lambda rep: {"job": job_doc(rep, ending)})
        raise interrupted(stop, said) from None
    show_run(opts, report, wait)
    if junit:
        from gpurig.files import write_text_report
        from gpurig.jobs.views import job_junit

        write_text_report(junit, job_junit([w.view for w in waited(report)]), "--junit")
    done = waited(report)
    if done and done[0].view.exit_status:  # the script's own code, before a failed fetch's 1
        raise Exit(code=done[0].view.exit_status)
    exit_for(report)


def after_interrupt(opts: HostOptions, host, report: FleetReport | None, job: str, stage: str, request: jobspec.RunRequest, cancel: bool,
                    ending: dict) -> str:
    """What became of the job --wait followed when a signal stopped it (``ending`` says it for the report): cancelled (``cancel``),
    left to go on, or already ended."""
    from gpurig.flows.fleettask import follow_hint, make_connector

    if stage == "ended":
        found = waited(report) if report is not None else []
        if not found:
            return f"job {job}'s log had ended; see how the job ended with gpurig jobs --job {job}"
        view = found[0].view
        fetch = f"; bring its artifacts with gpurig fetch {job}" if request.artifacts else ""
        return f"job {job} had already ended ({view.state_text}, exit code {view.exit_status}){fetch}"
    if not cancel:
        ending.update(detached=True)
        return f"detached from job {job}, which goes on: {follow_hint(job)}"
    from gpurig.connect.fleet import run_fleet
    from gpurig.jobs.remote import JobAgent
    from gpurig.results import Outcome

    connector = make_connector(opts)
    try:
        done = run_fleet([host], lambda conn: Outcome(data=JobAgent(conn).cancel(job, request.grace)), connector=connector, forks=1,
                         label="cancel").results[0]
    except KeyboardInterrupt:
        return f"interrupted again while cancelling job {job}, which may go on: stop it with gpurig cancel {job}"
    finally:
        connector.close()
    if not isinstance(done.data, dict):
        return f"job {job} could not be cancelled ({done.reason}) and may go on: stop it with gpurig cancel {job}"
    state = str(done.data.get("state") or "")
    ending.update(state=state, reason=str(done.data.get("reason") or ""))
    if done.data.get("changed"):
        return f"cancelled job {job} ({state})"
    return f"job {job} had already ended ({state})" if state in ("succeeded", "failed", "cancelled") else \
        f"job {job} is {state} after the cancel: stop it with gpurig cancel {job}"


def run_slurm(c, opts: HostOptions, request: jobspec.RunRequest, *, nodes: int, partition, launcher, wait: bool, junit, spec,
              cancel: bool = False) -> None:
    """The job through the inventory's Slurm cluster: synced and delivered to every node, queued by sbatch on the controller."""
    from gpurig.flows.fleettask import interrupted
    from gpurig.jobs.placement import resolve_target
    from gpurig.jobs.sync import sync_key
    from gpurig.jobs.tree import scan
    from gpurig.slurm import scheduler
    from gpurig.slurm.conf import name_problem
    from gpurig.slurm.sbatch import LAUNCHERS, SlurmRequest

    reach = slurm_reach(opts)
    cluster = scheduler.the_cluster(opts.settings.inventory)
    chosen = launcher or ("torchrun" if nodes > 1 else "none")
    if chosen not in LAUNCHERS:
        raise ConfigError(f"--launcher {chosen!r} is not one gpurig knows", f"use {' or '.join(LAUNCHERS)}")
    if partition and name_problem(partition):
        raise ConfigError(f"--partition {validate.excerpt(partition)} is not a partition name", "give it as `sinfo` lists it")
    if request.gpus is not None and (request.gpus.all or request.gpus.ids):
        raise ConfigError("with --scheduler slurm, --gpus is a count per node: Slurm chooses which GPUs", "write e.g. --gpus 1")
    if request.artifacts:
        raise ConfigError("--artifacts is not fetched from Slurm jobs yet",
                          "write them to a shared folder (a dataset volume), or run without --scheduler slurm")
    tree = scan(request.workdir, always_ignored=ALWAYS_IGNORED)
    for skipped in tree.skipped:
        err_console.print(f"[yellow]{outside(skipped.path)}: {outside(skipped.why)}[/]", highlight=False)
    target = resolve_target(cluster.nodes[0], request, "slurm", sync_key(request.workdir), tree, check=opts.check,
                            load_spec=lambda: load_project_spec(c, spec), source=opts.settings.inventory)
    per_node = request.gpus.count if request.gpus is not None else (1 if target.cuda else 0)
    submitted = scheduler.submit(reach, cluster, target, request, SlurmRequest(nodes, partition, chosen, per_node), check=opts.check)
    if submitted.left_out:
        err_console.print(f"[yellow]slurm gives these nodes no job, so they get neither the tree nor the image: {outside(submitted.left_out)}[/]",
                          highlight=False)
    if opts.check:
        err_console.print(f"would sync {request.workdir} to {', '.join(submitted.nodes)} and submit to Slurm on {cluster.controller.name}:",
                          highlight=False)
        console.print(outside(submitted.script), highlight=False, soft_wrap=True)
        return
    err_console.print(f"slurm job {submitted.job} on {cluster.controller.name} (through {submitted.via}): follow it with "
                      f"gpurig logs --job {submitted.job} --follow; "
                      f"stop it with gpurig cancel {submitted.job}", highlight=False)
    if opts.json:
        from gpurig.files import write_report
        from gpurig.report.tables import document

        write_report(opts.json, document(SCHEMA, {"job": {"id": submitted.job, "scheduler": "slurm", "via": submitted.via,
                                                          "nodes": list(submitted.nodes)}}))
    if not wait:
        return
    try:
        view = scheduler.follow(reach, cluster, scheduler.find(reach, cluster, submitted.job), to_stdout)
    except KeyboardInterrupt as stop:
        raise interrupted(stop, slurm_after_interrupt(reach, cluster, submitted.job, cancel)) from None
    if junit:
        from gpurig.files import write_text_report
        from gpurig.jobs.views import job_junit

        write_text_report(junit, job_junit([view]), "--junit")
    exit_with_job(view)


def slurm_after_interrupt(reach, cluster, job: str, cancel: bool) -> str:
    """What became of the Slurm job --wait followed when a signal stopped it: scancelled (``cancel``), or left to go on."""
    from gpurig.flows.fleettask import follow_hint
    from gpurig.slurm import scheduler

    if not cancel:
        return f"detached from slurm job {job}, which goes on: {follow_hint(job)}"
    try:
        after = scheduler.cancel(reach, cluster, job)
    except KeyboardInterrupt:
        return f"interrupted again while cancelling slurm job {job}, which may go on: stop it with gpurig cancel {job}"
    except GpurigError as err:
        return f"slurm job {job} could not be cancelled ({err.problem}) and may go on: stop it with gpurig cancel {job}"
    return f"cancelled slurm job {job} ({after.state_text})" if after.state == "cancelled" else \
        f"slurm job {job} is {after.state_text} after scancel" + ("" if after.ended else f": stop it with gpurig cancel {job}")


def follow(conn: Connection, job: str, request: jobspec.RunRequest, into: Path, log_ended=lambda: None) -> Waited:
    """--wait: the log to stdout until the job ends (then ``log_ended()``), then its artifacts and its GPU use."""
    from gpurig.jobs.artifacts import fetch
    from gpurig.jobs.remote import JobAgent
    from gpurig.jobs.summary import gpu_use
    from gpurig.jobs.views import job_view

    agent = JobAgent(conn)

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    agent.logs(job, out, follow=True)
    log_ended()
    found = agent.jobs((job,))
    view = job_view(conn.name, found[0]) if found else None
    if view is None:
        raise ConfigError(f"job {job} is gone from {conn.name}", "see `gpurig jobs`")
    try:
        fetched = fetch(agent, job, into) if request.artifacts else None
        return Waited(view, fetched, gpu_use(view, agent.samples(job)))
    except GpurigError as err:
        return Waited(view, None, None, err)


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


def job_doc(rep: FleetReport, ending: dict | None = None) -> dict | None:
    found = results_of(rep)
    return {**found[0].to_dict(), **(ending or {})} if found else None


def show_run(opts: HostOptions, report: FleetReport, wait: bool) -> None:
    from gpurig.flows.fleettask import fleet_document

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
