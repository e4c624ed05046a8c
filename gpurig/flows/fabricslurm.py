"""``verify --level fabric --scheduler slurm``: the fabric proof as one Slurm job over the partition's nodes, shown as the SSH path shows it.

The nodes are the partition's (or the selected hosts that are its nodes)
that Slurm gives jobs now; one it gives none is left out with Slurm's state
and reason (``fabric.slurm.nodes``, a warning: Slurm's own health program,
which drains a node whose host probe fails, stands in for the SSH path's
single-host verify). One job (gpurig.slurm.fabricjob) reads every node's
facts and runs one rank a node, the rendezvous from Slurm; its log fills
the FabricRun, judged by gpurig.verify.fabric_checks as over SSH, and where
the busbw falls short each pair of the culprit search is a job of its own.
``fabric.slurm`` says what the job was, or why nothing was measured (then
it is the verdict's failure, without records about facts no job read): too
few nodes, pending past ``--pending-timeout`` (cancelled, with Slurm's
reason), overrun. Ctrl-C cancels the job (scancel) and says so.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpurig.errors import GpurigError, InventoryError
from gpurig.flows.fabricverify import FACTS_PROBE, RANK_PROBE, fabric_records_with_culprit, fabric_verdict, present, sizes_up_to
from gpurig.flows.fleettask import HostOptions, WaitLines, interrupted, select_hosts, slurm_reach
from gpurig.report import err_console, outside

if TYPE_CHECKING:
    from gpurig.inventory import Host
    from gpurig.inventory.profile import FabricSettings
    from gpurig.slurm.cluster import ClusterHosts
    from gpurig.slurm.fabricjob import FabricJob, FabricNode
    from gpurig.slurm.fabricqueue import Stuck
    from gpurig.slurm.scheduler import Controller
    from gpurig.verify.fabric import FabricRun
    from gpurig.verify.records import Record
    from gpurig.verify.runner import VerifyPlan

PENDING_S = 120.0  # --pending-timeout's default


def slurm_record(status: str, detail: str, fix: str = "", measured=None) -> Record:
    from gpurig.verify.fabric_checks import rec

    return rec("fabric.slurm", status, measured, None, "", detail, fix)


def left_out_record(left_out: Mapping[str, str], ran: Sequence[str]) -> Record | None:
    """The selected nodes Slurm gives no job: a warning naming each one's state and reason (the fabric is proven without them)."""
    from gpurig.verify.fabric_checks import rec

    if not left_out:
        return None
    said = "; ".join(f"{host}: {why}" for host, why in left_out.items())
    return rec("fabric.slurm.nodes", "warn", list(left_out), None, "", f"left out of the job: {said}; the fabric is proven for "
               f"{', '.join(ran) or 'no node'} only", "resume them once fixed (`scontrol update nodename=NODE state=resume`), then rerun")


def wanted_nodes(opts: HostOptions, cluster: ClusterHosts) -> list[Host]:
    """The cluster's nodes, or the selected hosts among them when -l/--host/--group/--pattern selects."""
    if not opts.limit:
        return list(cluster.nodes)
    names = {h.name for h in select_hosts(opts)}
    chosen = [h for h in cluster.nodes if h.name in names]
    if not chosen:
        raise InventoryError(f"the selection {' & '.join(opts.limit)} picks none of the Slurm cluster's nodes (slurm_nodes)",
                             "select its nodes, or leave out -l to take the partition's")
    return chosen


def fabric_slurm(opts: HostOptions, plan: VerifyPlan, partition: str | None, pending_s: float = PENDING_S, *,
                 junit: str | None = None) -> None:
    """The fabric level through the inventory's Slurm cluster; exits non-zero unless it passed."""
    from gpurig.inventory.profile import host_profile
    from gpurig.slurm import fabricqueue, health, scheduler
    from gpurig.verify.fabric import FabricRun
    from gpurig.verify.runner import REINSTALL, read_probe

    reach = slurm_reach(opts)
    cluster = scheduler.the_cluster(opts.settings.inventory)
    part = scheduler.partition_name(cluster, partition)
    wanted = wanted_nodes(opts, cluster)
    settings = {h.name: host_profile(h, opts.settings.inventory).fabric for h in cluster.nodes}
    probes = {path: read_probe(path) for path in (FACTS_PROBE, RANK_PROBE)}
    for path, (text, unread) in probes.items():
        if text is None:
            raise GpurigError(f"{path} is not in this gpurig: {unread}", REINSTALL)
    started = time.monotonic()
    with scheduler.Controller(reach, cluster) as ctl:
        sinfo, gres = fabricqueue.ask_nodes(ctl.conn)
        listed = health.cluster_nodes(sinfo)  # by NodeName: the inventory's names on most clusters, else each node's hostname
        names = {h.name: h.name for h in cluster.nodes} if all(h.name in listed for h in wanted) else \
            {host: node for node, host in scheduler.hostnames(reach, cluster).items()}
        choice = fabricqueue.choose(sinfo, gres, cluster, part, wanted, names, {h: s.interface for h, s in settings.items()})
        for host, why in choice.left_out.items():
            err_console.print(f"{outside(host)} is left out of the fabric job: {outside(why)}", highlight=False, soft_wrap=True)
        ran = [n.host for n in choice.nodes]
        extra = [r for r in [left_out_record(choice.left_out, ran)] if r]
        if len(choice.nodes) < 2:
            run = FabricRun(tuple(ran))
            why = f"partition {part} has {len(choice.nodes)} of the selected nodes Slurm gives jobs" + \
                (f" ({', '.join(ran)})" if ran else "") + ": no job was queued"
            fix = "resume the nodes (`sinfo -R` says why each is out), or give another --partition or selection"
            records = [slurm_record("fail", why, fix), *extra]
            present(opts, fabric_verdict(ran, records, plan.image or ""), run, time.monotonic() - started, junit)
            return
        first = settings[choice.nodes[0].host]
        job = fabricqueue_job(choice.nodes, plan.image or "", first, part if partition else None, choice.gpus_per_node)
        run, said = one_job(ctl, reach, cluster, job, probes[FACTS_PROBE][0] or "", probes[RANK_PROBE][0] or "", pending_s)
        records = [said, *extra]
        if said.status == "pass":
            runner = pair_runner(ctl, reach, cluster, job, probes[RANK_PROBE][0] or "", pending_s)
            records += fabric_records_with_culprit(None, run, settings, runner)  # type: ignore[arg-type]
    present(opts, fabric_verdict(run.hosts, records, plan.image or ""), run, time.monotonic() - started, junit)


def fabricqueue_job(nodes: tuple[FabricNode, ...], image: str, first: FabricSettings, partition: str | None, gpus: int,
                    sizes: tuple[int, ...] | None = None, facts: bool = True) -> FabricJob:
    """The job of ``nodes``: rank 0's (``first``'s) port and timeout, the sizes up to its gpurig_fabric.max_size_mb unless given."""
    from gpurig.slurm.fabricjob import FabricJob

    measured = tuple(sizes) if sizes is not None else sizes_up_to(first.max_size_mb)
    return FabricJob(nodes, image, first.port, float(first.timeout), measured, secrets.token_hex(4), partition, gpus, facts)


def one_job(ctl: Controller, reach, cluster: ClusterHosts, job: FabricJob, facts_source: str, rank_source: str,
            pending_s: float) -> tuple[FabricRun, Record]:
    """The job queued, followed and read: the FabricRun its log fills, and ``fabric.slurm`` saying how it went.

    Ctrl-C on the way cancels it (scancel) and ends the task saying so.
    """
    import dataclasses

    from gpurig.slurm import fabricjob, fabricqueue
    from gpurig.verify.fabric import FabricRun

    hosts = tuple(n.host for n in job.nodes)
    run = FabricRun(hosts, interface=job.nodes[0].interface, interfaces={n.host: n.interface for n in job.nodes}, port=job.port)
    script = fabricjob.batch_script(job, facts_source, rank_source)
    try:
        ident = fabricqueue.submit(ctl.conn, script)
    except KeyboardInterrupt as stop:
        raise interrupted(stop, f"sbatch was sent on {outside(cluster.controller.name)}, its answer not read: a fabric job may have been "
                                "queued; see it with gpurig jobs and stop it with gpurig cancel ID") from None
    err_console.print(f"slurm job {ident} on {outside(cluster.controller.name)}: the fabric across {', '.join(hosts)}", highlight=False)
    try:
        ended = fabricqueue.wait(ctl, ident, pending_s, job.minutes * 60 + fabricqueue.END_GRACE_S, WaitLines(ident))
        if isinstance(ended, fabricqueue.Stuck):
            if ended.ran:  # what it left on its nodes goes too
                read_outputs(reach, cluster, job, ident)
            return run, stuck_record(ended)
        text = read_outputs(reach, cluster, job, ident)
    except KeyboardInterrupt as stop:
        done = fabricqueue.cancel(ctl.conn, ident)
        said = f"cancelled slurm job {ident} (scancel)" if done else f"slurm job {ident} may go on: stop it with gpurig cancel {ident}"
        raise interrupted(stop, said) from None
    log = fabricjob.parse_log(text)
    ranks = fabricjob.rank_documents(log, job.nodes)
    run = dataclasses.replace(run, hosts=tuple(ranks), facts=fabricjob.fact_documents(log, job.nodes), ranks=ranks,
                              master=fabricjob.master_address(log))
    if not log.names:
        why = "; ".join(log.other[-3:]) or "nothing"
        return run, slurm_record("fail", f"slurm job {ident} ({ended.state_text}) ran, but no node left its output: {why}",
                                 f"see the job with `sacct -j {ident}` and the nodes' slurmd logs")
    ran = [log.names[i] for i in sorted(log.names)]
    return run, slurm_record("pass", f"slurm job {ident} ran on {', '.join(ran)}" + (f" (partition {job.partition})" if job.partition
                             else "") + f"; rendezvous {log.names.get(0, '?')}:{job.port}", measured=ident)


def stuck_record(stuck: Stuck) -> Record:
    return slurm_record("fail", stuck.detail, stuck.fix)


def read_outputs(reach, cluster: ClusterHosts, job: FabricJob, ident: str) -> str:
    """What the job left on its nodes, read over SSH (all at once) and removed there; a node not read adds a line saying why."""
    from gpurig.results import Outcome
    from gpurig.slurm import fabricqueue, scheduler

    hosts = [h for n in job.nodes for h in cluster.nodes if h.name == n.host]
    report = scheduler.fleet(reach, hosts, lambda conn: Outcome(data=fabricqueue.read_log(conn, ident)))
    return "\n".join(r.data if r.succeeded and isinstance(r.data, str) else f"{r.host}: {r.reason}" for r in report.results)


def pair_runner(ctl: Controller, reach, cluster: ClusterHosts, job: FabricJob, rank_source: str, pending_s: float):
    """The culprit search's runner: each pair (or subset) at the largest size as a Slurm job of its own; each host's rank document."""
    import dataclasses

    def runner(_ranks, subset: Sequence[str], _master: str, _settings, _port: int, sizes: Sequence[int]) -> dict[str, dict]:
        nodes = tuple(n for n in job.nodes if n.host in subset)
        pair = dataclasses.replace(job, nodes=nodes, sizes=tuple(sizes), facts=False, run_id=secrets.token_hex(4))
        run, said = one_job(ctl, reach, cluster, pair, "", rank_source, pending_s)
        return {h: dict(d) for h, d in run.ranks.items()} if said.status == "pass" else {}

    return runner


def slurm_flags(level: str, scheduler: str, partition: str | None, pending_timeout) -> float:
    """--scheduler slurm's flags checked before any host is contacted: the level, the partition's name; the pending bound in seconds."""
    from gpurig.errors import ConfigError
    from gpurig.slurm.conf import name_problem
    from gpurig.strict import validate

    if scheduler != "slurm":
        raise ConfigError("--partition and --pending-timeout go with --scheduler slurm", "add --scheduler slurm, or leave them out")
    if level != "fabric":
        raise ConfigError(f"--scheduler slurm verifies the fabric only (--level {level} runs over SSH)", "add --level fabric, or leave out "
                          "--scheduler")
    if partition and name_problem(partition):
        raise ConfigError(f"--partition {validate.excerpt(partition)} is not a partition name", "give it as `sinfo` lists it")
    if pending_timeout is None:
        return PENDING_S
    try:
        seconds = float(pending_timeout)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 < seconds <= 86_400:
        raise ConfigError(f"--pending-timeout {validate.excerpt(str(pending_timeout))} is not a number of seconds (1 to 86400)",
                          "give e.g. --pending-timeout 300")
    return seconds
