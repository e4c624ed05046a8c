"""The dashboard's readers, each in a thread of its own, each through the call its CLI task makes.

- facts: gpurig.facts.gather_complete with the summary probes (as ``gpurig facts``), at start and every few minutes;
- live: one monitor session, gpurig.monitor.agent.monitor_fleet into a Run (as ``gpurig monitor``: the same agent, the
  same samples, no second collector), for as long as the dashboard runs;
- jobs: gpurig.flows.jobfind.jobs_work over the fleet (as ``gpurig jobs``) every few seconds;
- history: gpurig.dashboard.history.read_history (rollouts, builds, promotions) every few seconds;
- containers: the names of the containers the samples say hold GPUs, from each such host's Docker engine
  (gpurig.dashboard.containernames: when a new one appears, and every few minutes, never every tick).

``stop`` ends them all: the monitor's agents stop at their next sample (a local one is killed, a remote one dies with its
channel), as they do when ``gpurig monitor`` is stopped, and the connections are closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpurig.dashboard import snapshot
from gpurig.dashboard.containernames import ContainerNames, look_up
from gpurig.dashboard.history import History, read_history
from gpurig.errors import GpurigError, HostError
from gpurig.monitor.holders import MIN_GAP, HolderTracker
from gpurig.monitor.idle import IdleTracker
from gpurig.monitor.session import Run
from gpurig.results import FleetEvents, FleetReport, HostResult, Outcome

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.connector import Connector
    from gpurig.flows.fleettask import HostOptions
    from gpurig.inventory import Host
    from gpurig.jobs.views import JobView

SECTIONS = ("fleet", "jobs", "history")


def _slurm_node(host: Host) -> bool:
    from gpurig.slurm.conf import NODES_GROUP

    return NODES_GROUP in host.groups


class _LiveFailures(FleetEvents):
    """Hears the monitor session's hosts end (a sampler that died, a host that went away) while the others go on."""

    def __init__(self, feeds: Feeds) -> None:
        self.feeds = feeds

    def finished(self, result: HostResult) -> None:
        if not result.succeeded and not self.feeds.stopping.is_set():
            with self.feeds.lock:
                self.feeds.live_failed[result.host] = f"{result.status}: {result.reason}"
                self.feeds.versions["fleet"] += 1


class Feeds:
    """What the page shows, kept fresh by background readers; ``document`` and ``delta`` read it under one lock."""

    def __init__(self, opts: HostOptions, hosts: list[Host], interval: float = 1.0, *, jobs_every: float = 3.0,
                 facts_every: float = 300.0, history_every: float = 10.0, containers_every: float = 5.0, idle_after: float = snapshot.IDLE_AFTER,
                 connector: Callable[[], Connector] | None = None, check: bool = False, say: Callable[[str], None] | None = None) -> None:
        from gpurig.flows.fleettask import make_connector

        self.opts = opts
        self.hosts = hosts
        self.names = [h.name for h in hosts]
        self.interval = interval
        self.every = {"jobs": jobs_every, "fleet": facts_every, "history": history_every, "containers": containers_every}
        self._connector = connector or (lambda: make_connector(opts))
        self.idle = IdleTracker()
        self.held = HolderTracker(max(MIN_GAP, 5 * interval))
        self.containers = ContainerNames()
        self.idle_after = idle_after
        self.run = Run(listeners=(self.idle, self.held))
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._wake = {name: threading.Event() for name in (*SECTIONS, "containers")}
        self.versions = dict.fromkeys(SECTIONS, 0)
        self.live_state, self.live_why = "starting", "the monitor session is starting"
        self.live_failed: dict[str, str] = {}
        self.facts: FleetReport | None = None
        self.facts_why = "facts are being read"
        self.slurm_nodes = [h for h in hosts if _slurm_node(h)]
        self.slurm: FleetReport | None = None
        self.slurm_why = "the nodes' Slurm state is being read"
        self.slurm_at: float | None = None
        self.check = check
        self._say = say or (lambda line: None)
        self.drift: FleetReport | None = None
        self.drift_why = "provision's check is running" if check else ""
        self.drift_at: float | None = None
        self.jobs_report: FleetReport | None = None
        self.jobs: list[JobView] = []
        self.jobs_why = "the job queue is being read"
        self.jobs_at: float | None = None
        self.history: History | None = None
        self.history_why = "the records are being read"
        self._threads: list[threading.Thread] = []
        self._connectors: list[Connector] = []

    # --- the readers -------------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every reader. The monitor's agent is looked up first: a gpurig without it refuses here, before any host."""
        from gpurig.monitor.agent import agent_source

        source = agent_source()
        for name, target in (("live", lambda: self._live(source)), ("fleet", self._facts_loop), ("jobs", self._jobs_loop),
                             ("history", self._history_loop), ("containers", self._containers_loop)):
            thread = threading.Thread(target=target, name=f"gpurig-dashboard-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.check:
            thread = threading.Thread(target=self._drift_once, name="gpurig-dashboard-drift", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 15.0) -> list[str]:
        """Stop the readers and close their connections; the names of any that did not end within ``timeout``."""
        self.stopping.set()
        for wake in self._wake.values():
            wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            connectors, self._connectors = self._connectors, []
        for c in connectors:
            c.close()
        return [t.name for t in self._threads if t.is_alive()]

    def _open(self) -> Connector:
        """The monitor session's connector, kept to be closed by ``stop`` (a read's own is closed when the read ends)."""
        connector = self._connector()
        with self.lock:
            self._connectors.append(connector)
        return connector

    def _live(self, source: str) -> None:
        from gpurig.monitor.agent import monitor_fleet
        from gpurig.monitor.idlestop import enforcer

        with self.lock:
            self.live_state, self.live_why = "running", ""
        try:
            stopper = enforcer(self.hosts, self.opts.settings.inventory, self._connector, self.say, self.opts.settings.project, self.interval)
            report = monitor_fleet(self.hosts, self._open(), self.run, self.interval, 0.0, source, stop=self.stopping,
                                   events=_LiveFailures(self), idle_stop=stopper)
            ended = ", ".join(f"{n} {status}" for status, n in report.summary.items() if n)
            state, why = "ended", f"the monitor session ended ({ended or 'no host'})"
        except GpurigError as err:
            state, why = "unknown", err.problem
        except Exception as err:  # a reader's bug must show on the page, not end the dashboard
            state, why = "unknown", f"the monitor session failed: {type(err).__name__}: {err}"
        with self.lock:
            self.live_state, self.live_why = state, why

    def _loop(self, section: str, read: Callable[[], None], failed: Callable[[str], None]) -> None:
        while not self.stopping.is_set():
            try:
                read()
            except GpurigError as err:
                failed(err.problem)
            except Exception as err:  # said on the page, and read again next time
                failed(f"{type(err).__name__}: {err}")
            with self.lock:
                if section in self.versions:
                    self.versions[section] += 1
            self._wake[section].wait(self.every[section])
            self._wake[section].clear()

    def poke(self, *sections: str) -> None:
        """Read these sections again now, not at their next turn (after an action changed what they show)."""
        for name in sections:
            self._wake[name].set()

    def _facts_loop(self) -> None:
        from gpurig.connect.fleet import run_fleet
        from gpurig.facts import SUMMARY_PROBES, gather_complete

        def read() -> None:
            connector = self._connector()
            try:
                report = run_fleet(self.hosts, lambda conn: gather_complete(conn, probes=SUMMARY_PROBES), connector=connector,
                                   forks=self.opts.settings.forks, label="facts")
            finally:
                connector.close()
                self._read_slurm()
            with self.lock:
                self.facts, self.facts_why = report, ""

        self._loop("fleet", read, lambda why: self._set(facts_why=f"facts could not be read: {why}"))

    def _read_slurm(self) -> None:
        """The Slurm nodes' states, each asked on the node as ``gpurig verify`` asks (sinfo answers for its controller); with the facts,
        not every tick: a node's state moves with drains and jobs, minutes apart."""
        from gpurig.connect.fleet import run_fleet
        from gpurig.slurm.health import read_node

        if not self.slurm_nodes:
            return

        def work(conn: Connection) -> Outcome:
            found = read_node(conn)
            if isinstance(found, str):
                raise HostError(found, "check munge and slurmd on the node and slurmctld on the controller (gpurig provision)", host=conn.name)
            return Outcome(data=found)

        try:
            connector = self._connector()
            try:
                report = run_fleet(self.slurm_nodes, work, connector=connector, forks=self.opts.settings.forks, label="slurm")
            finally:
                connector.close()
        except GpurigError as err:
            self._set(slurm=None, slurm_why=f"the nodes' Slurm state could not be read: {err.problem}")
            return
        except Exception as err:  # said in the rows, read again with the next facts
            self._set(slurm=None, slurm_why=f"the nodes' Slurm state could not be read: {type(err).__name__}: {err}")
            return
        self._set(slurm=report, slurm_why="", slurm_at=time.time())

    def _jobs_loop(self) -> None:
        from gpurig.connect.fleet import run_fleet
        from gpurig.flows.jobfind import jobs_work, views_of

        work = None

        def read() -> None:
            nonlocal work
            work = work or jobs_work(self.opts)
            connector = self._connector()
            try:
                report = run_fleet(self.hosts, work, connector=connector, forks=self.opts.settings.forks, label="jobs")
            finally:
                connector.close()
            with self.lock:
                self.jobs_report, self.jobs, self.jobs_why, self.jobs_at = report, views_of(report), "", time.time()

        self._loop("jobs", read, lambda why: self._set(jobs_why=f"the job queue could not be read: {why}"))

    def _history_loop(self) -> None:
        root = self.opts.settings.root

        def read() -> None:
            if root is None:
                self._set(history_why="not in a gpurig project (no gpurig.yaml, images/ or tasks.py found upwards): no records to read")
                return
            found = read_history(root)
            with self.lock:
                self.history, self.history_why = found, ""

        self._loop("history", read, lambda why: self._set(history_why=f"the records could not be read: {why}"))

    def _containers_loop(self) -> None:
        self._loop("containers", self.read_containers, lambda why: None)  # each host's failure is kept in its book

    def read_containers(self) -> None:
        """Name the containers each host's latest sample says hold its GPUs, through that host's engine, where due."""
        from gpurig.connect.engineopen import open_engine

        for host in self.hosts:
            latest = self.run.recent(host.name, limit=1)
            if not latest:
                continue
            ids = self.containers.due(host.name, (p.container for g in latest[-1].gpus for p in g.processes if p.container))
            if not ids or self.stopping.is_set():
                continue
            try:
                connector = self._connector()
                try:
                    with open_engine(connector.open(host)) as engine:
                        found = look_up(engine, ids)
                finally:
                    connector.close()
            except GpurigError as err:
                self.containers.failed(host.name, err.problem, latest[-1].t)
            except Exception as err:  # said in the holder's title, asked again later
                self.containers.failed(host.name, f"{type(err).__name__}: {err}", latest[-1].t)
            else:
                self.containers.take(host.name, ids, found, latest[-1].t)

    def container_changed(self, host: str) -> None:
        """A container of ``host`` was stopped from the page: its engine is asked again now, and History read again."""
        self.containers.mark_changed(host)
        self.poke("containers", "history")

    def say(self, line: str) -> None:
        """An idle_stop line of the monitor session: to the task's ``say``, and History read again (a stop is kept before it is said)."""
        self._say(line)
        self.poke("history")

    def _drift_once(self) -> None:
        """``--check``: provision's check mode over the hosts, once at start (gpurig.flows.fleetprovision.check_fleet: plans only,
        never applies); each host's drift shows in its fleet row, with when it was read."""
        from gpurig.flows.fleetprovision import check_fleet

        try:
            report = check_fleet(self.opts, self.hosts, self._connector)
            values: dict[str, Any] = {"drift": report, "drift_why": "", "drift_at": time.time()}
        except GpurigError as err:
            values = {"drift_why": f"provision's check could not run: {err.problem}"}
        except Exception as err:  # said on the page, not a dead thread
            values = {"drift_why": f"provision's check failed: {type(err).__name__}: {err}"}
        with self.lock:
            for key, value in values.items():
                setattr(self, key, value)
            self.versions["fleet"] += 1

    def _set(self, **values: Any) -> None:
        with self.lock:
            for key, value in values.items():
                setattr(self, key, value)

    # --- what the page reads -----------------------------------------------------------------------------------------------------

    def _section(self, name: str) -> dict[str, Any]:
        if name == "fleet":
            verdicts = self.history.verdicts if self.history is not None else {}
            verdicts_why = "" if self.history is not None else self.history_why
            rows = snapshot.fleet_rows(self.names, self.facts, self.facts_why, verdicts, verdicts_why, self.live_failed, self._fleet_extra())
            return {"state": "known" if self.facts is not None else "unknown", "why": self.facts_why, "hosts": rows,
                    "drift": {"checked": self.check, "read_at": self.drift_at, "why": self.drift_why}}
        if name == "jobs":
            return snapshot.jobs_section(self.jobs_report, self.jobs, self.jobs_why, self.jobs_at)
        return snapshot.history_section(self.history, self.history_why)

    def _fleet_extra(self) -> dict[str, dict[str, Any]]:
        """Each host's cells beyond facts and verify: its Slurm node's state (a host of slurm_nodes only), its provision drift (--check)."""
        from gpurig.flows.fleetprovision import drift

        extra: dict[str, dict[str, Any]] = {h: {} for h in self.names}
        if self.check:
            found = self.drift.by_host() if self.drift is not None else {}
            for name in self.names:
                extra[name]["drift"] = {**drift(found.get(name), self.drift_why), "read_at": self.drift_at}
        results = self.slurm.by_host() if self.slurm is not None else {}
        for h in self.slurm_nodes:
            extra[h.name]["slurm"] = snapshot.slurm_cell(results.get(h.name), self.slurm_why, self.slurm_at)
        return extra

    def document(self) -> tuple[dict[str, Any], dict[str, float], dict[str, int]]:
        """The whole page as JSON, with the live cursor and the section versions it was made at (where the next delta starts)."""
        with self.lock:
            versions = dict(self.versions)
            sections = {name: self._section(name) for name in SECTIONS}
            live = snapshot.live_section(self.run, self.live_state, self.live_why, self.interval, dict(self.live_failed), idle=self.idle,
                                         idle_after=self.idle_after, held=self.held, names=self.containers)
        doc = snapshot.document(selection=self.names, inventory=str(self.opts.settings.inventory), live=live, **sections)
        return doc, snapshot.cursor_of(live), versions

    def delta(self, cursor: dict[str, float], versions: dict[str, int]) -> tuple[dict[str, Any], dict[str, float], dict[str, int]]:
        """What changed since ``cursor`` and ``versions``: the live samples newer than the cursor, and each section whose version moved."""
        with self.lock:
            now = dict(self.versions)
            changed = {name: self._section(name) for name in SECTIONS if now[name] != versions.get(name)}
            live = snapshot.live_section(self.run, self.live_state, self.live_why, self.interval, dict(self.live_failed), after=cursor,
                                         idle=self.idle, idle_after=self.idle_after, held=self.held, names=self.containers)
        live["hosts"] = {h: found for h, found in live["hosts"].items() if found["points"]}
        return {"now": time.time(), "live": live, **changed}, snapshot.cursor_of(live, cursor), now
