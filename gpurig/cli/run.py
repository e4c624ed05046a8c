"""The ``run`` task: a script on a host's GPUs, detached, with ``--wait`` for CI (the log streamed, the script's exit code).

Thin: every flag checked (``gpurig.jobs.request.run_request``) before any
host is contacted, then ``gpurig.flows.jobrun.run_job`` on the one selected
host (gpurig's queue; ``--scheduler slurm`` goes through the inventory's
cluster): the working directory scanned, the job's container resolved
(deploy's settings for the variant, or an explicit image, or a deployed
container), the job submitted. Without ``--wait``
it prints the job's id and returns; the job goes on without this process.
With ``--wait`` it streams the log, fetches the artifacts, prints the summary
(exit code, wall time, GPU use, the diagnosis) on stderr and exits with the
script's exit code. Ctrl-C or SIGTERM then detaches, leaving the job running,
and says how to follow and stop it; with ``--cancel-on-interrupt`` (``gpurig
ci``'s way) it cancels the job instead, as ``gpurig cancel`` does, and says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.base import load_project_spec, remainder_argv
from gpurig.cli.options import exit_with_job, host_task, select_hosts, slurm_reach, to_stdout
from gpurig.errors import ConfigError, GpurigError, InventoryError
from gpurig.files import RUNS
from gpurig.report import console, err_console, outside
from gpurig.strict import validate

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions
    from gpurig.jobs import request as jobspec

__all__ = ["run"]

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


@host_task(help=RUN_HELP, changes=True, iterable=["artifacts", "env", "ulimit"])
def run(c, opts: HostOptions, variant=None, image=None, container=None, gpus=None, share=False, workdir=None, name=None,
        artifacts=None, keep=10, retry=0, timeout=None, grace=10, env=None, ulimit=None, shm_size=None, wait=False, junit=None, into=None,
        spec=None, scheduler="gpurig", nodes=1, partition=None, launcher=None, cancel_on_interrupt=False):
    """Run a script on a host's GPUs: sync the working directory, start it detached (print its id), or --wait for it."""
    from gpurig.flows.jobrun import run_job
    from gpurig.jobs import request as jobspec

    argv = remainder_argv(c)
    request, chosen_into = jobspec.run_request(
        argv, variant=variant, image=image, container=container, gpus=gpus, share=share, workdir=workdir, name=name, artifacts=artifacts,
        keep=keep, retry=retry, timeout=timeout, grace=grace, env=env, ulimit=ulimit, shm_size=shm_size, wait=wait, junit=junit, into=into,
        cancel_on_interrupt=cancel_on_interrupt)
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler {scheduler!r} is not one gpurig knows", f"use {' or '.join(SCHEDULERS)}")
    if scheduler == "slurm":
        return run_slurm(c, opts, request, nodes=jobspec.whole(nodes, "--nodes", 1, 10_000, "2"), partition=partition, launcher=launcher,
                         wait=bool(wait), junit=junit, spec=spec, cancel=bool(cancel_on_interrupt))
    chosen = select_hosts(opts)
    if len(chosen) != 1:
        raise InventoryError(f"run puts a job on one host; the selection picks {len(chosen)}", "narrow it with -l HOST")
    run_job(opts, chosen[0], request, load_spec=lambda: load_project_spec(c, spec), wait=bool(wait), junit=junit, into=chosen_into,
            cancel=bool(cancel_on_interrupt))


def run_slurm(c, opts: HostOptions, request: jobspec.RunRequest, *, nodes: int, partition, launcher, wait: bool, junit, spec,
              cancel: bool = False) -> None:
    """The job through the inventory's Slurm cluster: synced and delivered to every node, queued by sbatch on the controller."""
    from gpurig.flows.fleettask import WaitLines, interrupted
    from gpurig.flows.jobrun import ALWAYS_IGNORED, SCHEMA
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
    stage = [scheduler.PREPARING]
    try:
        submitted = scheduler.submit(reach, cluster, target, request, SlurmRequest(nodes, partition, chosen, per_node), check=opts.check,
                                     phase=lambda step: stage.__setitem__(0, step))
    except KeyboardInterrupt as stop:
        raise interrupted(stop, slurm_not_queued(cluster.controller.name, stage[0], cancel)) from None
    if submitted.left_out:
        err_console.print(f"[yellow]slurm gives these nodes no job, so they get neither the tree nor the image: {outside(submitted.left_out)}[/]",
                          highlight=False)
    if opts.check:
        from gpurig.flows.fleetdeploy import print_plan

        for plan in submitted.fan_out:  # who would pull the image from whom
            print_plan(plan["image"], plan["tree"], plan["size"])
        err_console.print(f"would sync {request.workdir} to {', '.join(submitted.nodes)} and submit to Slurm on {cluster.controller.name}:",
                          highlight=False)
        console.print(outside(submitted.script), highlight=False, soft_wrap=True)
        return
    if submitted.fan_out:
        from gpurig.flows.fleetdeploy import print_fanout

        print_fanout(list(submitted.fan_out), notes=True)
    err_console.print(f"slurm job {submitted.job} on {cluster.controller.name} (through {submitted.via}): follow it with "
                      f"gpurig logs --job {submitted.job} --follow; "
                      f"stop it with gpurig cancel {submitted.job}", highlight=False)
    if opts.json:
        from gpurig.files import write_report
        from gpurig.report.tables import document

        write_report(opts.json, document(SCHEMA, {"job": {"id": submitted.job, "scheduler": "slurm", "via": submitted.via,
                                                          "nodes": list(submitted.nodes),
                                                          **({"fan_out": list(submitted.fan_out)} if submitted.fan_out else {})}}))
    if not wait:
        return
    try:
        view = scheduler.follow(reach, cluster, scheduler.find(reach, cluster, submitted.job), to_stdout, on_wait=WaitLines(submitted.job))
    except KeyboardInterrupt as stop:
        raise interrupted(stop, slurm_after_interrupt(reach, cluster, submitted.job, cancel)) from None
    if junit:
        from gpurig.files import write_text_report
        from gpurig.jobs.views import job_junit

        write_text_report(junit, job_junit([view]), "--junit")
    exit_with_job(view)


def slurm_not_queued(controller: str, stage: str, cancel: bool) -> str:
    """What an interrupt before sbatch answered left: no Slurm job (the nodes were being prepared), or one whose id was not read."""
    from gpurig.slurm import scheduler

    if stage != scheduler.QUEUEING:
        return f"no slurm job was queued (interrupted while {stage}): nothing runs; run again"
    left = " (its id was not read, so --cancel-on-interrupt could not cancel it)" if cancel else ""
    return (f"a slurm job may have been queued on {outside(controller)}: sbatch was sent, its answer not read{left}; see it with gpurig jobs "
            f"-l {outside(controller)} and stop it with gpurig cancel ID")


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


