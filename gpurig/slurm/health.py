"""A Slurm node as its controller sees it: ``slurm.node`` for verify (drained is a failure, with Slurm's reason) and the state for status.

Asked on the node itself (it has slurm-client, munge and slurm.conf, as
gpurig provisions it): ``sinfo -h -n HOST -o '%T|%E'``, one line. A node the
health program drained carries ``gpurig: <record>: <detail>`` as its reason,
so verify shows why the scheduler stopped giving it jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.connect.connection import Connection
from gpurig.errors import GpurigError
from gpurig.verify.records import Record

SINFO = "sinfo -h -n \"$(hostname -s)\" -o '%T|%E'"
HEALTHY = ("idle", "mixed", "allocated", "completing", "planned")


@dataclass(frozen=True)
class NodeState:
    state: str  # idle, mixed, allocated, drained, draining, down, ... as sinfo's %T says it (flags like * kept out)
    reason: str = ""

    @property
    def healthy(self) -> bool:
        return self.state in HEALTHY

    @property
    def text(self) -> str:
        return f"{self.state} ({self.reason})" if self.reason and self.reason != "none" else self.state


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
    return NodeState(state.strip().rstrip("*~#!%$@^-").lower(), reason.strip())


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
