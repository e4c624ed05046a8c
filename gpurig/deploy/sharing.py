"""What one host's containers share: distinct names and host ports, and GPUs only by consent (``share: true``).

``check_together`` runs on the inventory alone; ``assign_gpus`` runs again
against the host's real GPUs (its facts), where counts become indexes and
an index and its UUID are known to be the same GPU. ``HostGpus`` is the one
map from a device id to a GPU index; pre-flight's MIG check reads ids through
it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpurig.errors import InventoryError, counted

if TYPE_CHECKING:
    from gpurig.deploy.containers import ContainerSpec
    from gpurig.deploy.fields import Gpus
    from gpurig.strict.yamlnode import Node


def check_together(specs: list[ContainerSpec], nodes: list[Node]) -> None:
    """One host's containers can all run at once: distinct names and host ports, GPUs shared only by consent."""
    for (i, a), (j, b) in _pairs(specs):
        if a.name == b.name:
            raise nodes[j].fail(f"container name {a.name!r} is also used by [{i}]", "give each container its own name or user")
        for p in a.ports:
            clash = next((q for q in b.ports if p.clashes(q)), None)
            if clash:
                raise nodes[j].fail(
                    f"container {b.name} publishes {clash}, which container {a.name} already publishes as {p}",
                    "give one of them another host port under ports:",
                )
        shared = _overlap(a.gpus, b.gpus)
        if shared and not (a.share and b.share):
            raise nodes[j].fail(f"containers {a.name} and {b.name} both get {shared}",
                                "give each its own GPUs (gpus: [0] / gpus: [1]), or set share: true on both")


def _pairs(items: list) -> Iterable:
    for i, a in enumerate(items):
        for j in range(i + 1, len(items)):
            yield (i, a), (j, items[j])


def _overlap(a: Gpus, b: Gpus) -> str:
    """What two requests would both use, as far as is known before the host's GPUs are ('' if nothing)."""
    if a.none or b.none:
        return ""
    if a.all or b.all:
        return "all GPUs" if a.all and b.all else "every GPU (one has gpus: all)"
    common = [d for d in a.ids if d in b.ids]
    return f"GPU {', '.join(common)}" if common else ""


class HostGpus:
    """A host's GPUs from its facts, (index, UUID) pairs, and the one way a device id names one of them."""

    def __init__(self, pairs: Iterable[tuple[int, str]]) -> None:
        self.pairs = tuple(pairs)
        self.indexes = [index for index, _ in self.pairs]
        self._by_uuid = {uuid.lower(): index for index, uuid in self.pairs}

    def index_of(self, device: str) -> int | None:
        """The GPU index ``device`` means: an index as written, a GPU UUID (any case) looked up.

        None for a UUID the host lacks or a word that names no one GPU ("all",
        a MIG UUID); an index is not checked against the host's, so each caller
        says what an index the host lacks means to it.
        """
        if device.startswith("GPU-"):
            return self._by_uuid.get(device.lower())
        return int(device) if device.isdigit() else None


def assign_gpus(specs: list[ContainerSpec], host_gpus: list[tuple[int, str]], *,
                held: dict[str, tuple[tuple[str, ...], bool]] | None = None,
                current: dict[str, tuple[str, ...]] | None = None) -> dict[str, tuple[str, ...] | None]:
    """Container name -> the device ids to request: explicit ids as written, counts resolved to free indexes.

    ``host_gpus``: the host's (index, UUID) pairs from its facts. None means every
    GPU (gpus: all), () none. ``held``: the host's other gpurig containers (not in
    this run) and its running jobs (``"job ID"``) -> (their device ids, ``("all",)`` for every GPU; their share flag):
    their GPUs are taken like those of this run's. ``current``: the devices this
    run's containers hold now; a count keeps them when they are still free, so a
    redeploy does not move a container to other GPUs. Refused: an id or UUID the
    host lacks, more GPUs asked for than are free, and GPUs that end up shared
    without ``share: true``.
    """
    host = specs[0].host if specs else "?"
    on_host = HostGpus(host_gpus)
    indexes = on_host.indexes

    def to_indexes(ids: tuple[str, ...]) -> set[int]:
        if "all" in ids:
            return set(indexes)
        return {i for i in map(on_host.index_of, ids) if i is not None}

    others = {name: (to_indexes(ids), share) for name, (ids, share) in (held or {}).items()}
    listed = ", ".join(f"{i} ({u})" for i, u in host_gpus) or "none"
    result: dict[str, tuple[str, ...] | None] = {}
    used: dict[str, set[int]] = {}
    for spec in specs:
        if spec.gpus.all:
            if not host_gpus:
                raise InventoryError(f"host {host}: container {spec.name} asks for all GPUs, but the host has none",
                                     "write gpus: none (or deploy a cpu image), or deploy to a GPU host")
            result[spec.name], used[spec.name] = None, set(indexes)
        elif spec.gpus.ids:
            found: set[int] = set()
            for device in spec.gpus.ids:
                index = on_host.index_of(device)
                if index is None or index not in indexes:
                    raise InventoryError(
                        f"host {host}: container {spec.name} asks for GPU {device}, which the host does not have",
                        f"use one of its GPUs: {listed}",
                    )
                if index in found:
                    raise InventoryError(
                        f"host {host}: container {spec.name} lists GPU {index} twice (by index and by UUID)", "list each GPU once"
                    )
                found.add(index)
            result[spec.name], used[spec.name] = tuple(spec.gpus.ids), found
        else:
            result[spec.name], used[spec.name] = (), set()
    for spec in specs:
        if not spec.gpus.count:
            continue
        taken = set().union(*(used[s.name] for s in specs if s.name != spec.name and not (s.share and spec.share)),
                            *(gpus for gpus, share in others.values() if not (share and spec.share)))
        free = [i for i in indexes if i not in taken]
        keep = sorted(to_indexes((current or {}).get(spec.name, ())))
        if len(keep) == spec.gpus.count and all(i in free for i in keep):
            result[spec.name], used[spec.name] = tuple(str(i) for i in keep), set(keep)
            continue
        if len(free) < spec.gpus.count:
            raise InventoryError(
                f"host {host}: container {spec.name} asks for {counted(spec.gpus.count, 'GPU')}; "
                f"{len(free)} of the host's {len(indexes)} are free for it",
                "lower gpus:, free GPUs from the other containers, or set share: true on the containers that may share",
            )
        unused_first = sorted(free, key=lambda i: (any(i in used[s.name] for s in specs if s.name != spec.name), i))
        chosen = sorted(unused_first[: spec.gpus.count])
        result[spec.name], used[spec.name] = tuple(str(i) for i in chosen), set(chosen)
    for (_, a), (_, b) in _pairs(specs):
        common = used[a.name] & used[b.name]
        if common and not (a.share and b.share):
            devices = ", ".join(map(str, sorted(common)))
            raise InventoryError(
                f"host {host}: containers {a.name} and {b.name} both get GPU {devices}", "give each its own GPUs, or set share: true on both"
            )
    for spec in specs:
        for name, (gpus, share) in others.items():
            common = used[spec.name] & gpus
            if common and not (spec.share and share):
                devices = ", ".join(map(str, sorted(common)))
                job = name.removeprefix("job ") if name.startswith("job ") else None
                holder, free_it = (f"job {job}", f"wait for it or cancel it (gpurig cancel {job})") if job else (
                    f"the running gpurig container {name}", f"remove {name} (gpurig rm)")
                raise InventoryError(f"host {host}: container {spec.name} would get GPU {devices}, which {holder} holds",
                                     f"give {spec.name} other GPUs, {free_it}, or set share: true on both")
    return result
