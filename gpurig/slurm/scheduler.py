"""``gpurig run --scheduler slurm``: the same job through the inventory's Slurm cluster, and Slurm's jobs for jobs/logs/cancel/attach.

Library code, driven from Python as from the run and jobs tasks (a
``Reach`` says how the hosts are reached): the nodes get the working
directory and the image over the fleet (as ``run`` gives one host), the
controller ``sbatch`` (or slurmrestd), and a job's log is followed on its
batch host until Slurm says the job ended; the exit code is Slurm's
(``squeue --json``). Jobs are Slurm's by their ids (numbers,
which gpurig's own job ids never are).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig.errors import ConfigError, HostError, InventoryError, counted
from gpurig.jobs.views import NoSuchJob
from gpurig.slurm import health

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.connector import Connector
    from gpurig.jobs.views import JobView
    from gpurig.results import Outcome
    from gpurig.slurm import sbatch
    from gpurig.slurm.cluster import ClusterHosts

POLL_S = 1.0


@dataclass(frozen=True)
class Reach:
    """How the cluster's hosts are reached: a new connector for each fleet run, and how many hosts at once (the task's -f)."""

    connector: Callable[[], Connector]
    forks: int


def the_cluster(source: str | Path) -> ClusterHosts:
    """The inventory's Slurm cluster; one line when it has none, or when its hosts log in as different users."""
    from gpurig.inventory import load_inventory
    from gpurig.slurm.cluster import cluster_hosts

    found = cluster_hosts(load_inventory(source), source)
    if found is None:
        raise InventoryError(f"{source} has no Slurm cluster (groups slurm_controller and slurm_nodes)",
                             "put the controller in slurm_controller and the nodes in slurm_nodes, then gpurig provision them")
    by_user: dict[str, list[str]] = {}
    for h in found.hosts:
        by_user.setdefault(str(h.user or "(ssh's default)"), []).append(h.name)
    if len(by_user) > 1:
        said = "; ".join(f"{user}: {', '.join(names)}" for user, names in sorted(by_user.items()))
        raise InventoryError(f"{source}: the Slurm cluster's hosts log in as different users ({said})",
                             "give every host of slurm_controller and slurm_nodes the same ansible_user (its jobs run as that user on the "
                             "nodes)")
    return found


def fleet(reach: Reach, hosts, work):
    from gpurig.connect.fleet import run_fleet

    connector = reach.connector()
    try:
        return run_fleet(hosts, work, connector=connector, forks=reach.forks, label="slurm")
    finally:
        connector.close()


def hostnames(reach: Reach, cluster: ClusterHosts) -> dict[str, str]:
    """Slurm's NodeName (the host's hostname) -> the inventory's name, for finding a job's batch host."""
    from gpurig.results import Outcome

    report = fleet(reach, cluster.nodes, lambda conn: Outcome(data=conn.run("hostname -s", timeout=30).stdout.strip()))
    return {r.data: r.host for r in report.results if isinstance(r.data, str) and r.data}


@dataclass(frozen=True)
class Submitted:
    job: str
    nodes: tuple[str, ...]
    script: str  # for --check
    via: str = "sbatch"  # or slurmrestd (gpurig_slurm.rest)
    left_out: str = ""  # the partition's nodes Slurm gives no job (not prepared), each with its state and reason
    fan_out: tuple[dict, ...] = ()  # where the nodes passed the image on to each other: FanOut.summary()


# What submit is doing, as it tells ``phase``: before QUEUEING no Slurm job exists; from QUEUEING sbatch may have queued one whose id
# was not read; QUEUED: it did.
PREPARING, QUEUEING, QUEUED = "preparing the nodes", "queueing the job", "queued"


def submit(reach: Reach, cluster: ClusterHosts, target, request, slurm: sbatch.SlurmRequest, *, check: bool = False,
           phase: Callable[[str], None] = lambda step: None) -> Submitted:
    """The partition's usable nodes pass the pre-flight and get the tree and the image, then the controller queues the job.

    Nothing is queued into a partition with fewer usable nodes than the job
    asks for; with ``check`` the same checks run, nothing moves, and the
    script is the answer. ``phase(step)`` hears each step as it begins.
    """
    from gpurig.connect.streams import Streams
    from gpurig.results import Outcome
    from gpurig.slurm import sbatch

    if target.container is None:
        raise ConfigError("--container cannot be used with --scheduler slurm", "Slurm starts the job's container: use --variant or --image")
    login = cluster.controller.user or "root"
    script = sbatch.batch_script(request, slurm, target.container, target.image_ref, login, target.key)
    partition = partition_name(cluster, slurm.partition)
    phase(PREPARING)
    usable, left_out = usable_nodes(reach, cluster, partition, slurm.nodes)
    ready, fan_out = prepare_nodes(reach, usable, target, login, check)
    bad = [r for r in ready.results if not r.succeeded]
    if bad:
        raise HostError(f"{bad[0].host}: {bad[0].reason}", bad[0].fix or "fix the node and run again")
    if check:  # fan_out: the plan (each image's tree and size), nothing moved
        return Submitted("", tuple(h.name for h in usable), script, left_out=left_out, fan_out=tuple(fan_out))
    comment = f"gpurig:{target.key} {' '.join(request.argv)}"[:900]

    via = "slurmrestd" if cluster.settings.rest else "sbatch"

    def queue(conn: Connection) -> Outcome:
        if cluster.settings.rest:
            from gpurig.slurm.rest import RestClient

            return Outcome(data=RestClient.for_login(conn).submit(
                script, name=request.name, workdir=f"{sbatch.folder(login, target.key)}/runs", output=sbatch.log_path(login, target.key, "%j"),
                nodes=slurm.nodes, gpus_per_node=slurm.gpus_per_node, partition=slurm.partition, comment=comment,
                minutes=sbatch.time_limit(request)))
        said = conn.run(sbatch.submit_line(comment), timeout=60, warn=True, streams=Streams(feed=lambda write: write(script.encode())))
        if said.failed:
            raise HostError(f"sbatch refused the job: {(said.stderr or said.stdout).strip()[-300:]}", "see what it says; `sinfo` on the controller",
                            host=conn.name)
        return Outcome(data=sbatch.parse_submitted(said.stdout, conn.name))

    phase(QUEUEING)
    queued = fleet(reach, [cluster.controller], queue).results[0]
    if not queued.succeeded:
        raise HostError(queued.reason, queued.fix, host=queued.host)
    phase(QUEUED)
    return Submitted(str(queued.data), tuple(h.name for h in usable), script, via, left_out, tuple(fan_out))


def prepare_nodes(reach: Reach, nodes, target, login: str, check: bool) -> tuple[Any, list[dict]]:
    """Each node's ``prepare`` over the fleet, and FanOut.summary() where several nodes needed the image built here and passed it
    on to each other as a deploy's hosts do (gpurig.deploy.fanout: the build machine sends it about once; whatever that left open
    is closed after); else no summary. With ``check``, nothing moves and the summary is the plan: the image, its size and tree."""
    fanned = None if target.fan_out is None else target.fan_out(nodes)
    if fanned is None or check:
        plan = [] if fanned is None else fanned[0].plan({target.image_ref: target.image.size})
        if fanned is not None:
            fanned[0].close()  # nothing was started
        return fleet(reach, nodes, lambda conn: prepare(conn, target, login, check)), plan
    fan, deliver = fanned
    fed = dataclasses.replace(target, deliver=deliver)
    try:
        return fleet(reach, nodes, fan.wrap(lambda conn: prepare(conn, fed, login, check))), fan.summary()
    finally:
        fan.close()


def prepare(conn: Connection, target, login: str, check: bool) -> Outcome:
    """One node of the job's: the pre-flight ``run`` does on a host (gpurig.jobs.submit), then (not in check mode) the image and the tree."""
    from gpurig.connect.engineopen import open_engine
    from gpurig.facts import gather_complete
    from gpurig.jobs.remote import JobAgent
    from gpurig.jobs.submit import gpu_request, refuse
    from gpurig.jobs.sync import sync
    from gpurig.results import Outcome
    from gpurig.slurm import sbatch

    facts = gather_complete(conn)
    with open_engine(conn) as engine:
        refuse(conn, engine, target, facts, gpu_request(target, facts, conn.name), runtime=False)  # no runtime: the device files
        if check:
            return Outcome()
        if engine.image(target.image_ref) is None:
            if target.deliver is None:
                raise HostError(f"{target.image_ref} is not on the node", "build it here or push it to the spec's registry", host=conn.name)
            target.deliver(engine, conn, target.image_ref)
    synced = sync(JobAgent(conn), target.key, target.tree)
    conn.run(["mkdir", "-p", "--", f"{sbatch.folder(login, target.key)}/runs"], timeout=30)
    return Outcome(changed=synced.moved > 0)


def usable_nodes(reach: Reach, cluster: ClusterHosts, partition: str, wanted: int) -> tuple[list, str]:
    """The partition's nodes Slurm gives jobs, as the controller says now (and the others as one text); one line when fewer than ``wanted``."""
    from gpurig.results import Outcome

    def ask(conn: Connection) -> Outcome:
        said = conn.run(health.SINFO_CLUSTER, warn=True, timeout=60)
        if said.failed:
            raise HostError(f"sinfo failed, so the partition's nodes could not be checked: {(said.stderr or said.stdout).strip()[-200:]}",
                            "check slurmctld on the controller (gpurig provision)", host=conn.name)
        return Outcome(data=said.stdout)

    asked = fleet(reach, [cluster.controller], ask).results[0]
    if not asked.succeeded:
        raise HostError(asked.reason, asked.fix, host=asked.host)
    good, bad = partition_check(str(asked.data), partition, wanted)
    members = nodes_for(cluster, partition)
    names = {h.name for h in members}
    by_name = {n.name: n.name for n in good} if {n.name for n in good} <= names else hostnames(reach, cluster)
    usable = [h for h in members if h.name in {by_name.get(n.name) for n in good}]
    if len(usable) < wanted:
        raise InventoryError(f"of the nodes Slurm gives jobs in partition {partition} ({', '.join(n.name for n in good)}), "
                             f"{counted(len(usable), 'node')} matched the inventory's slurm_nodes; the job needs {wanted}",
                             "put the cluster's nodes in slurm_nodes and provision them (gpurig provision)")
    return usable, health.nodes_text(bad)


def partition_check(sinfo: str, partition: str, wanted: int) -> tuple[list[health.ClusterNode], list[health.ClusterNode]]:
    """The partition's usable and unusable nodes from the controller's sinfo; a ConfigError naming each node's state and reason when
    fewer than ``wanted`` are usable (the job would wait in the queue for good)."""
    good, bad = health.partition_nodes(health.cluster_nodes(sinfo), partition)
    if len(good) >= wanted:
        return good, bad
    if not good and not bad:
        raise ConfigError(f"Slurm lists no node in partition {partition}", "provision the cluster (gpurig provision), then see `sinfo`")
    said = f"partition {partition} has no node Slurm gives jobs" if not good else \
        f"the job asks for {wanted} nodes; partition {partition} has {len(good)} Slurm gives jobs ({', '.join(n.name for n in good)})"
    ours = any(n.state.reason.startswith("gpurig:") for n in bad)
    fix = ("gpurig's health program drained them: `gpurig verify -l NODE` shows the failing record; the node is resumed once it passes"
           if ours else "resume them (`scontrol update nodename=NODE state=resume` on the controller) or give another --partition")
    raise ConfigError(f"{said}: {health.nodes_text(bad)}", fix)


def partition_name(cluster: ClusterHosts, partition: str | None) -> str:
    """The job's partition: the one asked for (it must be the cluster's), else the default one (the first by name, as slurm.conf says)."""
    names = sorted({p for parts in cluster.partitions.values() for p in parts})
    if partition and partition not in names:
        raise ConfigError(f"the cluster has no partition {partition!r}", f"its partitions: {', '.join(names)}")
    return partition or names[0]


def nodes_for(cluster: ClusterHosts, partition: str | None):
    """The nodes of the job's partition, as the inventory has them."""
    wanted = partition_name(cluster, partition)
    return [h for h in cluster.nodes if wanted in cluster.partitions.get(h.name, ())]


def slurm_jobs(conn: Connection, explain: bool = True) -> list[JobView]:
    """gpurig's jobs in Slurm; with ``explain``, a pending job whose partition has no node Slurm gives jobs says so (one more sinfo)."""
    from gpurig.slurm import sbatch

    said = conn.run(["squeue", "--json", "--states=all"], timeout=60, warn=True)  # 24.11 hides ended jobs otherwise
    if said.failed:
        raise HostError(f"squeue --json failed: {(said.stderr or said.stdout).strip()[-200:]}", "check slurmctld on the controller", host=conn.name)
    views = sbatch.gpurig_jobs(said.stdout, conn.name)
    if not explain or not any(v.state == "pending" for v in views):
        return views
    nodes = conn.run(health.SINFO_CLUSTER, timeout=60, warn=True)
    return [pending_why(v, nodes.stdout) for v in views] if nodes.ok else views


def pending_why(view: JobView, sinfo: str) -> JobView:
    """A pending job's reason (``Resources``) with why, when its partition has no node Slurm gives jobs (each node's state and reason)."""
    partition = str((view.raw.get("slurm") or {}).get("partition") or "")
    if view.state != "pending" or not partition or "," in partition:
        return view
    good, bad = health.partition_nodes(health.cluster_nodes(sinfo), partition)
    if good or not bad:
        return view
    reason = f"{view.reason}; partition {partition} has no node Slurm gives jobs: {health.nodes_text(bad)}"
    return dataclasses.replace(view, reason=reason, raw={**view.raw, "reason": reason})


class Controller:
    """One SSH connection to the cluster's controller, kept for every look at its queue (a poll a second would otherwise be a login a second)."""

    def __init__(self, reach: Reach, cluster: ClusterHosts) -> None:
        self.cluster = cluster
        self.connector = reach.connector()
        self.conn = self.connector.open(cluster.controller)

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()
        self.connector.close()

    def find(self, job: str, explain: bool = False) -> JobView:
        found = [v for v in slurm_jobs(self.conn, explain) if v.id == job]
        if not found:
            raise NoSuchJob(f"no gpurig job {job} in Slurm on {self.cluster.controller.name}",
                              f"see the jobs with `gpurig jobs` (an ended job stays {self.cluster.settings.min_job_age} s: gpurig_slurm.min_job_age)")
        return found[0]


def find(reach: Reach, cluster: ClusterHosts, job: str, explain: bool = False) -> JobView:
    with Controller(reach, cluster) as controller:
        return controller.find(job, explain)


def follow(reach: Reach, cluster: ClusterHosts, view: JobView, out: Callable[[bytes], None], follow_it: bool = True,
           on_wait: Callable[[str, str], None] | None = None) -> JobView:
    """The job's log, each piece handed to ``out`` as it comes (to the job's end with ``follow_it``); how it ended.

    ``on_wait(state, reason)`` hears why a pending job waits (Slurm's reason, with the partition's unusable nodes where it has no
    usable one) each time Slurm's reason changes, and the job's state once it stops waiting.
    """
    with Controller(reach, cluster) as controller:
        return _follow(reach, controller, view, out, follow_it, on_wait or (lambda state, reason: None))


def _follow(reach: Reach, controller: Controller, view: JobView, out: Callable[[bytes], None], follow_it: bool,
            on_wait: Callable[[str, str], None] = lambda state, reason: None) -> JobView:
    from gpurig.connect.streams import Streams
    from gpurig.results import Outcome
    from gpurig.slurm import sbatch

    cluster = controller.cluster
    told = None  # Slurm's own reason last told: why is asked again (one more sinfo) only when it changes
    while follow_it and view.state == "pending":
        if view.reason != told:
            told = view.reason
            on_wait("pending", controller.find(view.id, explain=True).reason)
        time.sleep(POLL_S)  # polling Slurm's queue for the job to start (it has no batch host before)
        view = controller.find(view.id)
    if told is not None:
        on_wait(view.state, view.reason)
    batch = str(view.raw.get("batch_host") or "")
    if not batch:
        view = controller.find(view.id, explain=True)
        said = f"has not started (pending: {view.reason or 'queued'})" if view.state == "pending" else f"never ran on a node ({view.state_text})"
        raise ConfigError(f"job {view.id} {said}", f"see it with `gpurig jobs --job {view.id}`; `gpurig logs --job {view.id} --follow` waits "
                                                   "for it to start")
    # the inventory's name is the hostname on most fleets; else each node is asked its hostname once
    host = batch if batch in {h.name for h in cluster.nodes} else hostnames(reach, cluster).get(batch)
    if host is None:
        raise HostError(f"job {view.id}'s batch host {batch or '(none yet)'} is none of the inventory's nodes", "see `squeue -j ID` on the controller")
    user = (view.raw.get("slurm") or {}).get("user") or cluster.controller.user or "root"
    key = str((view.raw.get("slurm") or {}).get("comment") or "").removeprefix("gpurig:").split(" ", 1)[0]

    def read(conn: Connection) -> Outcome:
        said = conn.run(sbatch.follow_line(sbatch.log_path(user, key, view.id), view.id, follow_it), warn=True, streams=Streams(on_bytes=out))
        return Outcome(data=said.exited)

    fleet(reach, [next(h for h in cluster.nodes if h.name == host)], read)
    end = time.monotonic() + 30
    while follow_it:
        view = controller.find(view.id)
        if view.ended or time.monotonic() > end:
            break
        time.sleep(POLL_S)  # slurmctld records the end a moment after the batch script exits
    return view


def cancel(reach: Reach, cluster: ClusterHosts, job: str) -> JobView:
    with Controller(reach, cluster) as controller:
        view = controller.find(job)
        if view.ended:
            return view
        controller.conn.run(["scancel", job], timeout=60)
        end = time.monotonic() + 60
        while not view.ended and time.monotonic() < end:
            time.sleep(POLL_S)  # scancel returns at once; the job ends when slurmstepd has stopped it
            view = controller.find(job)
        return view
