"""A Slurm node as its controller sees it: ``slurm.node`` for verify (drained is a failure, with Slurm's reason) and the state for status.

Asked on the node itself (it has slurm-client, munge and slurm.conf, as
gpurig provisions it): ``sinfo -h -n HOST -o '%T|%E'``, one line. A node the
health program drained carries ``gpurig: <record>: <detail>`` as its reason,
so verify shows why the scheduler stopped giving it jobs. The whole
cluster's view (provision after it converges, ``run --scheduler slurm``
before it submits, ``jobs`` for a pending job) is one ``sinfo -h -N -o
'%N|%P|%T|%E'`` on the controller: ``cluster_nodes`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.connect.connection import Connection
from gpurig.errors import GpurigError
from gpurig.verify.records import Record

SINFO = "sinfo -h -n \"$(hostname -s)\" -o '%T|%E'"
SINFO_CLUSTER = ["sinfo", "-h", "-N", "-o", "%N|%P|%T|%E"]  # a line per node and partition: name, partition (* default), state, reason
HEALTHY = ("idle", "mixed", "allocated", "completing", "planned")
DRAINED = ("drained", "draining", "drain")
FLAGS = "*~#!%$@^-"  # sinfo's state suffixes; * is "not responding": Slurm gives such a node no new job


@dataclass(frozen=True)
class NodeState:
    state: str  # idle, mixed, allocated, drained, draining, down, ... as sinfo's %T says it (flags like * kept out)
    reason: str = ""
    responding: bool = True  # False: sinfo marked the state with *, slurmctld has not heard from the node

    @property
    def healthy(self) -> bool:
        """Whether Slurm gives the node new jobs."""
        return self.state in HEALTHY and self.responding

    @property
    def drained(self) -> bool:
        return self.state in DRAINED

    @property
    def text(self) -> str:
        state = self.state if self.responding else f"{self.state}, not responding"
        return f"{state} ({self.reason})" if self.reason and self.reason != "none" else state


def state_of(state: str, reason: str = "") -> NodeState:
    """A node's state from sinfo's %T and %E (``drained*`` -> drained, not responding)."""
    word = state.strip().lower()
    return NodeState(word.rstrip(FLAGS), reason.strip(), responding="*" not in word)


@dataclass(frozen=True)
class ClusterNode:
    name: str  # Slurm's NodeName (the host's hostname)
    partitions: tuple[str, ...]
    state: NodeState


def cluster_nodes(sinfo: str) -> dict[str, ClusterNode]:
    """``sinfo -h -N -o '%N|%P|%T|%E'`` on the controller: NodeName -> the node, its partitions (no default's *) and state."""
    found: dict[str, ClusterNode] = {}
    for line in sinfo.splitlines():
        parts = line.split("|", 3)
        if len(parts) != 4 or not parts[0].strip():
            continue
        name, partition = parts[0].strip(), parts[1].strip().rstrip("*")
        old = found.get(name)
        partitions = (*old.partitions, partition) if old else (partition,)
        found[name] = ClusterNode(name, partitions, state_of(parts[2], parts[3]))
    return found


def partition_nodes(nodes: dict[str, ClusterNode], partition: str) -> tuple[list[ClusterNode], list[ClusterNode]]:
    """The partition's nodes Slurm gives new jobs, and those it does not (each with its state and reason)."""
    members = [n for n in nodes.values() if partition in n.partitions]
    return [n for n in members if n.state.healthy], [n for n in members if not n.state.healthy]


def nodes_text(nodes: list[ClusterNode]) -> str:
    """``n1 drained (gpurig: host.driver: ...); n2 down (Not responding)``, for one line."""
    return "; ".join(f"{n.name} {n.state.text}" for n in nodes)


def node_state(conn: Connection) -> NodeState | None:
    """The node's state as its controller has it, or None when sinfo gave nothing (Slurm not reachable from there)."""
    try:
        result = conn.run(SINFO, warn=True, timeout=30)
    except GpurigError:
        return None
    line = next((x for x in result.stdout.splitlines() if "|" in x), "") if result.ok else ""
    if not line:
        return None
    state, _, reason = line.partition("|")
    return state_of(state, reason)


def node_record(conn: Connection) -> Record:
    """``slurm.node``: pass while Slurm schedules on the node; fail when it is drained, down or unknown, with the reason."""
    found = node_state(conn)
    if found is None:
        return Record("host", "slurm.node", "fail", detail="the node's Slurm state could not be read (sinfo answered nothing)",
                      fix="check munge and slurmd on the node and slurmctld on the controller (gpurig provision)")
    if found.healthy:
        return Record("host", "slurm.node", "pass", measured=found.state, detail=f"Slurm schedules jobs on it ({found.state})")
    fix = ("the health program resumes it once gpurig's host probe passes; see `gpurig verify` for the failing record"
           if found.reason.startswith("gpurig:") else "see `sinfo -R`; resume it with `scontrol update nodename=NODE state=resume`")
    return Record("host", "slurm.node", "fail", measured=found.state, detail=f"Slurm does not schedule on it: {found.text}", fix=fix)
