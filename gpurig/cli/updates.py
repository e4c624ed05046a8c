"""Invoke task ``outdated``: what is newer than the versions matrix and the base images, and which hosts can run it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from invoke.exceptions import Exit

from gpurig.cli.images import load_project_spec
from gpurig.cli.options import HostOptions, host_task, make_connector, select_hosts
from gpurig.connect.fleet import run_fleet
from gpurig.errors import GpurigError, SpecError
from gpurig.facts import gather_complete
from gpurig.files import write_report
from gpurig.image import outdated as od
from gpurig.image.basecheck import BaseState, base_state
from gpurig.image.baseimage import inspect_image
from gpurig.image.build import resolve_ca_bundle
from gpurig.image.dockercli import find_client
from gpurig.image.pkgindex import list_all
from gpurig.image.spec import ImageSpec
from gpurig.report import err_console
from gpurig.report.tables import Column, document

__all__ = ["outdated"]

SCHEMA = "gpurig.outdated/1"
COLUMNS = [Column("image"), Column("newer", styles={"current": "green"}), Column("needs", drop=2), Column("fleet", drop=1)]


@host_task(help={
    "spec": "image spec file (default: the one in images/)",
    "facts": "the fleet's drivers from this `gpurig facts --json` report instead of asking the hosts",
    "fleet": "set each newer CUDA build against the fleet's drivers (--no-fleet: the index and bases only)",
})
def outdated(c, opts: HostOptions, spec=None, facts=None, fleet=True):
    """What is newer: torch releases and the CUDA builds each ships, base images; the driver each needs against the fleet's. Exit 1 when something is."""
    image_spec = load_project_spec(c, spec)
    drivers, fleet_note = _fleet(opts, facts) if fleet else (None, "not checked (--no-fleet)")
    found = _offers(image_spec)
    rows = [row for entry in image_spec.matrix for row in od.newer_rows(entry, found, drivers)]
    bases = _bases(image_spec)
    problems = [*found.problems, *(p for e in image_spec.matrix if (p := od.own_build_missing(e, found)))]
    problems += [f"base {b.ref}: {b.detail}" for b in bases if b.state == "unknown"]
    newer = any(r.newer for r in rows) or any(b.state == "newer" for b in bases)
    doc = document(SCHEMA, {
        "current": not newer and not problems,
        "torch": [vars(r) | {"older_hosts": list(r.older_hosts)} for r in rows],
        "bases": [vars(b) for b in bases],
        "fleet": {"drivers": drivers, "note": fleet_note},
        "problems": problems,
    })
    if opts.json:
        write_report(opts.json, doc)
    table = [[r.entry, r.newer or "current", r.needs, r.fleet] for r in rows]
    table += [[f"base {b.ref}", b.state, b.detail, ""] for b in bases]
    opts.show(COLUMNS, table, doc=doc, title=f"fleet: {fleet_note}")
    for line in problems:
        err_console.print(f"[red]cannot tell:[/] {line}", markup=True, highlight=False)
    if problems:
        raise Exit(code=2)
    if newer:
        raise Exit(code=1)


def _offers(spec: ImageSpec) -> od.Offers:
    places = od.sources(spec)
    if not places:
        raise SpecError(f"{spec.path}: build.offline with no find_links: there is no index to read", "give build.find_links")
    ca = resolve_ca_bundle(spec.build.ca_bundle)
    listings = list_all("torch", spec.python, [s for s, _ in places], cert=str(ca) if ca else None)
    return od.offers(zip(listings, (c for _, c in places)))


def _bases(spec: ImageSpec) -> list[BaseState]:
    refs = list(dict.fromkeys([spec.base, *(v.base for v in spec.variants.values())]))
    try:
        client = find_client()
        states = []
        for ref in refs:
            info = client.inspect_image(ref)
            states.append(base_state(ref, inspect_image(client, ref), (info or {}).get("Created", ""), spec.bootstrap))
        return states
    except GpurigError as e:
        return [BaseState(ref, "unknown", f"no Docker engine to look at it ({e})") for ref in refs]


def _fleet(opts: HostOptions, facts: str | None) -> tuple[dict[str, str | None] | None, str]:
    """GPU host -> driver (None: none loaded), from a facts report or asked of the selected hosts now."""
    if facts:
        hosts = _report_hosts(facts)
        source = f"from {facts}"
    else:
        if not Path(opts.settings.inventory).exists():
            return None, f"not checked (no inventory at {opts.settings.inventory}; give -i or --facts)"
        connector = make_connector(opts)
        try:
            report = run_fleet(select_hosts(opts), gather_complete, connector=connector, forks=opts.settings.forks, label="facts")
        finally:
            connector.close()
        hosts = report.to_dict()["hosts"]
        source = f"asked {len(hosts)} host" + ("" if len(hosts) == 1 else "s")
    drivers, missing = od.drivers_from_facts(hosts)
    note = f"{len(drivers)} GPU hosts, {source}" + (f"; no facts from {od.compact_names(missing)}" if missing else "")
    return drivers, note


def _report_hosts(path: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"--facts {path}: cannot read it as JSON ({e})", "write it with `gpurig facts --json FILE`") from None
    hosts = data.get("hosts") if isinstance(data, dict) else None
    if not isinstance(hosts, list) or data.get("schema") != "gpurig.facts/1":
        raise SpecError(f"--facts {path}: not a gpurig facts report (schema gpurig.facts/1)", "write it with `gpurig facts --json FILE`")
    return hosts
