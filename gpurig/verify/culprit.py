"""Finding the slow host or link behind a slow all-reduce: pairwise tests, planned and judged, pure.

``search(hosts, measure, threshold)`` calls ``measure`` (a function that runs
the all-reduce on a subset of hosts, in ring order, and returns its busbw in
GB/s, None when it failed) on pairs: every pair up to ``ALL_PAIRS_UP_TO`` hosts;
above that a ring-halving search: each half of the ring is measured as a ring
of its own and the slow halves are halved again down to ``LEAF`` hosts, whose
pairs are all measured; when both halves pass but their whole did not, the
two ring links across the cut are measured. A slow pair whose hosts both lack
a fine result elsewhere is measured once more with a host known fine, so one
slow host is told from a slow link; a slow pair is measured once more (the
better figure kept) before it is blamed, unless it failed short of a quarter
of the threshold. ``judge`` names the slow hosts (every pair
they are in is slow, their partners are fine elsewhere) and the slow links
(a pair slow while both its hosts are fine with others); ``culprit_record``
says it as a record with the fix.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpurig.verify.records import Record

ALL_PAIRS_UP_TO = 8  # 28 pair tests at most; above, halving needs ~2 log2(n) group tests and a leaf's 6 pairs
LEAF = 4
RELATIVE_SLOW = 0.5  # without a promise the pairs reach: a pair under half the best pair is slow
NOT_NOISE = 0.25  # a pair under a quarter of the threshold is slow beyond doubt: no second run (another job's burst halves, not quarters)

Measure = Callable[[tuple[str, ...]], "float | None"]


@dataclass(frozen=True)
class Tested:
    """One measured subset: its hosts in ring order and its busbw (None: the all-reduce failed)."""

    hosts: tuple[str, ...]
    busbw: float | None

    def slow(self, threshold: float) -> bool:
        return self.busbw is None or self.busbw < threshold


@dataclass(frozen=True)
class Culprit:
    """What the pairwise tests show: the slow hosts, the slow links between fine hosts, and every test made."""

    hosts: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    unresolved: tuple[tuple[str, str], ...]  # slow pairs with no fine host to tell host from link
    tested: tuple[Tested, ...]
    threshold: float
    basis: str = ""  # how the threshold was chosen, where not from the links' promise


def plan_pairs(hosts: Sequence[str]) -> list[tuple[str, str]]:
    """Every pair of hosts, in rank order: the plan up to ALL_PAIRS_UP_TO hosts."""
    return list(itertools.combinations(hosts, 2))


def search(hosts: Sequence[str], measure: Measure, threshold: float | None = None) -> tuple[list[Tested], float]:
    """(every test made, the threshold used): all pairs for small fleets, ring halving for large ones.

    ``threshold`` is the busbw a healthy pair reaches (the links' promise times the pass fraction); None, or one
    that no pair reaches (gloo's CPUs short of a fast link's promise): half the best pair's, so that one host far
    below its peers still shows. Not the median pair's: with one slow host among three, two pairs of three are slow.
    """
    done: dict[tuple[str, ...], Tested] = {}

    def run(group: Sequence[str]) -> Tested:
        key = tuple(group)
        if key not in done:
            done[key] = Tested(key, measure(key))
        return done[key]

    if len(hosts) <= ALL_PAIRS_UP_TO:
        for pair in plan_pairs(hosts):
            run(pair)
    else:
        _halve(list(hosts), run, threshold)
    pairs = [t for t in done.values() if len(t.hosts) == 2]
    figures = [t.busbw for t in pairs if t.busbw is not None]
    compared = len({h for t in pairs for h in t.hosts}) >= 3  # two hosts alone: nothing to compare their one pair with
    if figures and (threshold is None or (compared and not any(b >= threshold for b in figures))):
        threshold = RELATIVE_SLOW * max(figures)
    elif threshold is None:
        threshold = float("inf")
    for t in pairs:  # measured once more before it is blamed: one run slowed by other work is no slow link
        if t.slow(threshold) and (t.busbw is None or t.busbw >= NOT_NOISE * threshold):
            again = measure(t.hosts)
            if again is not None and (t.busbw is None or again > t.busbw):
                done[t.hosts] = Tested(t.hosts, again)
    pairs = [t for t in done.values() if len(t.hosts) == 2]
    fine = _fine_hosts(done.values(), threshold)
    for t in list(pairs):  # a slow pair of two unknowns: each with a fine host tells a slow host from a slow link
        if t.slow(threshold) and fine and not set(t.hosts) & fine:
            ref = sorted(fine)[0]
            for host in t.hosts:
                run((host, ref))
    return list(done.values()), threshold


def basis(floor: float | None, threshold: float, why: str = "the links promise no speed") -> str:
    """How ``search`` chose ``threshold`` where it is not ``floor`` (the links' promise x the pass fraction), for the record;
    ``why`` there was no floor."""
    if threshold == floor:
        return ""
    if floor is None:
        return f"half the best pair's busbw: {why}"
    return f"half the best pair's busbw: no pair reached the links' promise, {floor:.3g} GB/s"


def _halve(group: list[str], run: Callable[[Sequence[str]], Tested], threshold: float | None) -> None:
    if len(group) <= LEAF:
        for pair in plan_pairs(group):
            run(pair)
        return
    half = len(group) // 2
    a, b = group[:half], group[half:]
    if threshold is None:  # nothing to judge a group by: every leaf's pairs, judged against each other after
        slow_a = slow_b = True
    else:
        slow_a, slow_b = run(a).slow(threshold), run(b).slow(threshold)
    if slow_a:
        _halve(a, run, threshold)
    if slow_b:
        _halve(b, run, threshold)
    if not slow_a and not slow_b:  # both halves fine as rings of their own: the ring links across the cut
        run((a[-1], b[0]))
        run((b[-1], a[0]))


def _fine_hosts(tested: Iterable[Tested], threshold: float) -> set[str]:
    return {h for t in tested if not t.slow(threshold) for h in t.hosts}


def judge(tested: Sequence[Tested], threshold: float, basis: str = "") -> Culprit:
    """Slow hosts (slow with every partner, while those partners are fine elsewhere) and slow links (both ends fine elsewhere)."""
    fine = _fine_hosts(tested, threshold)
    slow_pairs = [(t.hosts[0], t.hosts[1]) for t in tested if len(t.hosts) == 2 and t.slow(threshold)]
    hosts = sorted({h for pair in slow_pairs for h in pair if h not in fine and set(pair) - {h} <= fine})
    links: list[tuple[str, str]] = []
    unresolved: list[tuple[str, str]] = []
    for x, y in slow_pairs:
        if x in hosts or y in hosts:
            continue
        (links if x in fine and y in fine else unresolved).append((x, y))
    return Culprit(tuple(hosts), tuple(links), tuple(unresolved), tuple(tested), threshold, basis)


def culprit_record(found: Culprit, total_slow: bool = True) -> Record:
    """The record naming the slow host or link, with its fix; a pass when every pair is fine."""
    def figures(host: str) -> str:
        got = [t.busbw for t in found.tested if len(t.hosts) == 2 and host in t.hosts]
        return ", ".join("failed" if b is None else f"{b:.3g}" for b in got)

    pairs = [t for t in found.tested if len(t.hosts) == 2]
    limit = f">= {found.threshold:.3g}"
    basis = f" ({found.basis})" if found.basis else ""
    if found.hosts:
        said = "; ".join(f"{h} is slow with every partner ({figures(h)} GB/s)" for h in found.hosts)
        return Record("fabric", "fabric.culprit", "fail", list(found.hosts), limit, "GB/s",
                      f"{said}, while its partners reach {limit} GB/s with other hosts{basis}",
                      "check that host's NIC, cable and switch port (fabric.speed, ethtool IFACE, ibstat), then rerun")
    if found.links:
        said = "; ".join(f"{x} <-> {y}" for x, y in found.links)
        return Record("fabric", "fabric.culprit", "fail", [list(p) for p in found.links], limit, "GB/s",
                      f"the link {said} is slow, though each host reaches {limit} GB/s with others{basis}",
                      "check the path between them: the switch ports and uplinks (ISL) it crosses, a VLAN or route that detours")
    if found.unresolved:
        said = "; ".join(f"{x} <-> {y}" for x, y in found.unresolved)
        return Record("fabric", "fabric.culprit", "fail", [list(p) for p in found.unresolved], limit, "GB/s",
                      f"{said} is slow and no host was fine to tell which end: either host's link or the path between them",
                      "add a third host to the selection, or check both hosts' NICs (fabric.speed, ethtool IFACE)")
    if not pairs:
        return Record("fabric", "fabric.culprit", "skip", detail="skipped: no pair was measured")
    if total_slow:
        return Record("fabric", "fabric.culprit", "warn", len(pairs), limit, "pairs",
                      f"all {len(pairs)} pairs tested reach {limit} GB/s{basis}: the shortfall shows only with every host at once "
                      "(switch oversubscription or uplinks, or one host's CPU/PCIe under the full ring)",
                      "check the switch's uplink capacity and the ring's path (NCCL_DEBUG=INFO, NCCL_TOPO_DUMP_FILE)")
    return Record("fabric", "fabric.culprit", "pass", len(pairs), limit, "pairs", f"all {len(pairs)} pairs tested reach {limit} GB/s{basis}")
