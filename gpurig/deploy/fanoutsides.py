"""What fan-out (gpurig.deploy.fanout) asks of the build machine and of the hosts, and of what a host needs: the shapes its real
sides (gpurig.deploy.fanoutwire) and the unit tests' fakes fill."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from gpurig.deploy.delivery import Delivery
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
