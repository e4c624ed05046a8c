"""Provision over the fleet as ``gpurig provision`` runs it: the steps by name, each host's converge, the Slurm cluster's phase after.

The provision task and the dashboard's drift (``gpurig dashboard --check``)
run the same code: ``provision_fleet`` converges (or, with ``check``, only
plans) the chosen hosts; ``drift`` says per host what a check run found,
in a line. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig.errors import ConfigError, GpurigError, did_you_mean

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.connector import Connector
    from gpurig.flows.fleettask import HostOptions
    from gpurig.inventory import Host
    from gpurig.results import FleetReport, HostResult, Outcome
    from gpurig.steps import Step

SLURM = "slurm"  # the cluster's steps (gpurig.slurm.cluster), run where the inventory has slurm_controller / slurm_nodes groups


def step_names() -> tuple[str, ...]:
    """The steps by name, in the order they run: every host step of gpurig.steps, then the cluster's."""
    from gpurig.steps import STEPS

    return (*STEPS, SLURM)


def pick_steps(only: str | None, skip: str | None) -> list[str]:
    """Step names in run order, narrowed by --only and --skip; an unknown name is a usage error."""
    known = step_names()

    def names(flag: str, value: str | None) -> list[str]:
        given = [n.strip() for n in (value or "").split(",") if n.strip()]
        for n in given:
            if n not in known:
                raise ConfigError(f"{flag} {n}: no such step{did_you_mean(n, known)}", f"steps: {', '.join(known)}")
        return given

    wanted, left_out = names("--only", only), names("--skip", skip)
    picked = [n for n in known if (not wanted or n in wanted) and n not in left_out]
    if not picked:
        raise ConfigError("--only/--skip leave no step to run", f"steps: {', '.join(known)}")
    return picked


def make_steps(names: list[str], cuda: str | None, reboot: bool) -> list[Step]:
    from gpurig.steps import STEPS, DriverStep, RebootStep

    made: list[Step] = []
    for name in names:
        if name == "driver":
            made.append(DriverStep(default_cuda=cuda, reboot=reboot))
        elif name == "reboot":
            made.append(RebootStep(allowed=reboot, local_machine_id=local_machine_id()))
        else:
            made.append(STEPS[name]())
    return made


def default_cuda(root: Path | None) -> str | None:
    """The CUDA of the spec's default image (the project at ``root``), for hosts whose gpurig_images names none; None without a spec."""
    from gpurig.image.spec import find_specs, load_spec

    if root is None:
        return None
    try:
        files = find_specs(root / "images")
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


@dataclass(frozen=True)
class ProvisionPlan:
    """What one provision run does, every profile read (every error before any host): the work per host and the cluster it touches."""

    work: Callable[[Connection], Outcome]
    cluster: Any  # gpurig.slurm.cluster.ClusterHosts, or None when the steps leave Slurm out or the selection touches no cluster
    left: list[str]  # the cluster's hosts the selection left out, provisioned with it


def plan_provision(opts: HostOptions, chosen: Sequence[Host], names: Sequence[str], cuda: str | None, *, check: bool, diff: bool = False,
                   reboot: bool = False) -> ProvisionPlan:
    """The per-host work of provision over ``chosen`` (``check``: plan only, change nothing) and the Slurm cluster it touches."""
    from gpurig.inventory.profile import host_profile
    from gpurig.steps import converge_rebooting
    from gpurig.steps.plan import outcome

    profiles = {h.name: host_profile(h, opts.settings.inventory) for h in chosen}
    cluster: Any = None
    left: list[str] = []
    if SLURM in names:
        from gpurig.slurm.cluster import touched_cluster

        cluster, left = touched_cluster(chosen, opts.settings.inventory)
    steps = make_steps([n for n in names if n != SLURM], cuda if "driver" in names else None, reboot)

    def work(conn: Connection) -> Outcome:
        results = converge_rebooting(conn, steps, profiles[conn.name], check=check, diff=diff) if steps else []
        return outcome(results, lambda r: f"step {r.step} failed: {r.reason}")

    return ProvisionPlan(work, cluster, left)


def check_fleet(opts: HostOptions, chosen: Sequence[Host], connect: Callable[[], Connector]) -> FleetReport:
    """``gpurig provision --check`` over ``chosen`` with every step: what provision would change, each host planned from its facts,
    the Slurm cluster's steps after; nothing is changed (check mode is fixed here, whatever the flags)."""
    from gpurig.connect.fleet import run_fleet

    names = pick_steps(None, None)
    plan = plan_provision(opts, chosen, names, default_cuda(opts.settings.root), check=True)
    connector = connect()
    try:
        report = run_fleet(chosen, plan.work, connector=connector, forks=opts.settings.forks, label="provision --check")
    finally:
        connector.close()
    if plan.cluster is not None:
        from gpurig.slurm.cluster import with_cluster

        report = with_cluster(report, plan.cluster, connect=connect, check=True, diff=False, forks=opts.settings.forks)
    return report


def drift(result: HostResult | None, why: str = "") -> dict[str, Any]:
    """One host's provision drift from a check run: ``in step`` (no step would change anything), ``N steps would change: names``, or
    unknown with why (the host not reached, a step that could not plan, no check run yet). A step that would change and another that
    failed to plan is unknown: what that step would do was not seen."""
    from gpurig.status import Status
    from gpurig.steps.plan import host_results

    if result is None:
        return {"state": "unknown", "why": why or "provision's check has not run yet"}
    steps = list(host_results(result))
    if result.status == Status.UNREACHABLE or not steps and not result.succeeded:
        return {"state": "unknown", "why": f"{result.status}: {result.reason}" if result.reason else str(result.status)}
    failed = [s for s in steps if s.status == Status.FAILED]
    if failed:
        said = "; ".join(f"{s.step}: {s.reason}" for s in failed[:3])
        return {"state": "unknown", "why": f"{len(failed)} step{'s' if len(failed) != 1 else ''} could not plan: {said}",
                "would_change": [s.step for s in steps if s.status == Status.CHANGED]}
    changing = [s for s in steps if s.status == Status.CHANGED]
    if not changing:
        return {"state": "in step", "text": "in step", "steps": len(steps), "would_change": []}
    names = [s.step for s in changing]
    text = f"{len(names)} step{'s' if len(names) != 1 else ''} would change: {', '.join(names)}"
    return {"state": "drift", "text": text, "steps": len(steps), "would_change": names,
            "reasons": {s.step: s.reason for s in changing}}
