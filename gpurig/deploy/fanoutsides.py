"""What fan-out (gpurig.deploy.fanout) asks of the build machine and of the hosts, and of what a host needs: the shapes its real
sides (gpurig.deploy.fanoutwire) and the unit tests' fakes fill; and ``Node``, one host's place and state in an image's tree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gpurig.deploy.delivery import Delivery
from gpurig.deploy.fanouttree import Member
from gpurig.deploy.stages import Staged

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.engine import Engine
    from gpurig.connect.forward import Meter


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

    def start_cache(self, conn: Connection, upstream_port: int) -> Any: ...  # .port, .stop() -> counts

    def open_link(self, server: Connection, puller: Connection, address: str, port: int, ssh_port: int) -> Any: ...  # .port, .close()

    def open_forward(self, conn: Connection, port: int, meter: Meter) -> Any: ...  # .port, .close()

    def pull(self, engine: Engine, conn: Connection, ref: str, image_id: str, port: int, moved, staged: Staged, progress, say,
             how: tuple[str, str]) -> int: ...


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

    @property
    def host(self) -> str:
        return self.member.host
