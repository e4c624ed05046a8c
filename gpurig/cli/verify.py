"""The ``verify`` task: prove hosts from driver to achieved TFLOP/s, fleet-wide, with a fix for every failure.

Thin: validate the flags and select the hosts; then
``gpurig.flows.fleetverify.verify_fleet`` checks every host's GPU
expectation, runs ``gpurig.verify.verify_host`` over the fleet, and presents
one row per host (its worst status, the failing record and its fix, key
figures), every record with -v, the JSON report (--json) and JUnit XML
(--junit). ``--level fabric --image TAG`` is ``gpurig.flows.fabricverify``:
the hosts' all-reduce together, shown the same way as one row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.options import host_task, select_hosts

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions

__all__ = ["verify"]

HELP = {
    "container": "verify inside this deployed container (docker exec) on every selected host",
    "image": "verify a throwaway container of this image (docker run --rm, --gpus all where the host can)",
    "level": "quick (presence and correctness, seconds) | full (adds TFLOP/s, bandwidths, NCCL, a training loop) | "
             "fabric (an all-reduce across the hosts in --image: busbw per size, the slow host or link; gpurig_fabric)",
    "junit": "also write JUnit XML for CI: one testcase per probe record per host (- = stdout)",
}


@host_task(help=HELP)
def verify(c, opts: HostOptions, container=None, image=None, level="quick", junit=None):
    """Verify hosts: driver and GPUs, then the container toolkit and torch in a container (--container / --image); fabric: all together."""
    from gpurig.verify.gate import make_plan

    plan = make_plan(container, image, level)
    if plan.level == "fabric":
        from gpurig.flows.fabricverify import fabric_fleet

        fabric_fleet(opts, select_hosts(opts), plan, junit=junit)
        return
    from gpurig.flows.fleetverify import verify_fleet

    verify_fleet(opts, select_hosts(opts), plan, junit=junit)
