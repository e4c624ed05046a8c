"""Fleet delivery's tree: who pulls an image from whom, fixed before any host is contacted.

In inventory order of the hosts that deliver the image: the first pulls from
the build machine; each next one joins under the earliest host that has fewer
than ``K`` children, preferring one that shares an inventory group with it
(the same rack or site, usually). A host with ``gpurig_delivery: {peer:
false}`` is never a parent: its children-to-be go elsewhere, and where no host
may serve, a host pulls from the build machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

K = 3  # children per host: each host's upload is shared by at most this many pulls at once
BUILD_MACHINE = "the build machine"
_NOT_A_PLACE = frozenset({"all", "ungrouped"})  # groups every host is in say nothing about where it stands


@dataclass(frozen=True)
class Member:
    """A host that delivers the image: its inventory groups, whether it may serve, and where its peers reach its sshd."""

    host: str
    groups: tuple[str, ...] = ()
    peer: bool = True
    address: str = ""
    ssh_port: int = 22


def plan_tree(members: Sequence[Member], k: int = K) -> dict[str, str | None]:
    """Each host's parent (None: the build machine), for ``members`` in inventory order."""
    parents: dict[str, str | None] = {}
    children: dict[str, int] = {}
    servers: list[Member] = []  # hosts that may serve, in order
    for m in members:
        open_ = [s for s in servers if children[s.host] < k]
        mine = set(m.groups) - _NOT_A_PLACE
        near = [s for s in open_ if mine & set(s.groups)]
        parent = (near or open_)[0] if near or open_ else None
        parents[m.host] = parent.host if parent else None
        if parent:
            children[parent.host] += 1
        if m.peer:
            servers.append(m)
            children[m.host] = 0
    return parents


def chain(parents: Mapping[str, str | None], host: str) -> list[str | None]:
    """``host``'s ancestors, nearest first, ending with None (the build machine)."""
    out: list[str | None] = []
    at = parents[host]
    while at is not None:
        out.append(at)
        at = parents[at]
    out.append(None)
    return out


def descendants(parents: Mapping[str, str | None], host: str) -> list[str]:
    """Every host under ``host`` in the tree, in inventory order."""
    return [h for h in parents if h != host and host in chain(parents, h)]


def describe(parents: Mapping[str, str | None], size: int = 0) -> list[str]:
    """The tree as lines a person reads: 'a100-01 <- the build machine', 'a100-02, a100-03 <- a100-01'; with the image's ``size``,
    what each source sends ('a100-02, a100-03 <- a100-01: serves 2.20 GB (1.10 GB to each of 2)') and a last line with the build
    machine's total against what it would send each host without fan-out."""
    from gpurig.deploy.progress import human_size

    served: dict[str | None, list[str]] = {}
    for host, parent in parents.items():
        served.setdefault(parent, []).append(host)
    order = [None, *parents]
    lines = []
    for p in (p for p in order if p in served):
        n = len(served[p])
        sends = f": {'serves' if p else 'sends'} {human_size(n * size)} " + (f"({human_size(size)} to each of {n})" if n > 1 else "once")
        lines.append(f"{', '.join(served[p])} <- {p or BUILD_MACHINE}" + (sends if size else ""))
    if size:
        lines.append(f"{BUILD_MACHINE} sends {human_size(len(served.get(None, ())) * size)} in all for {len(parents)} hosts "
                     f"(the image is {human_size(size)}; {human_size(len(parents) * size)} without fan-out)")
    return lines
