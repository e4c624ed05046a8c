"""Provisioning a Slurm cluster: the steps of gpurig.slurm.hoststeps run host by host, in the order a cluster needs, over the fleet.

The hosts come from the inventory's groups (``slurm_controller``: one host;
``slurm_nodes``: the compute nodes, whose child groups are partitions), and
the whole cluster is provisioned together whatever ``-l`` picked of it (one
slurm.conf for every host). In order, each phase over the fleet:

1. every host's Slurm facts (one probe script);
2. ``slurm-packages`` everywhere at once, then the facts again where it changed
   anything (``slurmd -C`` describes a node only once slurmd is there);
3. ``slurm-munge`` on the controller (the key is read once, into memory), then
   ``slurm-munge`` and ``slurm-config`` on every host at once;
4. ``slurm-daemons``: the controller first, then the nodes, then the
   controller's ``scontrol reconfigure`` when a change needs no restart; at the
   end every node must have registered with the controller;
5. ``slurm-node``: each node's state as the controller has it then: a node
   Slurm gives no job (drained, down, not responding) fails with Slurm's
   reason, unless its ``gpurig_slurm_expect_drained: true`` makes it a warning.

A host whose step failed does no later step; a failed controller stops the
nodes too. Check mode plans each phase from what the host has now.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpurig.connect.connection import Connection
from gpurig.connect.connector import Connector
from gpurig.connect.fleet import run_fleet
from gpurig.errors import GpurigError, InventoryError, counted
from gpurig.inventory import Host, Inventory, load_inventory
from gpurig.inventory.profile import SlurmSettings, host_profile
from gpurig.results import FleetReport, HostResult, Outcome
from gpurig.skeleton import shipped_text
from gpurig.slurm import conf, health, hoststeps
from gpurig.status import Status, worst
from gpurig.steps.commands import run_change
from gpurig.steps.docker import added_group_members
from gpurig.steps.plan import Change, Plan, StepResult, host_results, outcome

STEP_NAMES = ("slurm-packages", "slurm-rest", "slurm-munge", "slurm-config", "slurm-daemons", "slurm-node")
REGISTER_S = 90.0  # how long every node gets to register with the controller after the daemons started
UP_STATES = ("idle", "mixed", "allocated", "completing", "drained", "draining", "planned")  # registered, whether or not Slurm gives it jobs
EXPECT_DRAINED = "gpurig_slurm_expect_drained"  # a node's var (HostProfile.slurm_expect_drained): its drain is no failure of provision (a warning)


@dataclass(frozen=True)
class ClusterHosts:
    controller: Host
    nodes: tuple[Host, ...]
    partitions: dict[str, tuple[str, ...]]  # node's inventory name -> its partitions
    settings: SlurmSettings

    @property
    def hosts(self) -> tuple[Host, ...]:
        return (self.controller, *self.nodes)


def cluster_hosts(inventory: Inventory, source) -> ClusterHosts | None:
    """The cluster the inventory's groups describe, or None when it has none; one line for a group that cannot be one."""
    controllers = inventory.groups.get(conf.CONTROLLER_GROUP, ())
    members = inventory.groups.get(conf.NODES_GROUP, ())
    if not controllers and not members:
        return None
    if len(controllers) != 1:
        raise InventoryError(f"{source}: group {conf.CONTROLLER_GROUP} holds {counted(len(controllers), 'host')}, a Slurm cluster has one controller",
                             f"put exactly one host in {conf.CONTROLLER_GROUP} (and the compute nodes in {conf.NODES_GROUP})")
    if not members:
        raise InventoryError(f"{source}: group {conf.NODES_GROUP} holds no host", f"put the cluster's compute nodes in {conf.NODES_GROUP}")
    if controllers[0] in members:
        raise InventoryError(f"{source}: {controllers[0]} is both the controller and a node",
                             f"keep the controller out of {conf.NODES_GROUP} (a node runs the jobs, the controller schedules them)")
    parts: dict[str, list[str]] = {}
    group = inventory.tree.get(conf.NODES_GROUP)
    for child in group.children if group else ():
        problem = conf.name_problem(child)
        if problem:
            raise InventoryError(f"{source}: group {child} under {conf.NODES_GROUP} cannot name a partition: {problem}", "rename the group")
        for name in inventory.groups.get(child, ()):
            parts.setdefault(name, []).append(child)
    controller = inventory.hosts[controllers[0]]
    settings = host_profile(controller, source).slurm
    return ClusterHosts(controller, tuple(inventory.hosts[n] for n in members),
                        {n: tuple(parts.get(n, ())) or (conf.DEFAULT_PARTITION,) for n in members}, settings)


@dataclass
class _Host:
    """One host's run through the phases: its facts, its results so far, whether it may go on."""

    host: Host
    controller: bool
    facts: hoststeps.SlurmFacts | None = None
    results: list[StepResult] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        return any(r.status == Status.FAILED for r in self.results)


class ClusterRun:
    """The phases over the cluster's hosts; ``results`` at the end: host -> its slurm StepResults."""

    def __init__(self, cluster: ClusterHosts, connector: Connector, *, check: bool, diff: bool, forks: int = 64,
                 regrouped: frozenset[str] = frozenset()) -> None:
        self.cluster, self.connector, self.check, self.diff, self.forks = cluster, connector, check, diff, forks
        self.regrouped = regrouped  # the hosts where a user joined the docker group in this run: Slurm still has the old groups
        self.state = {h.name: _Host(h, h.name == cluster.controller.name) for h in cluster.hosts}
        self.key: str | None = None  # the cluster's munge key, in memory only, once read from the controller
        self.restart = False
        self.changed = False
        self.rest_changed = False  # slurmrestd's drop-in changed: its unit is reloaded and restarted

    def run(self) -> dict[str, list[StepResult]]:
        self._phase([h.name for h in self.cluster.hosts], self._gather)
        self._phase(self._going(), self._packages)
        self._phase(self._going(), self._gather, only_changed=True)
        self._phase([self.cluster.controller.name], self._controller_key)
        model = self._model()
        if model is not None:
            self._phase(self._going(), lambda conn, h: self._key_and_files(conn, h, model))
            self._phase([self.cluster.controller.name], lambda conn, h: self._daemons(conn, h, model))
            self._phase([n.name for n in self.cluster.nodes if n.name in self._going()], lambda conn, h: self._daemons(conn, h, model))
            if not self.check and self.cluster.controller.name in self._going():
                self._phase([self.cluster.controller.name], lambda conn, h: self._settle(conn, h, model))
        return {name: h.results for name, h in self.state.items()}

    # --- the phases ------------------------------------------------------------------------------------------------

    def _going(self) -> list[str]:
        controller_failed = self.state[self.cluster.controller.name].stopped
        return [name for name, h in self.state.items() if not h.stopped and not (controller_failed and not h.controller)]

    def _phase(self, names: Sequence[str], work: Callable[[Connection, _Host], None], only_changed: bool = False) -> None:
        chosen = [self.state[n].host for n in names if not only_changed or self._changed_packages(n)]
        if not chosen:
            return

        def each(conn: Connection) -> Outcome:
            work(conn, self.state[conn.name])
            return Outcome()

        report = run_fleet(chosen, each, connector=self.connector, forks=self.forks, label="slurm")
        for r in report.results:  # a host that could not be reached (or whose work raised) fails where it stands
            if r.status in (Status.FAILED, Status.UNREACHABLE):
                self.state[r.host].results.append(StepResult("slurm", Status.FAILED, r.reason, fix=r.fix))

    def _changed_packages(self, name: str) -> bool:
        return any(r.step == "slurm-packages" and r.status == Status.CHANGED for r in self.state[name].results)

    def _gather(self, conn: Connection, h: _Host) -> None:
        h.facts = hoststeps.gather(conn)

    def _record(self, conn: Connection, h: _Host, step: str, plan: Plan) -> bool:
        """Apply ``plan`` (not in check mode) and keep its result; whether the host may go on."""
        started = time.monotonic()
        if plan.status == Status.CHANGED and not self.check:
            try:
                for change in plan.changes:
                    run_change(conn, change.summary, change.commands, fix=change.fix, timeout=1800)
            except GpurigError as err:
                h.results.append(StepResult(step, Status.FAILED, err.problem, plan.changes, time.monotonic() - started, fix=err.fix))
                return False
        changes = tuple(c.for_report(self.diff) for c in plan.changes)
        h.results.append(StepResult(step, plan.status, plan.reason, changes, time.monotonic() - started, fix=plan.fix))
        return plan.status != Status.FAILED

    def _packages(self, conn: Connection, h: _Host) -> None:
        assert h.facts is not None
        self._record(conn, h, "slurm-packages", hoststeps.plan_packages(h.facts, h.controller, self.cluster.settings.rest))

    def _controller_key(self, conn: Connection, h: _Host) -> None:
        assert h.facts is not None
        if self.cluster.settings.rest and not self._record(conn, h, "slurm-rest", hoststeps.plan_rest(h.facts)):
            return
        plan = hoststeps.plan_controller_key(h.facts)
        if not self._record(conn, h, "slurm-munge", plan):
            return
        if self.check and plan.status == Status.CHANGED:
            return  # no key made: the nodes' plans say they would get it
        # read once, into memory: never a command line, a file on this machine, a log or a report
        self.key = conn.admin(["cat", hoststeps.MUNGE_KEY], timeout=60).stdout

    def _model(self) -> conf.SlurmCluster | None:
        """The cluster from every host's facts; None (each node without hardware says why) until slurmd can describe them."""
        ctl = self.state[self.cluster.controller.name]
        if ctl.stopped or ctl.facts is None:
            return None
        nodes = []
        for host in self.cluster.nodes:
            h = self.state[host.name]
            if h.stopped or h.facts is None:
                continue
            f = h.facts
            if f.hardware is None:
                if self.check:
                    h.results.append(StepResult("slurm-config", Status.CHANGED, "slurmd is not installed yet: the node's line is written once it is",
                                                (Change(f"write {conf.SLURM_CONF}, {conf.GRES_CONF} and {conf.CGROUP_CONF}"),)))
                else:
                    h.results.append(StepResult("slurm-config", Status.FAILED, "slurmd -C does not describe this node",
                                                fix="run `slurmd -C` on the host and see why it fails"))
                continue
            problem = conf.name_problem(f.hostname)
            if problem:
                h.results.append(StepResult("slurm-config", Status.FAILED, problem, fix="give the host a plain hostname (hostnamectl)"))
                continue
            model = next(iter(f.models), None)
            nodes.append(conf.SlurmNode(host.name, f.hostname, f.hardware, f.devices, conf.gpu_type(model), self.cluster.partitions[host.name]))
        if not nodes:
            return None
        return conf.SlurmCluster(self.cluster.settings.cluster, ctl.facts.hostname or ctl.host.name, ctl.host.name, tuple(nodes), self.cluster.settings,
                                 ctl.facts.version)

    def _key_and_files(self, conn: Connection, h: _Host, model: conf.SlurmCluster) -> None:
        assert h.facts is not None
        if not h.controller and model.node(h.host.name) is None:
            return
        if not h.controller:
            sha = hoststeps.key_sha(self.key) if self.key is not None else None
            if not self._record(conn, h, "slurm-munge", hoststeps.plan_node_key(h.facts, sha, self.key)):
                return
        wanted = conf.files_for(model, h.host.name)
        if not h.controller:
            wanted.update({path: (shipped_text(src), 0o755) for path, src in hoststeps.SHIPPED.items()})
        restart = hoststeps.needs_restart(h.facts, wanted)
        plan = hoststeps.plan_files(h.facts, wanted)
        if self._record(conn, h, "slurm-config", plan) and plan.status == Status.CHANGED:
            self.changed = True
            self.restart = self.restart or restart
            self.rest_changed = self.rest_changed or hoststeps.differs(h.facts, wanted, (conf.REST_DROPIN,))

    def _daemons(self, conn: Connection, h: _Host, model: conf.SlurmCluster) -> None:
        assert h.facts is not None
        if not h.controller and model.node(h.host.name) is None:
            return
        regroup = h.host.name in self.regrouped
        self._record(conn, h, "slurm-daemons", hoststeps.plan_daemons(h.facts, h.controller, self.restart, self.changed, self.cluster.settings.rest,
                                                                  self.rest_changed and h.controller, regroup))

    def _settle(self, conn: Connection, h: _Host, model: conf.SlurmCluster) -> None:
        """Every node registered with the controller (bounded), then each node's state as Slurm has it: a node Slurm gives
        no job (drained, down, not responding) fails with Slurm's reason, unless the inventory expects it drained."""
        deadline = time.monotonic() + REGISTER_S
        going = self._going()
        names = {n.name: n.host for n in model.nodes if n.host in going}
        while True:
            said = conn.admin(health.SINFO_CLUSTER, warn=True, timeout=60)
            seen = health.cluster_nodes(said.stdout if said.ok else "")
            down = {name: seen[name].state if name in seen else None for name in names
                    if name not in seen or seen[name].state.state not in UP_STATES}
            if not down or time.monotonic() > deadline:
                break
            time.sleep(1.0)  # polling slurmctld's view of the nodes with a deadline, not a synchronisation sleep
        for name, host in names.items():
            state = down.get(name, seen[name].state if name in seen else None)
            if name in down:
                why = said.stderr.strip()[-200:]
                text = (f"{name} is {state.text} to the controller" if state else
                        f"{name} is unknown to the controller: its sinfo did not list it" + (f" ({why})" if why else ""))
                self.state[host].results.append(StepResult("slurm-daemons", Status.FAILED, text, fix="see /var/log/slurm/slurmd.log on the node"))
            elif state is not None:
                self.state[host].results.append(node_result(name, state, host_profile(self.state[host].host).slurm_expect_drained))


def node_result(name: str, state: health.NodeState, expect_drained: bool) -> StepResult:
    """``slurm-node``: whether Slurm gives the node jobs once provision is done; a drained node fails unless it is expected so."""
    details = {"state": state.state, "reason": state.reason, "responding": state.responding}
    if state.healthy:
        return StepResult("slurm-node", Status.OK, f"Slurm gives it jobs ({state.text})", details=details)
    if expect_drained and state.drained:
        return StepResult("slurm-node", Status.OK, f"{name} is {state.text}, as {EXPECT_DRAINED}: true expects",
                          details={**details, "warning": f"{name} is {state.text}: Slurm gives it no job ({EXPECT_DRAINED}: true)"})
    fix = (f"gpurig's health program drained it: see `gpurig verify -l HOST`, fix the failing record (it resumes the node once it "
           f"passes), or set {EXPECT_DRAINED}: true on a node meant to stay out"
           if state.reason.startswith("gpurig:") else "see `sinfo -R` on the controller; resume it with `scontrol update nodename=NODE state=resume`")
    return StepResult("slurm-node", Status.FAILED, f"Slurm gives {name} no job: {state.text}", fix=fix, details=details)


def touched_cluster(chosen: Sequence[Host], source: str | Path) -> tuple[ClusterHosts | None, list[str]]:
    """The inventory's Slurm cluster when the selection touches it (the whole cluster is provisioned together), else None.

    Also the cluster's hosts the selection left out, which are provisioned
    with it. Every cluster host's profile is read here: every error before
    any host is touched.
    """
    found = cluster_hosts(load_inventory(source), source)
    if found is None or not {h.name for h in found.hosts} & {h.name for h in chosen}:
        return None, []
    left = [h.name for h in found.hosts if h.name not in {c.name for c in chosen}]
    for h in found.hosts:
        host_profile(h, source)
    return found, left


def with_cluster(report: FleetReport, cluster: ClusterHosts, *, connect: Callable[[], Connector], check: bool, diff: bool,
                 forks: int) -> FleetReport:
    """The report with each cluster host's slurm steps after its own (a host whose own steps failed does none of them).

    Its duration is the whole run's, the cluster's phases included; a host's, its own steps' and its slurm steps'.
    """
    started = time.monotonic()
    by_host = report.by_host()
    failed = {h for h, r in by_host.items() if r.status in (Status.FAILED, Status.UNREACHABLE)}
    if any(h.name in failed for h in cluster.hosts):
        extra = {h.name: [StepResult("slurm", Status.SKIPPED, "not run: a host of the cluster failed its own steps")] for h in cluster.hosts}
    else:
        regrouped = frozenset(name for name, r in by_host.items() if any(added_group_members(s) for s in host_results(r)))
        connector = connect()
        try:
            extra = ClusterRun(cluster, connector, check=check, diff=diff, forks=forks, regrouped=regrouped).run()
        finally:
            connector.close()
    results = list(report.results)
    for name, steps in extra.items():
        old = by_host.get(name)
        mine = tuple(host_results(old)) if old else ()
        merged = (*mine, *steps)
        done = outcome(merged, lambda r: f"step {r.step} failed: {r.reason}")
        status = worst([old.status] if old and old.status == Status.UNREACHABLE else [done.resolved])
        took = (old.duration_s if old else 0.0) + sum(s.duration_s for s in steps)
        made = HostResult(name, status, done.detail or (old.reason if old else ""), tuple(merged), took, done.fix)
        if old:
            results[results.index(old)] = made
        else:
            results.append(made)
    counts = {k: sum(1 for r in results if r.status == k) for k in report.summary}
    return dataclasses.replace(report, results=tuple(results), summary=counts, duration_s=report.duration_s + time.monotonic() - started)
