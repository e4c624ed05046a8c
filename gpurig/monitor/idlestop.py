"""Idle policy for deployed containers: one deployed with ``idle_stop`` is stopped once every GPU it holds sat idle that long.

Enforced by the monitor session (``gpurig monitor`` and ``gpurig dashboard``
alike: both run ``monitor_fleet``, which runs this beside its agents), not by
the sampler on the host: the session already has every sample, and stopping
needs the host's Docker engine (gpurig.connect's Engine, the one door to
Docker), which the sampler, a stdlib script, has no way to reach.

Idle is the monitor's rule (gpurig.monitor.idle): a GPU under 5% utilisation
(a MIG device: its GPM engine activity); a GPU whose utilisation is not
reported is never idle. Unlike the page's idle flag, a container's GPUs
count whether or not a process holds them: a notebook that holds its GPUs
and runs nothing is what the policy is for. A streak is measured on the
samples' own clock, so a run that stalls (no sample for ``max_gap``) starts
it again, and a host whose samples stopped coming is never judged: what was
not seen is unknown, never idle.

Before stopping, the session says it (``a100-01 jupyter: GPUs 0,1 idle
4h02m (idle_stop 4h): stopping``), then stops the container and keeps the
stop in ``.gpurig/history/idle-stop.jsonl`` (the dashboard's History).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig import __version__
from gpurig.deploy.containers import IDLE_STOP_LABEL, LABEL
from gpurig.errors import GpurigError
from gpurig.files import append_jsonl, read_jsonl
from gpurig.monitor.idle import IDLE_UTIL, utilisation
from gpurig.strict.validate import duration_text, whole_number

if TYPE_CHECKING:
    from gpurig.connect.connector import Connector
    from gpurig.connect.engineinfo import ContainerInfo
    from gpurig.inventory import Host
    from gpurig.monitor.samples import Sample

IDLE_STOP_LOG = ".gpurig/history/idle-stop.jsonl"
SCHEMA = "gpurig.idle-stop/1"
MAX_BYTES = 2**20
MAX_LINE = 16 * 2**10
LIST_EVERY_S = 300.0  # how often a host's idle_stop containers are listed again while one of its GPUs is idle
CHECK_EVERY_S = 30.0  # how often the session weighs them against the samples


@dataclass(frozen=True)
class GpuQuiet:
    """One GPU of a host's latest sample: what names it, and since when (the samples' clock) it has been idle; None: not idle now."""

    label: str
    uuid: str | None
    since: float | None


@dataclass
class HostQuiet:
    """A host's GPUs as its latest sample left them, that sample's time, and when (this machine's monotonic clock) it came."""

    last_t: float
    received: float
    gpus: dict[str, GpuQuiet] = field(default_factory=dict)


class QuietGpus:
    """A Run listener: per host, since when each GPU of its latest sample has sat under 5%, held or not."""

    def __init__(self, max_gap: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_gap = max_gap
        self.clock = clock
        self._lock = threading.Lock()
        self._hosts: dict[str, HostQuiet] = {}

    def __call__(self, host: str, record: Mapping[str, Any], sample: Sample | None) -> None:
        if sample is None:
            return
        with self._lock:
            before = self._hosts.get(host)
            stalled = before is None or sample.t - before.last_t > self.max_gap  # a gap unseen: every streak starts again
            gpus = {}
            for g in sample.gpus:
                util = utilisation(g)
                was = None if stalled or before is None or g.label not in before.gpus else before.gpus[g.label].since
                since = None if util is None or util >= IDLE_UTIL else (was if was is not None else sample.t)
                gpus[g.label] = GpuQuiet(g.label, g.uuid, since)
            self._hosts[host] = HostQuiet(sample.t, self.clock(), gpus)

    def of(self, host: str) -> HostQuiet | None:
        with self._lock:
            return self._hosts.get(host)


@dataclass(frozen=True)
class Verdict:
    """Whether a container's GPUs have been idle for its ``idle_stop``: ``stop``, ``busy`` or ``unknown``, with why."""

    state: str
    why: str
    gpus: tuple[str, ...] = ()  # the GPUs it holds, as the samples label them
    idle_s: float | None = None


def held_gpus(device_ids: Sequence[str] | None, quiet: HostQuiet) -> tuple[list[GpuQuiet], str]:
    """The GPUs of the sample a container's device ids name (an index, a GPU-/MIG- UUID, ``0:1``, or ``all``), and what was not found."""
    if not device_ids:
        return [], "it holds no GPU"
    if tuple(device_ids) == ("all",):
        return list(quiet.gpus.values()), "" if quiet.gpus else "the host's samples show no GPU"
    found, missing = [], []
    for dev in device_ids:
        match = quiet.gpus.get(dev) or next((g for g in quiet.gpus.values() if g.uuid and g.uuid == dev), None)
        if match is None:
            missing.append(dev)
        else:
            found.append(match)
    return found, f"GPU {', '.join(missing)} is not in the host's samples" if missing else ""


def decide(device_ids: Sequence[str] | None, idle_stop: float, quiet: HostQuiet | None, now: float, max_gap: float) -> Verdict:
    """Stop a container once every GPU it holds has been idle (under 5%) for ``idle_stop`` seconds of samples; a host whose samples
    are missing or stale (none came for ``max_gap`` by this machine's clock ``now``), or a GPU the samples do not show, is unknown."""
    if quiet is None:
        return Verdict("unknown", "no sample of the host yet")
    if now - quiet.received > max_gap:
        return Verdict("unknown", f"no sample of the host for {duration_text(now - quiet.received)}")
    gpus, missing = held_gpus(device_ids, quiet)
    labels = tuple(g.label for g in gpus)
    if missing:
        return Verdict("unknown", missing, labels)
    busy = [g.label for g in gpus if g.since is None]
    if busy:
        return Verdict("busy", f"GPU {', '.join(busy)} not idle (or its utilisation not reported)", labels)
    idle_s = quiet.last_t - max(g.since for g in gpus if g.since is not None)
    if idle_s < idle_stop:
        return Verdict("busy", f"idle {duration_text(idle_s)} of {duration_text(idle_stop)}", labels, idle_s)
    return Verdict("stop", f"GPU{'s' if len(labels) != 1 else ''} {','.join(labels)} idle {duration_text(idle_s)} "
                   f"(idle_stop {duration_text(idle_stop)})", labels, idle_s)


def idle_stop_of(info: ContainerInfo) -> int | None:
    """The idle_stop (seconds) deploy labelled a container with; None: none (never stopped), or a label that is not gpurig's."""
    seconds = whole_number(info.labels.get(IDLE_STOP_LABEL))
    return seconds if seconds else None


def idle_stop_hosts(hosts: Sequence[Host], source: str | Path) -> list[Host]:
    """The hosts whose gpurig_containers give a container an idle_stop: the only hosts whose engine the session asks."""
    from gpurig.inventory.profile import host_profile

    return [h for h in hosts if any("idle_stop" in c for c in host_profile(h, source).containers)]


def stop_entry(host: str, info: ContainerInfo, verdict: Verdict, idle_stop: int, stopped: bool, reason: str = "") -> dict[str, Any]:
    return {"schema": SCHEMA, "time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": host,
            "container": info.name, "user": str(info.labels.get(f"{LABEL}.user") or ""), "image": info.image,
            "gpus": list(verdict.gpus), "idle_s": round(verdict.idle_s or 0.0), "idle_stop_s": idle_stop, "stopped": stopped,
            "reason": reason[:400], "gpurig": __version__}


def read_idle_stops(root: Path) -> tuple[list[dict[str, Any]], list[dict[str, str]], int]:
    """The idle stops kept under ``root``, oldest first; the files that could not be read; how many were read."""
    lines, unread, files = read_jsonl(Path(root) / IDLE_STOP_LOG, max_bytes=MAX_BYTES, max_line=MAX_LINE)
    ok = [e for e in lines if e.get("schema") == SCHEMA and isinstance(e.get("host"), str) and isinstance(e.get("time"), str)]
    return ok, unread, files


class IdleStop:
    """The session's enforcer: a Run listener (``quiet``) and a thread that, every ``check_every`` seconds, weighs each idle_stop
    container of ``hosts`` against the samples and stops those whose GPUs sat idle long enough; ``say`` hears each line."""

    def __init__(self, hosts: Sequence[Host], connect: Callable[[], Connector], say: Callable[[str], None], root: Path | None,
                 interval: float, *, check_every: float = CHECK_EVERY_S, list_every: float = LIST_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = list(hosts)
        self.connect = connect
        self.say = say
        self.root = root
        self.max_gap = max(30.0, 5 * interval)
        self.quiet = QuietGpus(self.max_gap, clock)
        self.clock = clock
        self.check_every = check_every
        self.list_every = list_every
        self._listed: dict[str, tuple[float, list[ContainerInfo]]] = {}
        self._said: dict[str, str] = {}
        self._failed: dict[str, float] = {}  # container id -> when its stop failed
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self._loop, args=(stop,), name="gpurig-idle-stop", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 15.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.check_every):
            self.check()

    def check(self) -> list[dict[str, Any]]:
        """One look at every host: the stops made (or tried), as kept in the history."""
        done = []
        for host in self.hosts:
            quiet = self.quiet.of(host.name)
            if quiet is None or not any(g.since is not None for g in quiet.gpus.values()):
                continue  # nothing idle: no engine asked
            try:
                done += self._host(host, quiet)
            except GpurigError as err:
                self._once(host.name, f"{host.name}: idle_stop not enforced: {err.problem}")
            except Exception as err:  # a bug here must not end the monitor session
                self._once(host.name, f"{host.name}: idle_stop not enforced: {type(err).__name__}: {err}")
        return done

    def _once(self, host: str, line: str) -> None:
        if self._said.get(host) != line:
            self._said[host] = line
            self.say(line)

    def _host(self, host: Host, quiet: HostQuiet) -> list[dict[str, Any]]:
        """The host's engine is opened only to list its idle_stop containers again (every ``list_every``) or to stop one."""
        from gpurig.connect.engineopen import open_engine

        listed_at, listed = self._listed.get(host.name, (float("-inf"), []))
        fresh = self.clock() - listed_at < self.list_every
        if fresh and not self._due(host.name, listed):
            return []
        connector = self.connect()
        try:
            with open_engine(connector.open(host)) as engine:
                if not fresh:
                    listed = [c for c in engine.containers(IDLE_STOP_LABEL) if c.running and idle_stop_of(c)]
                    self._listed[host.name] = (self.clock(), listed)
                done = []
                for info, verdict, seconds in self._due(host.name, listed):
                    entry = self._stop(engine, host.name, info, verdict, seconds)
                    done += [entry] if entry else []
                self._said.pop(host.name, None)
                return done
        finally:
            connector.close()

    def _due(self, host: str, listed: list[ContainerInfo]) -> list[tuple[ContainerInfo, Verdict, int]]:
        """The listed containers whose GPUs have sat idle for their idle_stop (one whose stop failed waits ``list_every``)."""
        due = []
        for info in listed:
            seconds = idle_stop_of(info)
            if seconds is None or self.clock() - self._failed.get(info.id, float("-inf")) < self.list_every:
                continue
            verdict = decide(info.device_ids, seconds, self.quiet.of(host), self.clock(), self.max_gap)
            if verdict.state == "stop":
                due.append((info, verdict, seconds))
        return due

    def _stop(self, engine: Any, host: str, info: ContainerInfo, verdict: Verdict, seconds: int) -> dict[str, Any] | None:
        """Say it, stop it, keep it; None when the container is no longer running as it was listed (nothing to stop)."""
        now = engine.container(info.id)  # as it is now: still running, still the one deployed with idle_stop
        if now is None or not now.running or idle_stop_of(now) != seconds:
            self._listed.pop(host, None)
            return None
        self.say(f"{host} {info.name}: {verdict.why}: stopping")
        try:
            engine.stop(info.id)
            entry, said = stop_entry(host, info, verdict, seconds, True), f"{host} {info.name}: stopped"
        except GpurigError as err:  # tried again once the list is read again, not every check
            self._failed[info.id] = self.clock()
            entry = stop_entry(host, info, verdict, seconds, False, err.problem)
            said = f"{host} {info.name}: could not be stopped: {err.problem}"
        self._listed.pop(host, None)  # listed again next time: what stopped is gone from the list
        self._keep(entry)  # kept before it is said: a reader woken by the line finds it in the history
        self.say(said)
        return entry

    def _keep(self, entry: dict[str, Any]) -> None:
        if self.root is None:
            self.say("idle_stop: not in a gpurig project: the stop is not kept in a history")
            return
        try:
            append_jsonl(self.root / IDLE_STOP_LOG, [entry], max_bytes=MAX_BYTES, max_line=MAX_LINE)
        except OSError as err:
            self.say(f"idle_stop: the stop was not kept in the history: {err}")


def enforcer(hosts: Sequence[Host], source: str | Path, connect: Callable[[], Connector], say: Callable[[str], None], root: Path | None,
             interval: float) -> IdleStop | None:
    """The session's IdleStop over the hosts whose inventory gives a container an idle_stop; None when none does (no engine is asked)."""
    chosen = idle_stop_hosts(hosts, source)
    return IdleStop(chosen, connect, say, root, interval) if chosen else None
