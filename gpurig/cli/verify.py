"""The ``verify`` task: prove hosts from driver to achieved TFLOP/s, fleet-wide, with a fix for every failure.

Thin: validate the flags and every host's GPU expectation, run
``gpurig.verify.verify_host`` over the fleet, then present one row per host
(its worst status, the failing record and its fix, key figures), every
record with -v, the JSON report (--json) and JUnit XML (--junit).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpurig.cli.options import host_task, select_hosts
from gpurig.files import write_text_report

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.flows.fleettask import HostOptions
    from gpurig.results import FleetReport, Outcome

__all__ = ["verify"]

HELP = {
    "container": "verify inside this deployed container (docker exec) on every selected host",
    "image": "verify a throwaway container of this image (docker run --rm, --gpus all where the host can)",
    "level": "quick (presence and correctness, seconds) | full (adds TFLOP/s, bandwidths, NCCL, a training loop)",
    "junit": "also write JUnit XML for CI: one testcase per probe record per host (- = stdout)",
}

@host_task(help=HELP)
def verify(c, opts: HostOptions, container=None, image=None, level="quick", junit=None):
    """Verify hosts: driver and GPUs, then the container toolkit and torch in a container (--container / --image), quick or full."""
    from gpurig.flows.fleettask import connect_early, exit_for, fleet_document, run_hosts
    from gpurig.flows.fleetverify import SCHEMA, host_rows, record_rows
    from gpurig.inventory.profile import host_profile
    from gpurig.verify.gate import fleet_passed, make_plan, verdict_outcome

    plan = make_plan(container, image, level)
    chosen = select_hosts(opts)
    expect = {h.name: host_profile(h, opts.settings.inventory).gpus for h in chosen}  # every error before any host
    early = connect_early(opts, chosen)
    from gpurig.slurm.conf import NODES_GROUP
    from gpurig.slurm.health import node_record
    from gpurig.verify.junit import junit_xml
    from gpurig.verify.runner import verify_host

    slurm_nodes = {h.name for h in chosen if NODES_GROUP in h.groups}

    def work(conn: Connection) -> Outcome:
        gpus = expect[conn.name]
        verdict = verify_host(conn, plan, gpus.count, gpus.model, gpus.mig)
        if conn.name in slurm_nodes:  # what the scheduler makes of the node: drained, with the health program's reason
            verdict = dataclasses.replace(verdict, records=(*verdict.records, node_record(conn)))
        return verdict_outcome(verdict)

    def annotate(report: FleetReport) -> dict:
        return {"level": plan.level, "target": plan.target or None, "passed": fleet_passed(report)}

    report = run_hosts(opts, chosen, work, label="verify", schema=SCHEMA, annotate=annotate, connector=early)
    if junit:
        write_text_report(junit, junit_xml(report), "--junit")
    columns, rows = (record_rows(report) if opts.verbose else host_rows(report))
    if junit != "-":  # stdout already holds the XML
        opts.show(columns, rows, doc=fleet_document(opts, report, SCHEMA, **annotate(report)))
    exit_for(report)


