"""Invoke tasks of the update loop: ``outdated`` (what is newer, and which hosts can run it) and ``promote`` (an alias, on proof)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from gpurig.cli.base import dry_run, load_project_spec, project_root, task
from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import GpurigError, SpecError
from gpurig.files import write_report
from gpurig.report import console, err_console
from gpurig.report.tables import Column, document
from gpurig.strict import validate

if TYPE_CHECKING:
    from gpurig.connect.engine import Engine
    from gpurig.flows.fleettask import HostOptions
    from gpurig.image import outdated as od
    from gpurig.image.basecheck import BaseState
    from gpurig.image.spec import ImageSpec

__all__ = ["outdated", "promote"]

SCHEMA = "gpurig.outdated/1"
COLUMNS = [Column("image"), Column("newer", styles={"current": "green", "unknown": "yellow"}), Column("needs", drop=2), Column("fleet", drop=1)]


@host_task(help={
    "spec": "image spec file (default: the one in images/)",
    "facts": "the fleet's drivers from this `gpurig facts --json` report instead of asking the hosts",
    "fleet": "set each newer CUDA build against the fleet's drivers (--no-fleet: the index and bases only)",
})
def outdated(c, opts: HostOptions, spec=None, facts=None, fleet=True):
    """What is newer: torch releases and the CUDA builds each ships, base images; the driver each needs against the fleet's. Exit 1 when something is."""
    from gpurig.image import outdated as od

    image_spec = load_project_spec(c, spec)
    drivers, fleet_note = _fleet(opts, facts) if fleet else (None, "not checked (--no-fleet)")
    found = _offers(image_spec)
    rows = [row for entry in image_spec.matrix for row in od.newer_rows(entry, found, drivers)]
    bases = _bases(image_spec)
    problems = [*found.problems, *(p for e in image_spec.matrix if (p := od.own_build_missing(e, found)))]
    problems += [f"base {b.ref}: {b.detail}" for b in bases if b.state == "unknown"]
    newer = any(r.newer for r in rows) or any(b.state == "newer" for b in bases)
    unknown = any(r.unknown for r in rows)
    doc = document(SCHEMA, {
        "current": not newer and not problems and not unknown,
        "torch": [vars(r) | {"older_hosts": list(r.older_hosts)} for r in rows],
        "bases": [vars(b) for b in bases],
        "fleet": {"drivers": drivers, "note": fleet_note},
        "problems": problems,
    })
    if opts.json:
        write_report(opts.json, doc)
    table = [[r.entry, r.newer or ("unknown" if r.unknown else "current"), r.unknown or r.needs, r.fleet] for r in rows]
    table += [[f"base {b.ref}", b.state, b.detail, ""] for b in bases]
    opts.show(COLUMNS, table, doc=doc, title=f"fleet: {fleet_note}")
    for line in problems:
        err_console.print(f"[red]cannot tell:[/] {line}", markup=True, highlight=False)
    code = od.exit_code(newer, problems, unknown)
    if code:
        raise Exit(code=code)


def _offers(spec: ImageSpec) -> od.Offers:
    from gpurig.image import outdated as od
    from gpurig.image.build import resolve_ca_bundle
    from gpurig.image.pkgindex import list_all

    places = od.sources(spec)
    if not places:
        raise SpecError(f"{spec.path}: build.offline with no find_links: there is no index to read", "give build.find_links")
    ca = resolve_ca_bundle(spec.build.ca_bundle)
    listings = list_all("torch", spec.python, [s for s, _ in places], cert=str(ca) if ca else None)
    return od.offers(zip(listings, (c for _, c in places)))


def _bases(spec: ImageSpec) -> list[BaseState]:
    from gpurig.connect.engineopen import local_engine
    from gpurig.image.basecheck import BaseState, base_state
    from gpurig.image.baseimage import inspect_image
    from gpurig.image.build import STORE_TIMEOUT_S

    refs = list(dict.fromkeys([spec.base, *(v.base for v in spec.variants.values())]))
    try:
        with local_engine(timeout=STORE_TIMEOUT_S) as engine:
            states = []
            for ref in refs:
                info = engine.image(ref)
                states.append(base_state(ref, inspect_image(engine, ref), info.created if info else "", spec.bootstrap))
            return states
    except GpurigError as e:
        return [BaseState(ref, "unknown", f"no Docker engine to look at it ({e})") for ref in refs]


def _fleet(opts: HostOptions, facts: str | None) -> tuple[dict[str, str | None] | None, str]:
    """GPU host -> driver (None: none loaded), from a facts report or asked of the selected hosts now."""
    from gpurig.connect.fleet import run_fleet
    from gpurig.facts import SUMMARY_PROBES, gather_complete
    from gpurig.flows.fleettask import make_connector
    from gpurig.image import outdated as od

    if facts:
        hosts = od.read_facts_report(facts)
        source = f"from {facts}"
    else:
        if not Path(opts.settings.inventory).exists():
            return None, f"not checked (no inventory at {opts.settings.inventory}; give -i or --facts)"
        connector = make_connector(opts)
        try:
            report = run_fleet(select_hosts(opts), lambda conn: gather_complete(conn, probes=SUMMARY_PROBES), connector=connector,
                               forks=opts.settings.forks, label="facts")
        finally:
            connector.close()
        hosts = report.to_dict()["hosts"]
        source = f"asked {len(hosts)} host" + ("" if len(hosts) == 1 else "s")
    drivers, missing = od.drivers_from_facts(hosts)
    note = f"{len(drivers)} GPU hosts, {source}" + (f"; no facts from {od.compact_names(missing)}" if missing else "")
    return drivers, note


PROMOTE_SCHEMA = "gpurig.promote/1"


@task(positional=["tag"], auto_shortflags=False, help={
    "tag": "the image to promote: a tag of the spec's image (2.14.1-cu130-slim) or a whole reference, built here",
    "as": "the alias to move to it (default stable): REPO:ALIAS, pushed too where the spec has a registry",
    "min_hosts": "how many hosts must have passed verify on this image (as rollouts recorded it) (default 1)",
    "spec": "image spec file (default: the one in images/)",
    "json": "also write the promotion as JSON to this file (- = stdout)",
})
def promote(c, tag, as_="stable", min_hosts=1, spec=None, json=None):
    """Move an alias (stable) to an image only when verify passed on --min-hosts hosts; the build report records who proved it."""
    from gpurig.connect.engineopen import local_engine
    from gpurig.image.build import STORE_TIMEOUT_S

    image_spec = load_project_spec(c, spec)
    ref = _image_ref(image_spec, str(tag))
    alias = str(as_)
    if validate.tag_problem(alias):
        raise SpecError(f"--as {validate.excerpt(alias)} {validate.tag_problem(alias)}", "give --as a tag such as stable or prod")
    alias_ref = f"{ref.rsplit(':', 1)[0]}:{alias}"
    with local_engine(timeout=STORE_TIMEOUT_S) as engine:
        _promote(c, engine, image_spec, ref, alias_ref, tag, min_hosts, json)


def _promote(c, engine: Engine, image_spec: ImageSpec, ref: str, alias_ref: str, tag, min_hosts, json) -> None:
    """promote's work on this machine's engine (closed by the caller)."""
    from gpurig.deploy.rollplan import verified_hosts
    from gpurig.flows.imagebuild import REPORTS_DIR
    from gpurig.image import outdated as od
    from gpurig.image import promote as pm
    from gpurig.image.aliases import named_builds
    from gpurig.image.build import push_one

    info = engine.image(ref)
    if info is None:
        raise SpecError(f"{ref} is not built on this machine", "build it (gpurig build) or pick one `gpurig images` lists")
    root = project_root(c)
    found = pm.proof(info.id, verified_hosts(root, info.id))
    pm.check_enough(ref, found, int(min_hosts), f"gpurig rollout -l GROUP --variant V --to {tag}")
    report = pm.find_report(root / REPORTS_DIR, info.id)
    if report is None:
        raise pm.PromotionRefused(f"{ref} has no build report under {root / REPORTS_DIR}/builds (the promotion is recorded there)",
                                  "promote an image this project's `gpurig build` made")
    before = named_builds(engine, (alias_ref,)).get(alias_ref)
    if dry_run(c):
        console.print(f"would move {alias_ref} to {ref}; verify passed on {od.compact_names(found.names)}")
        return
    engine.tag(info.id, alias_ref)
    pushed = push_one(engine, alias_ref) if image_spec.registry else ""
    entry = pm.record(report, alias_ref, found, int(min_hosts), pushed)
    doc = document(PROMOTE_SCHEMA, {"image": ref, "image_id": info.id, "report": str(report), "before": before, **entry})
    if json:
        write_report(json, doc)
    if json != "-":
        moved = f" (was {before})" if before else ""
        console.print(f"{alias_ref} -> {ref}{moved}: verify passed on {len(found.hosts)} hosts ({od.compact_names(found.names)});"
                      f" recorded in {report}" + (f"; pushed {pushed}" if pushed else ""), highlight=False)


def _image_ref(spec: ImageSpec, tag: str) -> str:
    """A bare tag is one of the spec's image; anything with ':', '/' or '@' is a whole reference."""
    ref = spec.tag_ref(tag)
    problem = validate.image_ref_problem(ref)
    if problem:
        raise SpecError(f"{validate.excerpt(tag)} {problem}", "give a tag of the spec's image (see gpurig images) or a whole reference")
    return ref
