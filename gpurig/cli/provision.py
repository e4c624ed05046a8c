"""The ``provision`` task: converge hosts to their inventory profile, step by step.

Thin on purpose: select hosts and steps (--only, --skip), validate every
host's profile before any connection, run ``gpurig.steps.converge`` over the
fleet (once more after a --reboot), then present a per-host per-step table,
the diffs when asked, and the recap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.base import project_spec_files
from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import GpurigError
from gpurig.report import console, err_console, outside
from gpurig.report.tables import Column
from gpurig.status import STATUS_STYLE

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions
    from gpurig.results import FleetReport

__all__ = ["provision"]

SCHEMA = "gpurig.provision/1"


SLURM = "slurm"  # the cluster's steps (gpurig.slurm.cluster), run where the inventory has slurm_controller / slurm_nodes groups
# The steps by name, in the order they run: gpurig.flows.fleetprovision.step_names() (a unit test keeps them equal), written
# out so that reading provision's flags does not import every step.
STEP_NAMES = ("gpus", "nouveau", "driver", "docker", "container-toolkit", "daemon", "gpu-devices", "driver-hold", "fabric-manager", "mig",
              "persistence", "python3", "reboot", SLURM)


HELP = {
    "only": "run only these steps, comma-separated (" + ", ".join(STEP_NAMES) + ")",
    "skip": "leave out these steps, comma-separated",
    "reboot": "let the reboot step reboot hosts that need it (never the machine gpurig runs on), then plan again",
}


@host_task(help=HELP, changes=True)
def provision(c, opts: HostOptions, only=None, skip=None, reboot=False):
    """Bring hosts to a ready GPU container host: gpus, nouveau, driver, docker, container-toolkit, daemon, persistence, python3, reboot."""
    from gpurig.flows.fleetprovision import pick_steps, plan_provision
    from gpurig.flows.fleettask import exit_for, finish, fleet_document, make_connector, run_hosts
    from gpurig.report.changes import host_documents, print_diffs, reason_text, result_rows
    from gpurig.steps.plan import host_results

    names = pick_steps(only, skip)
    chosen = select_hosts(opts)
    # every profile read (every error) before any host is touched
    plan = plan_provision(opts, chosen, names, default_cuda(c) if "driver" in names else None, check=opts.check, diff=opts.diff,
                          reboot=bool(reboot))
    cluster, work = plan.cluster, plan.work
    if plan.left:
        err_console.print(f"slurm: the cluster is provisioned whole: its hosts {', '.join(plan.left)} too", highlight=False)

    def annotate(rep: FleetReport) -> dict:
        return {"converged": rep.exit_code == 0,
                "hosts": host_documents(rep, "steps", lambda s: s.to_dict(opts.diff), durations=True)}

    if cluster is None:
        report = run_hosts(opts, chosen, work, label="provision", schema=SCHEMA, annotate=annotate)
    else:
        from gpurig.slurm.cluster import with_cluster

        report = with_cluster(run_hosts(opts, chosen, work, label="provision", schema=SCHEMA, finished=False), cluster,
                              connect=lambda: make_connector(opts), check=opts.check, diff=opts.diff, forks=opts.settings.forks)
        finish(opts, report, SCHEMA, annotate)
    columns = [Column("host"), Column("step"), Column("status", styles=STATUS_STYLE), Column("reason")]
    opts.show(columns, result_rows(report, lambda s: [reason_text(s)], 1), doc=fleet_document(opts, report, SCHEMA, **annotate(report)))
    if opts.diff and opts.format == "table":
        print_diffs(report, err_console if opts.json == "-" else console)
    for step in (s for r in report.results for s in host_results(r) if s.details.get("warning")):
        err_console.print(f"[yellow]warning: {outside(str(step.details['warning']))}[/]", highlight=False)
    exit_for(report)


def default_cuda(c) -> str | None:
    """The CUDA of the spec's default image, for hosts whose gpurig_images names none; None without a spec."""
    from gpurig.image.spec import load_spec

    try:
        files = project_spec_files(c)
    except GpurigError:
        return None
    spec = load_spec(files[0])  # a broken spec is one clear error, not a silently missing minimum
    return None if spec.default.cuda == "cpu" else spec.default.cuda
