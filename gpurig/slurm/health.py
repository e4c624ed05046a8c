"""A Slurm node as its controller sees it: ``slurm.node`` for verify (drained is a failure, with Slurm's reason) and the state for status.

Asked on the node itself (it has slurm-client, munge and slurm.conf, as
gpurig provisions it): ``sinfo -h -n HOST -o '%T|%E|%H'``, one line (state,
reason, and since when the reason holds). A node the
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

SINFO = "sinfo -h -n \"$(hostname -s)\" -o '%T|%E|%H'"
SINFO_CLUSTER = ["sinfo", "-h", "-N", "-o", "%N|%P|%T|%E"]  # a line per node and partition: name, partition (* default), state, reason
HEALTHY = ("idle", "mixed", "allocated", "completing", "planned")
DRAINED = ("drained", "draining", "drain")
FLAGS = "*~#!%$@^-"  # sinfo's state suffixes; * is "not responding": Slurm gives such a node no new job


@dataclass(frozen=True)
class NodeState:
    state: str  # idle, mixed, allocated, drained, draining, down, ... as sinfo's %T says it (flags like * kept out)
    reason: str = ""
    responding: bool = True  # False: sinfo marked the state with *, slurmctld has not heard from the node
    since: str = ""  # when the reason was set, as sinfo's %H says it (2026-12-04T10:31:12); "" when Slurm has none

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


def state_of(state: str, reason: str = "", since: str = "") -> NodeState:
    """A node's state from sinfo's %T, %E and %H (``drained*`` -> drained, not responding; %H's ``Unknown`` -> no time)."""
    word = state.strip().lower()
    when = since.strip()
    return NodeState(word.rstrip(FLAGS), reason.strip(), responding="*" not in word,
                     since="" if when.lower() in ("unknown", "none", "n/a") else when)


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
    found = read_node(conn)
    return found if isinstance(found, NodeState) else None


def read_node(conn: Connection) -> NodeState | str:
    """The node's state as its controller has it (sinfo on the node), or why it could not be read, in one line."""
    try:
        result = conn.run(SINFO, warn=True, timeout=30)
    except GpurigError as err:
        return f"sinfo could not run: {err.problem}"
    if not result.ok:
        said = (result.stderr or result.stdout).strip().splitlines()
        return f"sinfo failed (exit {result.exited}): {said[-1][-200:]}" if said else f"sinfo failed (exit {result.exited})"
    return node_line(result.stdout) or "sinfo answered nothing for this node (is it in slurm.conf, and slurmctld up?)"


def node_line(text: str) -> NodeState | None:
    """The first ``%T|%E|%H`` line of sinfo's answer (or an older ``%T|%E``); None when it holds none."""
    line = next((x for x in text.splitlines() if "|" in x), "")
    if not line:
        return None
    parts = line.split("|")
    if len(parts) == 2:
        return state_of(parts[0], parts[1])
    return state_of(parts[0], "|".join(parts[1:-1]), parts[-1])  # a reason may hold a |; the time never does


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
