"""Where each container's image comes from: this machine's engine (where it was built), or the spec's registry; and the mover that delivers it.

Resolved on this machine before any host is contacted, so an image that is
neither built here nor in a registry is one error, not a failure per host.
Deploy, rollouts and jobs share it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gpurig.connect.engine import EngineError
from gpurig.connect.engineopen import local_engine
from gpurig.deploy.apply import Target
from gpurig.deploy.delivery import Delivery, deliver
from gpurig.deploy.progress import human_size
from gpurig.errors import ConfigError

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.engine import Engine
    from gpurig.deploy.containers import ContainerSpec
    from gpurig.image.spec import ImageSpec


class CountShown(Protocol):
    """Where the mover reports bytes moved (report.deliveryprogress.ProgressPrinter for a person)."""

    def count(self, host: str, done: int, total: int, text: str) -> None: ...


def mover(image_spec: ImageSpec, local: Engine | None, printer: CountShown | None):
    """deploy's ``deliver``: the image from this machine's engine (or the spec's registry), its bytes counted on ``printer``."""

    def move(engine: Engine, conn: Connection, t: Target, say):
        return send_from(local, engine, conn, t.image_ref, image_spec.registry or None, say=say, progress=counter(printer, conn, t))

    return move


def counter(printer: CountShown | None, conn: Connection, t: Target):
    """The progress callback of one host's delivery of ``t``'s image: its bytes on ``printer``."""

    def count(done: int, total: int) -> None:
        if printer is not None:
            of = f" of {human_size(total)}" if total else ""  # a total not known yet is not "of 0 B"
            printer.count(conn.name, done, total, f"{t.image_ref}: {human_size(done or 0)}{of}")

    return count


def send_from(local: Engine | None, engine: Engine, conn: Connection, ref: str, registry: str | None, **how) -> Delivery:
    """``ref`` delivered to the host's ``engine`` from this machine's (``local``); one line when this machine has none to send from."""
    if local is None:  # the image is not on the host and this machine has no engine to send it from
        raise EngineError(f"{ref} is not on {conn.name} and this machine has no Docker engine to send it from",
                          "start Docker here (where the image was built), or push the image to the spec's registry", host=conn.name)
    return deliver(local, engine, conn, ref, registry=registry, **how)


def resolve(image_spec: ImageSpec, cs: ContainerSpec, local: Engine | None) -> Target:
    """The container with its image as this machine has it (None: only a registry has it, the host pulls it)."""
    image = local.image(cs.image) if local else None
    if image is None and cs.entry is not None and not image_spec.registry:
        raise ConfigError(f"{cs.host}: {cs.name}: the image {cs.image} is not built on this machine",
                          f"build it first: invoke build --variant {cs.variant} --torch {cs.entry.torch} --cuda {cs.entry.cuda}")
    return Target(cs, cs.image, image, login=image_spec.user.name, uid=image_spec.user.uid)


def local_engine_if_any() -> Engine | None:
    """This machine's engine (``gpurig.connect.engineopen.local_engine``, the one the build used), or None when there is none:
    a deploy whose images a registry holds needs none."""
    try:
        return local_engine()
    except EngineError:
        return None
