"""Fan-out for one `gpurig deploy`, for real: the build machine's registry, the hosts' caches, links, forwards and pulls.

``fleet_fanout`` decides whether a deploy uses it (more than one host
delivers an image built here, no spec registry, docker-registry here) and
makes the ``FanOut`` with each image's members in the order given
(inventory order; a rollout's batch order). ``job_fanout`` is the same for
the nodes of one Slurm job, whose deliver is called as a job's is,
``(engine, conn, ref)``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig.deploy import delivery
from gpurig.deploy.delivery import Delivery
from gpurig.deploy.fanout import Deliver, FanOut, NotThisWay, Wanted
from gpurig.deploy.fanouttree import Member
from gpurig.deploy.layercache import start_cache
from gpurig.deploy.peerlink import open_peer_link
from gpurig.deploy.registry import RegistryError, find_registry_binary, parse_reference, shared_registry, staging_reference
from gpurig.deploy.stages import Staged

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.engine import Engine
    from gpurig.connect.forward import Meter
    from gpurig.inventory import Host


class RegistrySide:
    """The build machine's registry (the one delivery's forward uses), started once; each image pushed into it once."""

    def __init__(self, local: Engine, cache_dir: Path | None = None) -> None:
        self.local, self.cache_dir = local, cache_dir
        self._stack = ExitStack()
        self._registry: Any = None
        self._lock = threading.Lock()
        self._staged: dict[str, Staged] = {}
        self._failed: dict[str, str] = {}

    def prepare(self, ref: str, image_id: str, conn: Connection, progress, say) -> int:
        with self._lock:  # one push at a time; the hosts after the first find it done
            if ref in self._failed:
                raise NotThisWay(self._failed[ref])
            if ref not in self._staged:
                try:
                    if self._registry is None:
                        if find_registry_binary() is None:
                            raise NotThisWay("no docker-registry on this machine (install Debian's docker-registry package)")
                        self._registry = self._stack.enter_context(shared_registry(self.cache_dir))
                    self._staged[ref] = delivery.push_staged(self.local, self._registry.address, ref, image_id, progress, conn, say)
                except RegistryError as err:
                    self._failed[ref] = err.problem
                    raise NotThisWay(err.problem) from None
                except delivery._FallBack as err:  # the push failed
                    self._failed[ref] = str(err)
                    raise NotThisWay(str(err)) from None
            return int(self._registry.port)

    def staged(self, ref: str) -> Staged:
        return self._staged.get(ref) or Staged((), ())

    def close(self) -> None:
        self._stack.close()


class RealHosts:
    """The side effects on hosts: checks/layer_cache.py, peer links, reverse forwards, the engine's pull."""

    def start_cache(self, conn: Connection, upstream_port: int, on_end: Callable[[str], None]) -> Any:
        return start_cache(conn, upstream_port, on_end)

    def open_link(self, server: Connection, puller: Connection, address: str, port: int, ssh_port: int) -> Any:
        return open_peer_link(server, puller, address, port, ssh_port)

    def open_forward(self, conn: Connection, port: int, meter: Meter) -> Any:
        return conn.reverse_forward(("127.0.0.1", port), meter)  # open already

    def pull(self, engine: Engine, conn: Connection, ref: str, image_id: str, port: int, moved, staged: Staged, progress, say,
             how: tuple[str, str], gone: Callable[[], str | None]) -> int:
        parsed = staging_reference(parse_reference(ref))
        return delivery.pull_through(engine, conn, ref, parsed, image_id, port, moved, staged, progress, say, how, gone)


def members(chosen: Sequence[Host], targets: Mapping[str, Sequence[Wanted]], inventory: str | Path) -> dict[str, list[Member]]:
    """Each image built here -> the hosts that run it, in ``chosen``'s order, with their gpurig_delivery."""
    from gpurig.inventory.profile import host_profile

    out: dict[str, list[Member]] = {}
    for host in chosen:
        settings = host_profile(host, inventory).delivery
        member = Member(host.name, tuple(host.groups), settings.peer, settings.address or host.address or host.name,
                        settings.port or host.port or 22)
        for ref in dict.fromkeys(t.image_ref for t in targets.get(host.name, ()) if t.image is not None):
            out.setdefault(ref, []).append(member)
    return {ref: ms for ref, ms in out.items() if len(ms) > 1}


def fleet_fanout(chosen: Sequence[Host], targets: Mapping[str, Sequence[Wanted]], inventory: str | Path, *, registry: str | None,
                 local: Engine | None, plain: Deliver, progress_for=None, **options: Any) -> FanOut | None:
    """The deploy's FanOut, or None where today's per-host delivery stays: one host, images only a registry has, no
    docker-registry here, no engine here. ``options``: FanOut's (a rollout's ``own`` and ``label``)."""
    if local is None or registry or find_registry_binary() is None:
        return None
    found = members(chosen, targets, inventory)
    if not found:
        return None
    return FanOut(found, plain, RegistrySide(local), RealHosts(), **({"progress_for": progress_for} if progress_for else {}), **options)


@dataclass(frozen=True)
class JobImage:
    """A job's image as fan-out reads a target: its reference and the build machine's image."""

    image_ref: str
    image: Any


JobDeliver = Callable[["Engine", "Connection", str], Delivery]  # a job's deliver (gpurig.jobs.placement): (engine, conn, ref)


def job_fanout(nodes: Sequence[Host], ref: str, image: Any, inventory: str | Path, *, registry: str | None, local: Engine | None,
               plain: JobDeliver) -> tuple[FanOut, JobDeliver] | None:
    """The nodes of one job (a Slurm job's) sharing ``ref`` as a deploy's hosts do: the FanOut (its ``wrap`` around each node's
    work, ``close`` after them) and the deliver to give the nodes in ``plain``'s place; None where each node gets it alone."""
    if image is None or len(nodes) < 2:
        return None
    fan = fleet_fanout(nodes, {n.name: [JobImage(ref, image)] for n in nodes}, inventory, registry=registry, local=local,
                       plain=lambda engine, conn, t, say: plain(engine, conn, t.image_ref), label="preparation")
    if fan is None:
        return None
    return fan, lambda engine, conn, ref: fan(engine, conn, JobImage(ref, image), lambda text: None)
