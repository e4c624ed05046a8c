"""What fan-out (gpurig.deploy.fanout) asks of the build machine and of the hosts, and of what a host needs: the shapes its real
sides (gpurig.deploy.fanoutwire) and the unit tests' fakes fill; and ``Node``, one host's place and state in an image's tree, with
what is read from the nodes (a dead cache on a pull's way, a host's note)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gpurig.deploy.delivery import Delivery
from gpurig.deploy.fanouttree import BUILD_MACHINE, Member
from gpurig.deploy.stages import Staged

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.engine import Engine
    from gpurig.connect.forward import Meter

log = logging.getLogger(__name__)


class Wanted(Protocol):
    """What fan-out reads of a host's target (a deploy's ``Target``, a job's image): the reference, the build machine's image."""

    @property
    def image_ref(self) -> str: ...

    @property
    def image(self) -> Any: ...  # .id, .size; None where only a registry has it


Deliver = Callable[["Engine", "Connection", Wanted, Callable[[str], None]], Delivery]


class NotThisWay(Exception):
    """The build machine cannot feed fan-out (no docker-registry, the push failed): the host takes today's path; says why."""


class BuildSide(Protocol):
    def prepare(self, ref: str, image_id: str, conn: Connection, progress, say) -> int: ...  # the registry's port

    def staged(self, ref: str) -> Staged: ...

    def close(self) -> None: ...


class HostSide(Protocol):
    """What fan-out does on hosts; unit tests give a fake."""

    def start_cache(self, conn: Connection, upstream_port: int, on_end: Callable[[str], None]) -> Any: ...  # .port, .stop() -> counts;
    # on_end(why) once it ends unasked

    def open_link(self, server: Connection, puller: Connection, address: str, port: int, ssh_port: int) -> Any: ...  # .port, .close()

    def open_forward(self, conn: Connection, port: int, meter: Meter) -> Any: ...  # .port, .close()

    def pull(self, engine: Engine, conn: Connection, ref: str, image_id: str, port: int, moved, staged: Staged, progress, say,
             how: tuple[str, str], gone: Callable[[], str | None]) -> int: ...  # gone(): why its source is gone, which ends it


__all__ = ["BuildSide", "Deliver", "HostSide", "NotThisWay", "Wanted"]


@dataclass(eq=False)
class Node:
    """One host in one image's tree, and what it holds while it serves (guarded by FanOut.cond)."""

    member: Member
    parent: str | None
    state: str = "waiting"  # waiting | serving | refused | closing
    why: str = ""  # why it does not serve
    started: bool = False  # its work began
    finished: bool = False  # its delivery ended (pulled, failed, or none)
    conn: Any = None
    port: int = 0  # its cache's, on its loopback
    cache: Any = None
    upstream: Any = None  # the forward or link its cache fetches through
    via: str | None = None  # the host that link reaches (None: the build machine's forward)
    pullers: set = field(default_factory=set)  # hosts whose link into its cache is open
    counts: dict = field(default_factory=dict)  # the cache's closing counts
    broke: list = field(default_factory=list)  # why its own pull through its cache failed (it then pulled straight, serving no one)
    dead: str = ""  # why its cache ended unasked (the pulls through it, and through the caches it feeds, end at once)

    @property
    def host(self) -> str:
        return self.member.host


def gone_through(nodes: Mapping[str, Node], host: str | None) -> str | None:
    """Why a pull through ``host``'s cache cannot finish: that cache, or one feeding it further up, ended; None while all live
    (the caller holds FanOut.cond)."""
    at = nodes.get(host) if host else None
    while at is not None:
        if at.dead:
            return at.dead
        at = nodes.get(at.via) if at.via else None
    return None


def summarise(ref: str, size: int, sent: int, got: Mapping[str, Delivery], tree: Mapping[str, str | None]) -> dict[str, Any]:
    """One image's part of FanOut.summary(): what the hosts received (``got``) and from where, against what the build machine sent."""
    return {"image": ref, "size": size, "sent": sent, "received": sum(d.bytes_moved for d in got.values()),
            "hosts": {h: {"source": d.source, "bytes": d.bytes_moved, "method": d.method, **({"note": d.note} if d.note else {})}
                      for h, d in got.items()},
            "tree": dict(tree)}


def note(host: str, whys: list[str], source: str | None) -> str:
    """Why a host did not pull from its planned parent: 'a100-03 cannot reach a100-01 at ...: delivered from the build machine'."""
    if not whys:
        return ""
    return f"{host} {'; '.join(whys)}: delivered from {source or BUILD_MACHINE}"


def close_quietly(thing: Any) -> None:
    try:
        thing.close()
    except Exception as err:  # noqa: BLE001 - a forward or link whose connection is gone: nothing more to do
        log.info("closing %s: %s", type(thing).__name__, err)
