"""The ``deploy``, ``status``, ``logs``, ``stop`` and ``rm`` tasks: containers from the inventory's gpurig_containers.

Thin: load the image spec and select the hosts, then
``gpurig.flows.fleetdeploy.deploy_fleet`` checks every host's containers
(all errors before any connection), resolves each container's image on this
machine, runs ``gpurig.deploy.apply.deploy_host`` over the fleet and presents
a table, the diffs, and the access lines (Jupyter URL with its token, ssh
lines) for the person at the terminal. The JSON report never holds a token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.base import load_project_spec
from gpurig.cli.options import container_names, host_task, select_hosts
from gpurig.errors import ConfigError
from gpurig.report.tables import Column
from gpurig.status import STATUS_STYLE, Status

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.flows.fleettask import HostOptions
    from gpurig.results import FleetReport, HostResult, Outcome

__all__ = ["deploy", "status", "stop", "rm"]

STATUS_SCHEMA = "gpurig.status/1"

DEPLOY_HELP = {
    "variant": "the variant to run on hosts whose inventory has no gpurig_containers (slim, ssh, jupyter, full)",
    "spec": "image spec file (default: the one in images/)",
    "show_token": "print Jupyter's token in its URL even when the output is not a terminal (it never goes into --json)",
}


@host_task(help=DEPLOY_HELP, changes=True)
def deploy(c, opts: HostOptions, variant=None, spec=None, show_token=False):
    """Run the images on hosts: GPUs, ports, volumes, keys and tokens from gpurig_containers; move only missing layers."""
    from gpurig.flows.fleetdeploy import deploy_fleet

    image_spec = load_project_spec(c, spec)
    deploy_fleet(opts, select_hosts(opts), image_spec, variant=variant, show_token=bool(show_token))


def outcomes_of(r: HostResult) -> tuple:
    return r.data if isinstance(r.data, tuple) else ()


# --- status, logs, stop, rm ------------------------------------------------------------------


@host_task()
def status(c, opts: HostOptions):
    """gpurig's containers on each host: image, state and health, GPUs, ports, uptime."""
    from gpurig.flows.fleettask import connect_early, exit_for, fleet_document, run_hosts

    chosen = select_hosts(opts)
    early = connect_early(opts, chosen)
    from gpurig.connect.engineopen import open_engine
    from gpurig.deploy.compare import IMAGE_LABEL, NAME_LABEL
    from gpurig.results import Outcome
    from gpurig.slurm.conf import NODES_GROUP
    from gpurig.slurm.health import node_state

    slurm_nodes = {h.name for h in chosen if NODES_GROUP in h.groups}
    states: dict = {}  # a Slurm node's state as its controller sees it (drained, and why)

    def work(conn: Connection) -> Outcome:
        if conn.name in slurm_nodes:
            states[conn.name] = node_state(conn)
        with open_engine(conn) as engine:
            return Outcome(status=Status.OK, data=tuple(engine.containers(label=NAME_LABEL)))

    def annotate(rep: FleetReport) -> dict:
        return {"containers": {r.host: [status_doc(ci) for ci in outcomes_of(r)] for r in rep.results},
                **({"slurm": {h: {"state": s.state, "reason": s.reason} if s else None for h, s in states.items()}} if states else {})}

    report = run_hosts(opts, chosen, work, label="status", schema=STATUS_SCHEMA, annotate=annotate, connector=early)
    columns = [Column("host"), Column("container"), Column("state"), Column("image", drop=2), Column("gpus", drop=3),
               Column("ports", drop=1), Column("up", drop=4)]
    rows = []
    for r in report.results:
        found = outcomes_of(r)
        if r.host in slurm_nodes:
            node = states.get(r.host)
            rows.append([r.host, "(slurm node)", node.text if node else "unknown (sinfo answered nothing)", "", "", "", ""])
        if not found:
            rows.append([r.host, "-", r.status if r.status == "failed" else "none", "", "", "", r.reason])
        for ci in found:
            state = state_text(ci)
            gpus = ",".join(ci.device_ids) if ci.device_ids else "-"
            ports = ", ".join(f"{ip or '*'}:{hp}->{cp}" for ip, hp, cp, _ in ci.ports)
            rows.append([r.host, ci.name, state, ci.labels.get(IMAGE_LABEL) or ci.image, gpus, ports, uptime(ci)])
    doc = fleet_document(opts, report, STATUS_SCHEMA, **annotate(report))
    opts.show(columns, rows, doc=doc)
    exit_for(report)


def state_text(ci) -> str:
    """``running (healthy)``, ``exited (code 137)``: health only while it runs (the engine keeps the last one after a stop)."""
    if ci.status == "exited":
        return f"exited (code {ci.exit_code})"
    return ci.status + (f" ({ci.health})" if ci.health and ci.running else "")


def status_doc(ci) -> dict:
    from gpurig.deploy.compare import IMAGE_LABEL

    return {"name": ci.name, "id": ci.id, "image": ci.labels.get(IMAGE_LABEL) or ci.image, "image_id": ci.image_id,
            "status": ci.status, "health": ci.health if ci.running else None, "exit_code": ci.exit_code, "gpus": list(ci.device_ids or ()),
            "ports": [{"host_ip": ip, "host_port": hp, "container_port": cp, "proto": pr} for ip, hp, cp, pr in ci.ports],
            "started_at": ci.started_at.isoformat() if ci.started_at else None}


def uptime(ci) -> str:
    from datetime import datetime, timezone

    if not ci.started_at:
        return "-"
    s = int((datetime.now(timezone.utc) - ci.started_at).total_seconds())
    return f"{s // 86400}d{s % 86400 // 3600}h" if s >= 86400 else f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _lifecycle(opts: HostOptions, names: list[str], verb: str, act, done_already=lambda ci: "") -> None:
    """The library's ``lifecycle_work`` (gpurig.flows.containerlife, what the dashboard's stop runs too) over the selected hosts,
    with the progress, the table, the JSON report and the exit code."""
    from gpurig.flows.containerlife import lifecycle_work
    from gpurig.flows.fleettask import exit_for, fleet_document, run_hosts

    chosen = select_hosts(opts)
    report = run_hosts(opts, chosen, lifecycle_work(names, act, done_already, opts.check), label=verb, schema=f"gpurig.{verb}/1")
    rows = [[r.host, ", ".join(outcomes_of(r)) or "-", r.status, r.reason] for r in report.results]
    opts.show([Column("host"), Column("containers"), Column("status", styles=STATUS_STYLE), Column("reason")], rows,
              doc=fleet_document(opts, report, f"gpurig.{verb}/1"))
    exit_for(report)


# stop and rm take --name, not a positional: Invoke makes positionals required, and both have a no-name form.
@host_task(help={"name": "containers to stop, comma-separated (default: every gpurig container of the selected hosts)"}, changes=True)
def stop(c, opts: HostOptions, name=None):
    """Stop gpurig's containers (they keep their settings; deploy starts them again)."""
    from gpurig.flows.containerlife import stop_act, stop_done_already

    _lifecycle(opts, container_names(name), "stop", stop_act, done_already=stop_done_already)


@host_task(help={"name": "containers to remove, comma-separated", "all": "remove every gpurig container of the selected hosts"}, changes=True)
def rm(c, opts: HostOptions, name=None, all=False):
    """Remove gpurig's containers (only ones gpurig made; their volumes' host folders stay)."""
    names = container_names(name)
    if not names and not all:
        raise ConfigError("which containers? name them, or say --all", "gpurig rm -l HOST --name NAME[,NAME] (see gpurig status)")
    from gpurig.flows.containerlife import remove_act

    _lifecycle(opts, names, "rm", remove_act)
