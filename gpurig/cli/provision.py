"""The ``provision`` task: converge hosts to their inventory profile, step by step.

Thin on purpose: select hosts and steps (--only, --skip), validate every
host's profile before any connection, run ``gpurig.steps.converge`` over the
fleet (once more after a --reboot), then present a per-host per-step table,
the diffs when asked, and the recap.
"""

from __future__ import annotations

from pathlib import Path

from gpurig.cli.images import project_spec_files
from gpurig.cli.options import HostOptions, exit_for, fleet_document, host_task, run_hosts, select_hosts
from gpurig.connect.connection import Connection
from gpurig.connect.fleet import FleetReport, Outcome
from gpurig.errors import ConfigError, GpurigError, did_you_mean
from gpurig.image.spec import load_spec
from gpurig.inventory.profile import host_profile
from gpurig.report import console, err_console
from gpurig.report.changes import host_documents, outcome, print_diffs, reason_text, result_rows
from gpurig.report.fleetrun import STATUS_STYLE
from gpurig.report.tables import Column
from gpurig.steps import STEPS, DriverStep, RebootStep, Step, converge_rebooting

__all__ = ["provision"]

SCHEMA = "gpurig.provision/1"


HELP = {
    "only": "run only these steps, comma-separated (" + ", ".join(STEPS) + ")",
    "skip": "leave out these steps, comma-separated",
    "reboot": "let the reboot step reboot hosts that need it (never the machine gpurig runs on), then plan again",
}


@host_task(help=HELP, changes=True)
def provision(c, opts: HostOptions, only=None, skip=None, reboot=False):
    """Bring hosts to a ready GPU container host: gpus, nouveau, driver, docker, container-toolkit, daemon, persistence, python3, reboot."""
    names = pick_steps(only, skip)
    chosen = select_hosts(opts)
    profiles = {h.name: host_profile(h, opts.settings.inventory) for h in chosen}  # every error before any host is touched
    steps = make_steps(names, default_cuda(c) if "driver" in names else None, bool(reboot))

    def work(conn: Connection) -> Outcome:
        results = converge_rebooting(conn, steps, profiles[conn.name], check=opts.check, diff=opts.diff)
        return outcome(results, lambda r: f"step {r.step} failed: {r.reason}")

    def annotate(rep: FleetReport) -> dict:
        return {"converged": rep.exit_code == 0,
                "hosts": host_documents(rep, "steps", lambda s: s.to_dict(opts.diff), durations=True)}

    report = run_hosts(opts, chosen, work, label="provision", schema=SCHEMA, annotate=annotate)
    columns = [Column("host"), Column("step"), Column("status", styles=STATUS_STYLE), Column("reason")]
    opts.show(columns, result_rows(report, lambda s: [reason_text(s)], 1), doc=fleet_document(opts, report, SCHEMA, **annotate(report)))
    if opts.diff and opts.format == "table":
        print_diffs(report, err_console if opts.json == "-" else console)
    exit_for(report)


def pick_steps(only: str | None, skip: str | None) -> list[str]:
    """Step names in run order, narrowed by --only and --skip; an unknown name is a usage error."""
    def names(flag: str, value: str | None) -> list[str]:
        given = [n.strip() for n in (value or "").split(",") if n.strip()]
        for n in given:
            if n not in STEPS:
                raise ConfigError(f"{flag} {n}: no such step{did_you_mean(n, STEPS)}", f"steps: {', '.join(STEPS)}")
        return given

    wanted, left_out = names("--only", only), names("--skip", skip)
    picked = [n for n in STEPS if (not wanted or n in wanted) and n not in left_out]
    if not picked:
        raise ConfigError("--only/--skip leave no step to run", f"steps: {', '.join(STEPS)}")
    return picked


def make_steps(names: list[str], cuda: str | None, reboot: bool) -> list[Step]:
    made: list[Step] = []
    for name in names:
        if name == "driver":
            made.append(DriverStep(default_cuda=cuda, reboot=reboot))
        elif name == "reboot":
            made.append(RebootStep(allowed=reboot, local_machine_id=local_machine_id()))
        else:
            made.append(STEPS[name]())
    return made


def default_cuda(c) -> str | None:
    """The CUDA of the spec's default image, for hosts whose gpurig_images names none; None without a spec."""
    try:
        files = project_spec_files(c)
    except GpurigError:
        return None
    spec = load_spec(files[0])  # a broken spec is one clear error, not a silently missing minimum
    return None if spec.default.cuda == "cpu" else spec.default.cuda


def local_machine_id() -> str | None:
    """This machine's id, so the reboot step can refuse to reboot the machine gpurig runs on."""
    try:
        return Path("/etc/machine-id").read_text().strip() or None
    except OSError:
        return None
