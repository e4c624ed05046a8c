"""The containers that hold GPUs, by name: each id a host's samples name, looked up in that host's Docker engine now and then.

The sampler names the container of each GPU process by its id (its cgroup);
what the page shows is its name, and, for a container deploy made, which
``gpurig_containers`` entry it is, its user and image (deploy's labels). A
host's engine is asked only when its samples name a container: when an id
is new (at most every ``RETRY_S``), and again every ``LIST_EVERY_S`` as
idle_stop lists its containers, never every tick. An engine that could not
be asked is said with why and asked again later; an id the engine does not
know (a container of another engine) stays unnamed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpurig.deploy.compare import IMAGE_LABEL, JOB_LABEL, NAME_LABEL
from gpurig.deploy.containers import LABEL

if TYPE_CHECKING:
    from gpurig.connect.engineinfo import ContainerInfo

LIST_EVERY_S = 300.0  # as idle_stop lists a host's containers
RETRY_S = 30.0  # an id not known yet, or an engine that did not answer: asked again after this long
RUNNING = "running"


@dataclass(frozen=True)
class Known:
    """A container as its host's engine described it."""

    id: str
    name: str
    image: str
    status: str
    deployed: str | None = None  # the gpurig_containers entry deploy made it from (its name label); None: not deploy's
    user: str | None = None  # deploy's user label
    job: str | None = None  # a gpurig job's container: the job id

    def as_page(self) -> dict[str, Any]:
        return {"name": self.name, "image": self.image, "status": self.status, "deployed": self.deployed, "user": self.user,
                "job": self.job}


def known_of(ci: ContainerInfo) -> Known:
    labels = ci.labels or {}
    return Known(ci.id, ci.name, str(labels.get(IMAGE_LABEL) or ci.image), ci.status, str(labels[NAME_LABEL]) if labels.get(NAME_LABEL) else None,
                 str(labels.get(f"{LABEL}.user") or "") or None, str(labels[JOB_LABEL]) if labels.get(JOB_LABEL) else None)


@dataclass
class HostBook:
    """One host's containers as last read: by id, when (monotonic) they were read, why not where the engine was not asked."""

    known: dict[str, Known] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)  # ids the engine did not know
    read_at: float = float("-inf")
    tried_at: float = float("-inf")
    why: str = ""
    changed_t: float | None = None  # the samples' time when what it says last changed (the page is sent its GPUs again)


class ContainerNames:
    """Every host's book; ``due`` says which ids to look up now, ``take`` and ``failed`` keep what the lookup found."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, list_every: float = LIST_EVERY_S, retry: float = RETRY_S) -> None:
        self.clock = clock
        self.list_every = list_every
        self.retry = retry
        self._lock = threading.Lock()
        self._books: dict[str, HostBook] = {}

    def due(self, host: str, ids: Iterable[str]) -> list[str]:
        """The ids to ask ``host``'s engine about now (all that its samples name), or [] when nothing is due."""
        wanted = sorted(set(ids))
        if not wanted:
            return []
        now = self.clock()
        with self._lock:
            book = self._books.get(host) or HostBook()
            if now - book.tried_at < self.retry:
                return []
            stale = now - book.read_at >= self.list_every
            new = [i for i in wanted if i not in book.known and i not in book.missing]
            return wanted if stale or new else []

    def take(self, host: str, asked: Iterable[str], found: Iterable[ContainerInfo], sample_t: float | None) -> None:
        """What the engine said of the ids ``asked``: ``found`` the ones it knows."""
        now = self.clock()
        with self._lock:
            book = self._books.setdefault(host, HostBook())
            known = {**book.known, **{ci.id: known_of(ci) for ci in found}}
            asked = set(asked)
            missing = asked - set(known)
            known = {i: k for i, k in known.items() if i in asked or i not in missing}
            if known != book.known or missing != book.missing or book.why:
                book.changed_t = sample_t
            book.known, book.missing, book.read_at, book.tried_at, book.why = known, missing, now, now, ""

    def failed(self, host: str, why: str, sample_t: float | None) -> None:
        with self._lock:
            book = self._books.setdefault(host, HostBook())
            if book.why != why:
                book.changed_t = sample_t
            book.tried_at, book.why = self.clock(), why

    def mark_changed(self, host: str) -> None:
        """Ask ``host``'s engine again at the next look (a container there was just stopped)."""
        with self._lock:
            book = self._books.get(host)
            if book is not None:
                book.read_at = book.tried_at = float("-inf")

    def book(self, host: str) -> HostBook | None:
        with self._lock:
            book = self._books.get(host)
            return None if book is None else HostBook(dict(book.known), set(book.missing), book.read_at, book.tried_at, book.why,
                                                      book.changed_t)


def look_up(engine: Any, ids: Iterable[str]) -> list[ContainerInfo]:
    """The containers ``ids`` name on ``engine`` (an id it does not know is left out)."""
    found = []
    for cid in ids:
        info = engine.container(cid)
        if info is not None:
            found.append(info)
    return found
