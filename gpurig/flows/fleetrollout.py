"""A rollout over the fleet: each host's containers moved to a new image as far as verify passes, canary first, then batches.

The batches are planned by gpurig.deploy.rollplan; each host is moved by
gpurig.deploy.rollhost (deploy's own ``deploy_host``, then ``verify
--container``'s plan, rolling a failed host back to the image id it ran
before); the rollout stops when more hosts failed than ``max_fail`` allows;
then one row per host says what it runs and why. The state file under the
project lets a re-run pick up where an interrupted one stopped. The rollout
task and any Python caller run the same code (``roll_out``).

Where several hosts need the image built here, the earlier batches serve
the later ones (gpurig.deploy.fanout): the tree is planned over the hosts
in batch order, so a host's parent is in its batch or an earlier one, and a
serving host's layer cache runs on a connection the rollout holds (not its
batch's, which ends with the batch) until no host still to come needs it;
``finally`` closes all of it (caches, one-time keys, forwards, those
connections), whether the rollout ended, stopped on --max-fail, failed or
was interrupted.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from gpurig.errors import ConfigError, Finished, counted
from gpurig.files import write_report
from gpurig.report import err_console, outside
from gpurig.report.tables import Column, document
from gpurig.status import Status
from gpurig.strict import validate

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from gpurig.connect.connection import Connection
    from gpurig.connect.connector import Connector
    from gpurig.connect.engine import Engine
    from gpurig.deploy.apply import Target
    from gpurig.deploy.fanout import FanOut
    from gpurig.deploy.rollhost import RolloutJob
    from gpurig.deploy.rollplan import RolloutState
    from gpurig.flows.fleettask import HostOptions
    from gpurig.image.spec import ImageSpec
    from gpurig.inventory import Host
    from gpurig.results import HostResult
    from gpurig.verify.runner import VerifyPlan

SCHEMA = "gpurig.rollout/1"
COLUMNS = [Column("host"), Column("batch", drop=2), Column("runs", drop=1), Column("why")]
MOVED = "moved"  # each JSON row's key for what the host's delivery moved, and from where; the table's why cell says it on a line of its own


def roll_out(opts: HostOptions, chosen: Sequence[Host], image_spec: ImageSpec, plan: VerifyPlan, *, variant: str, to: str, canary: int,
             batch: str, max_fail: int, prune: bool) -> None:
    """``chosen`` moved to the image ``to`` names, ``variant``'s containers, as far as ``plan`` (verify's) passes on each; the table
    (and --json) says what each host runs; exits 1 unless every host runs the new image."""
    from gpurig.deploy import containers as container_specs
    from gpurig.deploy.apply import DeployJob
    from gpurig.deploy.imagesource import local_engine_if_any, mover
    from gpurig.deploy.rollhost import RolloutJob
    from gpurig.deploy.rollplan import SKIPPED, WOULD, RolloutState, batch_label, host_row, on_target, plan_batches, state_path
    from gpurig.flows.fleetdeploy import print_fanout, show_tree
    from gpurig.inventory.profile import host_profile
    from gpurig.report.deliveryprogress import ProgressPrinter

    local = local_engine_if_any()
    with ExitStack() as stack:
        if local:
            stack.callback(local.close)
        ref, image_id = target_image(image_spec, to, variant, local)
        targets = {h.name: host_targets(h, image_spec, variant, ref, local, opts) for h in chosen}
        expect = {h.name: host_profile(h, opts.settings.inventory).gpus for h in chosen}
        state = RolloutState.load(state_path(opts.settings.project, opts.limit, variant), variant=variant, image_ref=ref,
                                  image_id=image_id, level=plan.level, selection=list(opts.limit))
        todo = [h.name for h in chosen if not state.done_on(h.name, image_id, ref)]
        batches = plan_batches(todo, canary, batch)
        labels = {host: batch_label(i, canary) for i, hosts in enumerate(batches) for host in hosts}
        in_order = in_batches(chosen, batches)
        if len(in_order) > 1 and (opts.check or opts.verbose):
            show_tree(in_order, targets, opts, image_spec.registry or None, local)
        if opts.check:
            rows = [[*host_row(h.name, labels.get(h.name, "-"), state.entry(h.name), WOULD if h.name in labels else SKIPPED), ""]
                    for h in chosen]
            present(opts, rows, state, ref, image_id, check=True)
            return
        printer = ProgressPrinter() if err_console.is_terminal or opts.verbose else None
        plain = mover(image_spec, local, printer)
        fan = stack.enter_context(batch_fanout(opts, in_order, targets, image_spec.registry or None, local, plain, printer))
        deploy = DeployJob(targets=targets, assign_gpus=container_specs.assign_gpus, deliver=fan or plain,
                           matrix_cudas=tuple(e.cuda for e in image_spec.matrix),
                           progress=printer.phase if printer is not None else (lambda host, text: None))
        job = RolloutJob(deploy, verifier(plan, expect), state, ref, image_id, plan.level)
        results = run_batches(opts, chosen, batches, labels, job, max_fail, fan)
    fanned = fan.summary() if fan else []
    if fanned:
        print_fanout(fanned)
    rows = [row_for(h.name, labels, results, state) for h in chosen]
    done = on_target((state.entry(h.name) for h in chosen), image_id, ref)
    if prune and done:
        prune_old(opts, chosen, state, image_id)
    present(opts, rows, state, ref, image_id, fan_out=fanned)
    if not done:
        raise Finished(1)


def in_batches(chosen: Sequence[Host], batches: list[list[str]]) -> list[Host]:
    """The hosts the rollout moves, batch after batch: fan-out's tree over them puts every parent in its children's batch or before."""
    by_name = {h.name: h for h in chosen}
    return [by_name[n] for names in batches for n in names]


@contextmanager
def batch_fanout(opts: HostOptions, in_order: Sequence[Host], targets, registry: str | None, local: Engine | None, plain,
                 printer) -> Iterator[FanOut | None]:
    """The rollout's FanOut (None where each host gets the image alone), holding each serving host's connection from a connector
    of its own; on the way out, however it is, every cache, link, forward and held connection is closed."""
    from gpurig.deploy.fanoutwire import fleet_fanout
    from gpurig.deploy.imagesource import counter
    from gpurig.flows.fleettask import make_connector

    if len(in_order) < 2:
        yield None
        return
    by_name = {h.name: h for h in in_order}
    made: list[Connector] = []  # the connector of the held connections, once fan-out is used

    def own(host: str) -> Connection:
        conn = made[0].open(by_name[host])
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        return conn

    fan = fleet_fanout(in_order, targets, opts.settings.inventory, registry=registry, local=local, plain=plain,
                       progress_for=lambda conn, t: counter(printer, conn, t), own=own, label="rollout")
    if fan is None:
        yield None
        return
    made.append(make_connector(opts))
    try:
        yield fan
    finally:
        try:
            fan.close()
        finally:
            made[0].close()


def prune_old(opts: HostOptions, chosen, state: RolloutState, image_id: str) -> None:
    """--prune: the images each host ran before the rollout removed, now that none is needed for a rollback; one line says so."""
    from gpurig.deploy.rollhost import prune_host
    from gpurig.flows.fleettask import run_hosts

    olds = {h.name: [p["image_id"] for p in (state.entry(h.name).get("previous") or {}).values() if p.get("image_id")] for h in chosen}
    report = run_hosts(opts, chosen, lambda conn: prune_host(conn, image_id, olds[conn.name]), label="rollout prune", schema=SCHEMA,
                       finished=False)
    removed = sum(len(r.data or ()) for r in report.results if r.status == Status.CHANGED)
    failed = [f"{r.host}: {r.reason}" for r in report.results if r.status not in (Status.OK, Status.CHANGED)]
    err_console.print(f"rollout: --prune removed {counted(removed, 'old image')}" + (f"; not removed: {'; '.join(failed)}" if failed else ""),
                      highlight=False)


def row_for(host: str, labels: dict[str, str], results: dict[str, HostResult], state: RolloutState) -> list[str]:
    """[host, batch, runs, why, moved]: moved is what its delivery moved, and from where."""
    from gpurig.deploy.rollplan import MOVED, NOT_MOVED, NOT_REACHED, SKIPPED, host_row
    from gpurig.flows.fleetdeploy import moved_cell

    r = results.get(host)
    how = SKIPPED if host not in labels else NOT_REACHED if r is None else MOVED if r.status == Status.CHANGED else NOT_MOVED
    moved = moved_cell(r.data) if r is not None and isinstance(r.data, dict) else ""
    return [*host_row(host, labels.get(host, "-"), state.entry(host), how, r.reason if r is not None else ""), moved]


def run_batches(opts: HostOptions, chosen, batches: list[list[str]], labels: dict[str, str], job: RolloutJob,
                max_fail: int, fan: FanOut | None = None) -> dict[str, HostResult]:
    """Each batch over the fleet in turn, until more hosts failed than ``max_fail``; each reached host's result. ``fan``: the
    rollout's fan-out, told when each batch begins and told of each host's work (the caller closes it)."""
    from gpurig.deploy.rollhost import roll_host
    from gpurig.deploy.rollplan import should_stop
    from gpurig.flows.fleettask import run_hosts

    by_name = {h.name: h for h in chosen}
    results: dict[str, HostResult] = {}

    def work(conn: Connection) -> Any:
        return roll_host(conn, job)

    for i, names in enumerate(batches):
        label = labels[names[0]]
        err_console.print(f"rollout: batch {label}: {', '.join(outside(n) for n in names)}", highlight=False)
        if fan:
            fan.begin(names)
        report = run_hosts(opts, [by_name[n] for n in names], fan.wrap(work) if fan else work, label=f"rollout {label}", schema=SCHEMA,
                           finished=False)
        results.update((r.host, r) for r in report.results)
        failures = sum(1 for r in results.values() if r.status != Status.CHANGED)
        if should_stop(failures, max_fail) and i + 1 < len(batches):
            left = ", ".join(outside(n) for b in batches[i + 1:] for n in b)
            err_console.print(f"[bold red]rollout: stopped: {counted(failures, 'host')} failed, --max-fail {max_fail}; not reached: {left}[/]",
                              highlight=False)
            break
    return results


def verifier(plan: VerifyPlan, expect: dict):
    """``verify --container NAME``'s work on one host: (passed, the first failing record, its fix)."""
    from gpurig.verify.gate import verdict_outcome
    from gpurig.verify.runner import verify_host

    def check(conn: Connection, container: str) -> tuple[bool, str, str]:
        gpus = expect[conn.name]
        verdict = verify_host(conn, dataclasses.replace(plan, container=container), gpus.count, gpus.model, gpus.mig)
        out = verdict_outcome(verdict)
        return out.status != Status.FAILED, out.detail, out.fix

    return check


def target_image(image_spec, to: str, variant: str, local: Engine | None) -> tuple[str, str]:
    """(the reference --to names, its image id here): a bare tag is one of the spec's image; one not built is refused."""
    ref = image_spec.tag_ref(to)
    rule = validate.image_ref_problem(ref)
    if rule:
        raise ConfigError(f"--to {validate.excerpt(to)} {rule}", "give --to a tag of the spec's image (see gpurig images) or a whole reference")
    image = local.image(ref) if local else None
    if image is None and not image_spec.registry:
        raise ConfigError(f"--to {to}: the image {ref} is not built on this machine",
                          f"build it first (gpurig build --variant {variant} --torch X --cuda Y), or pick one `gpurig images` lists")
    return ref, image.id if image else ""


def host_targets(host, image_spec, variant: str, ref: str, local: Engine | None, opts: HostOptions) -> list[Target]:
    """The host's containers of ``variant``, each on the target image."""
    from gpurig.deploy import containers as container_specs
    from gpurig.deploy.imagesource import resolve

    specs, warnings = container_specs.load_containers(host, image_spec, variant=variant, source=opts.settings.inventory)
    for w in warnings:
        err_console.print(f"[yellow]{outside(host.name)}: {outside(w)}[/]")
    return [resolve(image_spec, dataclasses.replace(s, image=ref), local) for s in specs]


def present(opts: HostOptions, rows: list[list[str]], state: RolloutState, ref: str, image_id: str, check: bool = False,
            fan_out: list | None = None) -> None:
    """The table (or tsv/json), and the JSON report (--json): the rows ([*COLUMNS, moved]), each host's state entry, the state file,
    and where fan-out moved the image, who got it from whom (``fan_out``: FanOut.summary())."""
    doc = document(SCHEMA, {"image_ref": ref, "image_id": image_id or None, "level": state.doc.get("level"), "state_file": str(state.path),
                            "rows": [{**{c.json_key: cell for c, cell in zip(COLUMNS, row)}, MOVED: row[-1]} for row in rows],
                            "hosts": [state.entry(row[0]) or {"host": row[0]} for row in rows], **({"fan_out": fan_out} if fan_out else {})},
                   inventory=str(opts.settings.inventory), check=opts.check)
    if opts.json:
        write_report(opts.json, doc)
    title = f"rollout to {ref}" + (" (check: nothing changed)" if check else "")
    # the moved text under the why: a column of its own would fold the others at 80 columns
    table = [[*row[:3], f"{row[3]}\nmoved {row[4]}" if row[4] else row[3]] for row in rows]
    opts.show(COLUMNS, table, title=title, doc=doc)
