"""What is newer than the versions matrix: torch releases and their CUDA builds, and who in the fleet can run them.

The package index is read per CUDA flavour (the spec's torch_index with
each known CUDA tag, the spec's pip_index for PyPI's own build, find-links
folders where the spec builds offline); a version's flavour is its local
label (``2.15.0+cu130``). Each newer CUDA build is set against the driver
it needs (gpurig/image/compat.py) and the drivers the fleet's facts report.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpurig.errors import SpecError
from gpurig.image import compat
from gpurig.image.pkgindex import Listing, Source, index_source, links_source
from gpurig.image.spec import ImageSpec, MatrixEntry
from gpurig.strict import validate
from gpurig.strict.reader import load_json
from gpurig.strict.yamlnode import Node

PYPI = "https://pypi.org/simple"
_TAG = re.compile(r"^cu(\d+)(\d)$")


@dataclass(frozen=True)
class Newer:
    """One row: a matrix entry and a newer build it could move to (``newer`` and ``unknown`` empty: it is current)."""

    entry: str  # '2.14.1 cu130'
    newer: str = ""  # '2.15.0 cu130'
    needs: str = ""  # 'driver >= 580.65.06'
    fleet: str = ""  # '3 of 12 hosts older: a100-[01:03]'
    older_hosts: tuple[str, ...] = ()
    unknown: str = ""  # why it cannot be told: an index that was not read, or none asked for this flavour


@dataclass(frozen=True)
class Offers:
    """(torch version, CUDA) -> offered, from every source; ``problems`` names the sources that did not answer.

    ``unread``: flavour ('13.0', 'cpu'; '' for a source of every flavour: pip_index, find-links) -> why the source
    that offers it was not read. ``asked``: the flavours some source was read for, or showed a build of.
    """

    builds: frozenset[tuple[str, str]]
    problems: tuple[str, ...]
    unread: Mapping[str, str] = field(default_factory=dict)
    asked: frozenset[str] = frozenset()


def cuda_of_tag(tag: str) -> str:
    """'cu130' -> '13.0', 'cpu' -> 'cpu' (the inverse of compat.cuda_tag)."""
    found = _TAG.match(tag)
    return f"{found.group(1)}.{found.group(2)}" if found else tag


def candidate_cudas(spec: ImageSpec) -> list[str]:
    """The CUDAs worth asking for: every one gpurig knows a wheel or a driver for from the matrix's oldest on (an
    older one is no upgrade), and the next minors and major after the newest, which a new torch may bring."""
    known = {c for r in compat.TORCH_RELEASES for c in r.cuda} | {r.cuda for r in compat.CUDA_RELEASES}
    mine = {e.cuda for e in spec.matrix if not e.is_cpu}
    major, minor = max(compat.version_key(c) for c in known | mine)[:2]
    known |= mine | {f"{major}.{minor + 1}", f"{major}.{minor + 2}", f"{major + 1}.0"}
    oldest = min((compat.version_key(c) for c in mine), default=(0,))
    return sorted((c for c in known if compat.version_key(c) >= oldest), key=compat.version_key) + [compat.CPU]


def sources(spec: ImageSpec) -> list[tuple[Source, str]]:
    """(where pip looks, the CUDA its unlabelled versions are) for this spec; '' = read the flavour from the label."""
    build = spec.build
    links = [(links_source(build.find_links), "")] if build.find_links else []
    if build.offline:
        return links
    template = build.torch_index
    if not template:  # the torch index is off: pip's own index (and find-links) only
        return [(index_source(build.pip_index or PYPI), "")] + links
    found = [(index_source(template.format(cuda_tag=compat.cuda_tag(c), cuda=c)), c) for c in candidate_cudas(spec)]
    if "{" not in template:
        found = found[:1]
    return list(dict.fromkeys(found)) + [(index_source(build.pip_index or PYPI), "")] + links


def offers(listings: Iterable[tuple[Listing, str]]) -> Offers:
    builds: set[tuple[str, str]] = set()
    failed: dict[str, list[str]] = {}
    unread: dict[str, str] = {}
    asked: set[str] = set()
    for listing, cuda in listings:
        if listing.error:
            failed.setdefault(listing.error, []).append(listing.source.label)
            unread.setdefault(cuda, f"pip could not read {listing.source.label}: {listing.error}")
        elif cuda:
            asked.add(cuda)
        for version in listing.versions:
            base, _, label = version.partition("+")
            flavour = cuda_of_tag(label) if label else (cuda or _pypi_cuda(base))
            if flavour:
                builds.add((base, flavour))
    problems = (f"pip could not read {_places(labels)}: {reason}" for reason, labels in failed.items())
    asked |= {c for _, c in builds}
    return Offers(frozenset(builds), tuple(problems), unread, frozenset(asked))


def _places(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{labels[0]} and {len(labels) - 1} more indexes"


def _pypi_cuda(version: str) -> str:
    """The CUDA of PyPI's own torch build; '' for a torch newer than gpurig's table (which build it is, is not known)."""
    minor = compat.torch_minor(version)
    return next((r.pypi_cuda for r in compat.TORCH_RELEASES if r.minor == minor), "")


def entry_label(entry: MatrixEntry) -> str:
    return f"{entry.torch} {entry.cuda_tag}"


def newer_rows(entry: MatrixEntry, found: Offers, drivers: Mapping[str, str | None] | None) -> list[Newer]:
    """The newest release, in the entry's CUDA and each newer one, and the newest patch of the entry's own minor."""
    mine = compat.version_key(entry.torch)
    later = sorted({v for v, _ in found.builds if compat.version_key(v) > mine}, key=compat.version_key, reverse=True)
    if not later:
        return [Newer(entry_label(entry), unknown=unread_reason(entry, found))]
    rows = [_row(entry, later[0], c, drivers) for c in _flavours(entry, later[0], found)]
    patch = next((v for v in later if compat.torch_minor(v) == compat.torch_minor(entry.torch)), None)
    if patch and patch != later[0] and (patch, entry.cuda) in found.builds:
        rows.append(_row(entry, patch, entry.cuda, drivers))
    wanted = "CPU" if entry.is_cpu else f"{entry.cuda_tag} or newer CUDA"
    return rows or [Newer(entry_label(entry), needs=f"the newest, {later[0]}, has no {wanted} build", unknown=unread_reason(entry, found))]


def unread_reason(entry: MatrixEntry, found: Offers) -> str:
    """Why "nothing newer" cannot be said of ``entry``: a source that offers its flavour (or a newer CUDA) was not
    read, or no source was asked for its flavour at all; '' when every source that could offer one answered."""
    if "" in found.unread:
        return found.unread[""]
    mine = compat.version_key(entry.cuda) if not entry.is_cpu else None
    for cuda, why in found.unread.items():
        if cuda == entry.cuda or (mine and cuda != compat.CPU and compat.version_key(cuda) >= mine):
            return why
    if entry.cuda not in found.asked:
        return f"no index offering {entry.cuda_tag} builds was read (is build.torch_index set?)"
    return ""


def _flavours(entry: MatrixEntry, version: str, found: Offers) -> list[str]:
    shipped = [c for v, c in found.builds if v == version]
    if entry.is_cpu:
        return [c for c in shipped if c == compat.CPU]
    mine = compat.version_key(entry.cuda)
    return sorted((c for c in shipped if c != compat.CPU and compat.version_key(c) >= mine), key=compat.version_key)


def _row(entry: MatrixEntry, version: str, cuda: str, drivers: Mapping[str, str | None] | None) -> Newer:
    label = f"{version} {compat.cuda_tag(cuda)}"
    if cuda == compat.CPU:
        return Newer(entry_label(entry), label, "no driver", "any host")
    minimum = next((r.min_driver for r in compat.CUDA_RELEASES if r.cuda == cuda), None)
    if minimum is None:
        return Newer(entry_label(entry), label, "driver: unknown to gpurig (add CUDA to compat.py)", "cannot tell")
    older = tuple(sorted(h for h, d in (drivers or {}).items() if d is None or not compat.driver_at_least(d, minimum)))
    return Newer(entry_label(entry), label, f"driver >= {minimum}", fleet_text(older, drivers), older)


def fleet_text(older: tuple[str, ...], drivers: Mapping[str, str | None] | None) -> str:
    if drivers is None:
        return "not checked"
    if not drivers:
        return "no GPU hosts"
    if not older:
        return f"all {len(drivers)} hosts ok"
    return f"{len(older)} of {len(drivers)} hosts older: {compact_names(older)}"


def own_build_missing(entry: MatrixEntry, found: Offers) -> str:
    """A line when the index does not offer the build the image installs: the index read is not the build's."""
    if (entry.torch, entry.cuda) in found.builds:
        return ""
    return f"{entry_label(entry)}: the index offers no torch {entry.torch} {entry.cuda_tag}, which this image installs (is torch_index right?)"


def exit_code(newer: bool, problems: Sequence[str], unknown: bool = False) -> int:
    """`gpurig outdated`'s exit status: 2 when it cannot tell (an index, an own build or a base it could not read, or a row no
    index was asked for, whatever else is newer: "current" would be a guess), 1 when something is newer, 0 when all is current."""
    if problems or unknown:
        return 2
    if newer:
        return 1
    return 0


def compact_names(names: Iterable[str]) -> str:
    """'a100-01', 'a100-02', 'a100-03', 'h100-07' -> 'a100-[01:03],h100-07' (Ansible's range syntax, for -l)."""
    runs: list[tuple[str, int, int, int]] = []  # prefix, first, last, digits
    plain = []
    for name in sorted(names, key=lambda n: (re.sub(r"\d+$", "", n), len(n), n)):
        found = re.match(r"^(.*?)(\d+)$", name)
        if not found:
            plain.append(name)
            continue
        prefix, number, width = found.group(1), int(found.group(2)), len(found.group(2))
        if runs and runs[-1][0] == prefix and runs[-1][3] == width and runs[-1][2] == number - 1:
            runs[-1] = (prefix, runs[-1][1], number, width)
        else:
            runs.append((prefix, number, number, width))
    parts = [f"{p}{a:0{w}d}" if a == b else f"{p}[{a:0{w}d}:{b:0{w}d}]" for p, a, b, w in runs]
    return ",".join(plain + parts)


FACTS_SCHEMA = "gpurig.facts/1"
FACTS_FIX = "write it with `gpurig facts --json FILE`"
DRIVER_VERSION = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,3}")
# A full facts report is some tens of KiB a host: room for thousands of hosts, and no more than that is read.
FACTS_LIMIT = 64 * 2**20


def read_facts_report(path: str) -> list[dict]:
    """The hosts of a `gpurig facts --json` report, each checked as drivers_from_facts reads it; SpecError with one line otherwise."""
    doc = Node(f"--facts {path}", "", load_json(path, error=SpecError, what="--facts", fix=FACTS_FIX, limit=FACTS_LIMIT), SpecError)
    if not isinstance(doc.value, dict) or doc.value.get("schema") != FACTS_SCHEMA:
        raise SpecError(f"--facts {path}: not a gpurig facts report (schema {FACTS_SCHEMA})", FACTS_FIX)
    hosts = doc.child("hosts", doc.value.get("hosts")).of_type(list, "a list of hosts", FACTS_FIX)
    for i, value in enumerate(hosts):
        host = doc.child("hosts", hosts).child(i, value)
        fields = host.of_type(dict, "a host's mapping", FACTS_FIX)
        host.child("host", fields.get("host")).of_type(str, "the host's name", FACTS_FIX)
        host.child("status", fields.get("status")).of_type((str, type(None)), "a status such as ok", FACTS_FIX)
        data = host.child("data", fields.get("data"))
        if data.of_type((dict, type(None)), "the host's facts (a mapping, or null for a host without facts)", FACTS_FIX) is None:
            continue
        driver = data.child("driver_version", data.value.get("driver_version"))
        # compared as numbers against each CUDA's minimum: text that is no version would count as an old driver, quietly
        if driver.of_type((str, type(None)), "a driver version", FACTS_FIX) and not DRIVER_VERSION.fullmatch(driver.value):
            raise driver.fail(f"{validate.excerpt(driver.value)} is not a driver version such as 570.133.20", FACTS_FIX)
        for key in ("gpus", "pci_gpus"):  # their presence makes a GPU host
            data.child(key, data.value.get(key)).of_type((list, type(None)), "a list of GPUs", FACTS_FIX)
    return hosts


def drivers_from_facts(hosts: Iterable[Mapping]) -> tuple[dict[str, str | None], list[str]]:
    """(GPU host -> driver or None when none is loaded, hosts without facts) from a facts report's hosts."""
    drivers: dict[str, str | None] = {}
    missing = []
    for host in hosts:
        data = host.get("data")
        if not isinstance(data, Mapping) or host.get("status") not in ("ok", "changed", None):
            missing.append(str(host.get("host")))
            continue
        if data.get("pci_gpus") or data.get("gpus") or data.get("driver_version"):
            drivers[str(host.get("host"))] = data.get("driver_version") or None
    return drivers, missing
