"""The ``verify`` task: prove hosts from driver to achieved TFLOP/s, fleet-wide, with a fix for every failure.

Thin: validate the flags and select the hosts; then
``gpurig.flows.fleetverify.verify_fleet`` checks every host's GPU
expectation, runs ``gpurig.verify.verify_host`` over the fleet, and presents
one row per host (its worst status, the failing record and its fix, key
figures), every record with -v, the JSON report (--json) and JUnit XML
(--junit). ``--level fabric --image TAG`` is ``gpurig.flows.fabricverify``:
the hosts' all-reduce together, shown the same way as one row; with
``--scheduler slurm``, ``gpurig.flows.fabricslurm``: the same as one Slurm job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import ConfigError

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions

__all__ = ["verify"]

HELP = {
    "container": "verify inside this deployed container (docker exec) on every selected host",
    "image": "verify a throwaway container of this image (docker run --rm, --gpus all where the host can)",
    "level": "quick (presence and correctness, seconds) | full (adds TFLOP/s, bandwidths, NCCL, a training loop) | "
             "fabric (an all-reduce across the hosts in --image: busbw per size, the slow host or link; gpurig_fabric)",
    "junit": "also write JUnit XML for CI: one testcase per probe record per host (- = stdout)",
    "scheduler": "with --level fabric: gpurig (default: each host over SSH) or slurm (one job over the inventory's Slurm cluster's "
                 "nodes, the rendezvous from Slurm)",
    "partition": "with --scheduler slurm: the partition whose nodes run the job (default: the cluster's default)",
    "pending_timeout": "with --scheduler slurm: seconds the job may wait in the queue before it is cancelled and the level fails "
                       "(default 120)",
}
SCHEDULERS = ("gpurig", "slurm")


@host_task(help=HELP)
def verify(c, opts: HostOptions, container=None, image=None, level="quick", junit=None, scheduler="gpurig", partition=None,
           pending_timeout=None):
    """Verify hosts: driver and GPUs, then the container toolkit and torch in a container (--container / --image); fabric: all together."""
    from gpurig.verify.gate import make_plan

    plan = make_plan(container, image, level)
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler {scheduler!r} is not one gpurig knows", f"use {' or '.join(SCHEDULERS)}")
    if scheduler == "slurm" or partition or pending_timeout is not None:
        from gpurig.flows.fabricslurm import fabric_slurm, slurm_flags

        pending = slurm_flags(plan.level, scheduler, partition, pending_timeout)
        fabric_slurm(opts, plan, partition, pending, junit=junit)
        return
    if plan.level == "fabric":
        from gpurig.flows.fabricverify import fabric_fleet

        fabric_fleet(opts, select_hosts(opts), plan, junit=junit)
        return
    from gpurig.flows.fleetverify import verify_fleet

    verify_fleet(opts, select_hosts(opts), plan, junit=junit)
