"""The fabric job through the cluster's controller: which nodes it may have, sbatch, the wait (bounded while pending), the log, scancel.

Over the SSH connection gpurig already holds to the controller (``Controller``). The nodes are the partition's (or the
selected hosts that are its nodes) that Slurm gives jobs now, as ``sinfo``
says, and what the job left on each is read over SSH once it ended; the others are left out with Slurm's state and reason. A job that stays
pending longer than its bound is cancelled and said with Slurm's reason
(``Stuck``): a fabric that never ran is never a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpurig.errors import HostError
from gpurig.slurm import health
from gpurig.slurm.fabricjob import FOLDER, FabricNode

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.inventory import Host
    from gpurig.jobs.views import JobView
    from gpurig.slurm.cluster import ClusterHosts
    from gpurig.slurm.scheduler import Controller

POLL_S = 1.0
END_GRACE_S = 90.0  # past the job's time limit: slurmctld kills it then, and records its end a moment later
SINFO_GRES = ["sinfo", "-h", "-N", "-o", "%N|%G"]
COMMENT = "gpurig:fabric verify --level fabric"  # gpurig's jobs are those whose comment starts gpurig: (gpurig jobs lists it)


@dataclass(frozen=True)
class Choice:
    """The job's nodes (inventory order), those of the selection Slurm gives no job (host -> state and reason), GPUs per node."""

    nodes: tuple[FabricNode, ...]
    left_out: dict[str, str]
    gpus_per_node: int


def choose(sinfo: str, gres: str, cluster: ClusterHosts, partition: str, wanted: Sequence[Host], names: dict[str, str],
           interfaces: dict[str, str | None]) -> Choice:
    """The partition's nodes among ``wanted`` Slurm gives jobs, from the controller's sinfo; ``names``: inventory name -> NodeName."""
    nodes = health.cluster_nodes(sinfo)
    members = [h for h in wanted if partition in cluster.partitions.get(h.name, ())]
    chosen, left = [], {}
    for h in members:
        node = nodes.get(names.get(h.name, h.name))
        if node is None:
            left[h.name] = f"Slurm lists no node {names.get(h.name, h.name)}"
        elif partition not in node.partitions:
            left[h.name] = f"Slurm has it outside partition {partition}"
        elif not node.state.healthy:
            left[h.name] = f"Slurm gives it no job: {node.state.text}"
        else:
            chosen.append(FabricNode(h.name, node.name, interfaces.get(h.name)))
    return Choice(tuple(chosen), left, gpus_of(gres, [n.node for n in chosen]))


def gpus_of(gres: str, nodes: Sequence[str]) -> int:
    """1 when every node has a gpu gres (sinfo's %G: ``gpu:a100:2``, ``gpu:4(S:0-1)``): each rank gets one GPU; else 0 (gloo on CPUs)."""
    found: dict[str, bool] = {}
    for line in gres.splitlines():
        name, _, said = line.partition("|")
        found[name.strip()] = found.get(name.strip(), False) or any(g.startswith("gpu") for g in said.split(","))
    return 1 if nodes and all(found.get(n) for n in nodes) else 0


def ask_nodes(conn: Connection) -> tuple[str, str]:
    """The controller's sinfo: every node's partitions, state and reason; every node's gres."""
    said = conn.run(health.SINFO_CLUSTER, warn=True, timeout=60)
    gres = conn.run(SINFO_GRES, warn=True, timeout=60)
    if said.failed or gres.failed:
        why = (said.stderr or said.stdout or gres.stderr).strip()[-200:]
        raise HostError(f"sinfo failed, so the nodes Slurm gives jobs could not be read: {why}", "check slurmctld on the controller "
                        "(gpurig provision)", host=conn.name)
    return said.stdout, gres.stdout


def submit(conn: Connection, script: str) -> str:
    """sbatch on the controller, the script on its stdin; the job's id."""
    from gpurig.connect.streams import Streams
    from gpurig.slurm.fabricjob import sbatch_line
    from gpurig.slurm.sbatch import parse_submitted

    said = conn.run(sbatch_line(COMMENT), timeout=60, warn=True, streams=Streams(feed=lambda write: write(script.encode())))
    if said.failed:
        raise HostError(f"sbatch refused the fabric job: {(said.stderr or said.stdout).strip()[-300:]}", "see what it says; `sinfo` on the "
                        "controller", host=conn.name)
    return parse_submitted(said.stdout, conn.name)


@dataclass(frozen=True)
class Stuck:
    """Why the job gave no result: it stayed pending past its bound, or overran its time limit (gpurig cancelled it), or it never ran."""

    detail: str
    fix: str
    ran: bool = False  # it started on its nodes: they may hold its output


def stuck_pending(job: str, waited: float, reason: str, bound: float) -> Stuck | None:
    """The decision while the job is pending: None to wait on; past ``bound`` seconds, why it is given up (Slurm's reason)."""
    if waited < bound:
        return None
    return Stuck(f"slurm job {job} stayed pending for {waited:.0f} s ({reason or 'queued'}) and was cancelled: nothing was measured",
                 "free or resume the nodes Slurm waits for (`sinfo -R`, `squeue` on the controller), or give another --partition; "
                 "--pending-timeout waits longer")


def stuck_ended(view: JobView) -> Stuck | None:
    """A job that ended without running on its nodes (cancelled by someone else, failed to start): why; None when it ran."""
    if view.raw.get("batch_host") and view.started_at is not None:
        return None
    return Stuck(f"slurm job {view.id} never ran ({view.state_text})", f"see it with `gpurig jobs --job {view.id}` and `sacct -j {view.id}`")


def wait(controller: Controller, job: str, pending_s: float, run_s: float, on_wait: Callable[[str, str], None],
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> JobView | Stuck:
    """The job followed to its end: how it ended, or why it was given up (cancelled: pending past ``pending_s``, running past ``run_s``)."""
    start = clock()
    view = controller.find(job)
    told = None
    while view.state == "pending":
        if view.reason != told:
            told = view.reason
            view = controller.find(job, explain=True)  # the partition's unusable nodes, where Slurm's reason is only "Resources"
            on_wait("pending", view.reason)
        stuck = stuck_pending(job, clock() - start, view.reason, pending_s)
        if stuck is not None:
            cancel(controller.conn, job)
            return stuck
        sleep(POLL_S)  # polling Slurm's queue for the job to start
        view = controller.find(job)
    if told is not None:
        on_wait(view.state, view.reason)
    running = clock()
    while not view.ended:
        if clock() - running > run_s:
            cancel(controller.conn, job)
            return Stuck(f"slurm job {job} ran past its {run_s:.0f} s and was cancelled", "see the nodes' docker and slurmd logs; rerun",
                         ran=True)
        sleep(POLL_S)  # polling Slurm's queue for the job to end
        view = controller.find(job)
    return stuck_ended(view) or view


def cancel(conn: Connection, job: str) -> bool:
    """scancel the job; whether scancel took it."""
    return conn.run(["scancel", job], timeout=60, warn=True).ok


def read_log(conn: Connection, job: str) -> str:
    """What the job left on this node (its lines, and on the batch host the batch script's words), removed once read."""
    script = f'cd {FOLDER} 2>/dev/null || exit 0; for f in fabric-"$1".out fabric-"$1".batch; do [ ! -f "$f" ] || cat -- "$f"; done; ' \
             'rm -f -- fabric-"$1".out fabric-"$1".batch'
    said = conn.run(["sh", "-c", script, "gpurig-fabric", job], timeout=60, warn=True)
    if said.failed:
        raise HostError(f"the fabric job's output could not be read: {(said.stderr or said.stdout).strip()[-200:]}",
                        "each node writes it to ~/.cache/gpurig/ of the login user: is that writable there?", host=conn.name)
    return said.stdout
