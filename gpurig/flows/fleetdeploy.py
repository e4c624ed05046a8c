"""Deploying containers over the fleet as `gpurig deploy` shows it: each container's action, image and bytes moved, the access lines.

The deploy task and the CI chain's deploy stage run the same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpurig.flows.fleettask import HostOptions, exit_for, fleet_document, run_hosts
from gpurig.report import console, err_console, outside
from gpurig.report.tables import Column
from gpurig.status import STATUS_STYLE

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.deploy.apply import Target
    from gpurig.image.spec import ImageSpec
    from gpurig.inventory import Host
    from gpurig.results import FleetReport, Outcome
    from gpurig.steps.plan import StepResult

SCHEMA = "gpurig.deploy/1"


def deploy_fleet(opts: HostOptions, chosen: Sequence[Host], image_spec: ImageSpec, *, variant: str | None = None, show_token: bool = False) -> None:
    """The chosen hosts' containers (their gpurig_containers, else one of ``variant``) running their images; the table, diffs and access
    lines; exits non-zero when a host did not succeed. ``show_token``: Jupyter's token in its URL even where no terminal reads it."""
    from gpurig.deploy import containers as container_specs
    from gpurig.deploy.apply import DeployJob, container_doc, deploy_host
    from gpurig.deploy.fanoutwire import fleet_fanout
    from gpurig.deploy.imagesource import counter, local_engine_if_any, mover, resolve
    from gpurig.report.changes import host_documents, print_diffs, result_rows
    from gpurig.report.deliveryprogress import ProgressPrinter
    from gpurig.steps.plan import outcome

    local = local_engine_if_any()
    targets: dict[str, list[Target]] = {}
    for host in chosen:  # every host's containers checked before any connection
        specs, warnings = container_specs.load_containers(host, image_spec, variant=variant, source=opts.settings.inventory)
        for w in warnings:
            err_console.print(f"[yellow]{outside(host.name)}: {outside(w)}[/]")
        targets[host.name] = [resolve(image_spec, s, local) for s in specs]

    printer = ProgressPrinter() if err_console.is_terminal or opts.verbose else None
    plain = mover(image_spec, local, printer)
    # several hosts needing one image: the build machine sends it into the fleet about once (gpurig.deploy.fanout)
    fan = None if opts.check or len(chosen) < 2 else fleet_fanout(
        chosen, targets, opts.settings.inventory, registry=image_spec.registry or None, local=local, plain=plain,
        progress_for=lambda conn, t: counter(printer, conn, t))
    if len(chosen) > 1 and (opts.check or opts.verbose):
        show_tree(chosen, targets, opts, image_spec.registry or None, local)
    job = DeployJob(
        targets=targets, assign_gpus=container_specs.assign_gpus, deliver=fan or plain,
        matrix_cudas=tuple(e.cuda for e in image_spec.matrix), check=opts.check,
        progress=printer.phase if printer is not None else (lambda host, text: None),
        show_token=show_token or (err_console if opts.json == "-" else console).is_terminal,
        serving=fan.serves if fan else (lambda host: ()),
    )

    def work(conn: Connection) -> Outcome:
        return outcome(deploy_host(conn, job), lambda r: f"{r.step}: {r.reason}")

    def annotate(rep: FleetReport) -> dict:
        return {"hosts": host_documents(rep, "containers", container_doc), **({"fan_out": fan.summary()} if fan else {})}

    try:
        report = run_hosts(opts, chosen, fan.wrap(work) if fan else work, label="deploy", schema=SCHEMA, annotate=annotate)
    finally:
        if fan:
            fan.close()  # whatever a host left: caches, links (their one-time keys), forwards, the registry
        if local:
            local.close()
    if fan:
        print_fanout(fan.summary())
    columns = [Column("host"), Column("container"), Column("status", styles=STATUS_STYLE), Column("action"),
               Column("image", drop=2), Column("moved", drop=1), Column("reason")]
    opts.show(columns, result_rows(report, lambda s: deploy_cells(s, opts.check), 4), doc=fleet_document(opts, report, SCHEMA, **annotate(report)))
    out = err_console if opts.json == "-" else console
    if opts.diff and opts.format == "table":
        print_diffs(report, out)
    if opts.format == "table":
        print_access(report, out)
    exit_for(report)


def show_tree(chosen: Sequence[Host], targets: dict[str, list[Target]], opts: HostOptions, registry: str | None, local) -> None:
    """Who would pull from whom (--check, -v), on stderr, with the bytes each source sends where this machine's engine has the image."""
    from gpurig.deploy.fanouttree import plan_tree
    from gpurig.deploy.fanoutwire import members
    from gpurig.deploy.registry import find_registry_binary

    if registry or local is None or find_registry_binary() is None:
        return
    for ref, ms in members(chosen, targets, opts.settings.inventory).items():
        size = next((t.image.size for ts in targets.values() for t in ts if t.image_ref == ref and t.image is not None), 0)
        print_plan(ref, plan_tree(ms), size or 0)


def print_plan(ref: str, tree: Mapping[str, str | None], size: int) -> None:
    """One image's fan-out plan on stderr: who pulls from whom, and with its ``size`` the bytes each source sends."""
    from gpurig.deploy.fanouttree import describe

    err_console.print(f"fan-out of {outside(ref)}:", highlight=False)
    for line in describe(tree, size):
        err_console.print(f"  {outside(line)}", highlight=False, soft_wrap=True)


def print_fanout(summary: list[dict], notes: bool = False) -> None:
    """One line per image: the bytes out of the build machine against the image's size, and what the hosts received; with
    ``notes`` (where no table carries them: a Slurm job's nodes), each host's source and why it did not pull from its parent."""
    from gpurig.deploy.progress import human_size

    for s in summary:
        if not any(h["method"] == "fan-out" for h in s["hosts"].values()):
            continue  # nothing moved this way (the image was on every host, say)
        err_console.print(f"fan-out of {outside(s['image'])}: {human_size(s['sent'])} out of the build machine for {len(s['hosts'])} hosts "
                          f"(the image is {human_size(s['size'])}; {human_size(s['received'])} received in all)", highlight=False, soft_wrap=True)
        for host, h in s["hosts"].items() if notes else ():
            got = "had it already" if h["method"] == "present" else \
                f"{human_size(h['bytes'])} by {h['method']}" + (f" from {h['source']}" if h["source"] else "")
            err_console.print(f"  {outside(host)}: {outside(got)}" + (f" ({outside(h['note'])})" if h.get("note") else ""),
                              highlight=False, soft_wrap=True)


def deploy_cells(s: StepResult, check: bool) -> list[str]:
    """action, image, moved, reason of one container."""
    action = s.changes[0].summary if s.changes else "none"
    action = f"would {action}" if check and s.changes else action
    d = s.details
    moved = moved_cell(d)
    reason = s.reason + (f"\nfix: {s.fix}" if s.fix else "")
    if d.get("delivery_note"):  # why the image took a slower path (e.g. save-load: no docker-registry here)
        reason = f"{reason}\n" if reason else ""
        reason += f"{d['delivery']}: {d['delivery_note']}"
    return [action, d.get("image", ""), moved, reason]


def moved_cell(d: Mapping[str, Any]) -> str:
    """What one delivery moved and how, from its details: "1.10 GB (fan-out from a100-01)"; "" where none happened."""
    from gpurig.deploy.progress import human_size

    source = f" from {d['delivery_source']}" if d.get("delivery_source") else ""
    return f"{human_size(d.get('bytes_moved') or 0)} ({d['delivery']}{source})" if d.get("delivery") else ""


def print_access(report: FleetReport, out) -> None:
    from gpurig.steps.plan import host_results

    for r in report.results:
        for s in host_results(r):
            if s.details.get("access"):
                out.print(f"[bold]{outside(r.host)} {outside(s.step)}[/]")
                for line in s.details["access"]:
                    out.print(outside(line), soft_wrap=True)
